"""Bad model folders are exit 2 with one message naming the path, before Ray or any actor starts
(launch.plan_run, grpo_dist/common/model_files.py): made from the real model's own files, each with one
thing wrong. The weights are left out: nothing here may load them."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_dist.config.schema import ConfigError
from grpo_dist.eval import resolve_checkpoint
from grpo_dist.launch import parse_args, plan_run

ROOT = Path(__file__).resolve().parent.parent
SMALL_FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]


@pytest.fixture
def folder(real_model, tmp_path):
    """The real model's folder without its weights."""
    made = tmp_path / "model"
    made.mkdir()
    for name in SMALL_FILES:
        shutil.copyfile(real_model / name, made / name)
    return made


def plan(*overrides: str):
    return plan_run(parse_args(["trainer.output_dir=/nonexistent/out", *overrides]))


def test_the_real_model_folder_passes(real_model):
    assert plan(f"model.path={real_model}", "data.chat_template=true").config.model.path == str(real_model)


def test_a_folder_without_a_tokenizer(folder):
    for name in ["tokenizer.json", "tokenizer_config.json"]:
        (folder / name).unlink()
    with pytest.raises(ConfigError, match=f"model.path {folder}: no tokenizer"):
        plan(f"model.path={folder}")
    with pytest.raises(ConfigError, match=f"model.path {folder}: no tokenizer"):  # grpo_dist.eval's door
        resolve_checkpoint(str(folder), [], [])


def test_a_tokenizer_longer_than_the_models_embedding(folder):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 1000}))
    with pytest.raises(ConfigError, match=f"model.path {folder}: tokenizer.json has 49152 tokens, but the model's "
                                          "embedding has 1000 rows"):
        plan(f"model.path={folder}")


def test_a_gguf_file_is_not_a_model_folder(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00 not a model")
    with pytest.raises(ConfigError, match=f"a file, not a model folder: '{gguf}' \\(a GGUF file"):
        plan(f"model.path={gguf}")


def launch_exits_2_in_one_line(out, *args: str) -> subprocess.CompletedProcess:
    """`python -m grpo_dist.launch args` into `out`: exit 2 with one line on stderr (no Ray, no actor)."""
    result = subprocess.run([sys.executable, "-m", "grpo_dist.launch", *args, f"trainer.output_dir={out}"],
                            capture_output=True, text=True, timeout=120, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (result.returncode, result.stderr.count("\n")) == (2, 1), result.stderr
    return result

def test_chat_template_true_without_a_template_is_exit_2_before_ray_starts(folder, tmp_path):
    (folder / "chat_template.jinja").unlink()
    assert "chat_template" not in json.loads((folder / "tokenizer_config.json").read_text())
    assert plan(f"model.path={folder}", "data.chat_template=auto").config.model.path == str(folder)
    out = tmp_path / "out"
    result = launch_exits_2_in_one_line(out, f"model.path={folder}", "data.chat_template=true")
    assert result.stderr == f"error: data.chat_template=true, but the tokenizer in {folder} has no chat template " \
                            "(chat_template.jinja or chat_template.json, or tokenizer_config.json's chat_template)\n"
    assert not out.exists()


@pytest.fixture
def tiny(tmp_path):
    """A tiny model folder with its weights (model.safetensors), as save_pretrained writes it."""
    from grpo_dist.tasks.tiny import save_tiny_model

    save_tiny_model(tmp_path / "tiny")
    return tmp_path / "tiny"


def test_a_truncated_or_damaged_weight_file_is_exit_2_naming_it_before_ray_starts(tiny, tmp_path):
    weights = tiny / "model.safetensors"
    size = weights.stat().st_size
    assert plan(f"model.path={tiny}").config.model.path == str(tiny)  # whole: taken
    out = tmp_path / "out"
    os.truncate(weights, size - 1000)
    result = launch_exits_2_in_one_line(out, f"model.path={tiny}")
    assert result.stderr == f"error: model.path {weights}: {size - 1000} bytes, but its header says {size}: " \
                            "truncated or damaged (copy or download it again)\n"
    assert not out.exists()
    os.truncate(weights, 5)
    with pytest.raises(ConfigError, match=f"model.path {weights}: truncated: 5 bytes, shorter than its header"):
        plan(f"model.path={tiny}")
    weights.write_bytes((12).to_bytes(8, "little") + b"not json at all")
    with pytest.raises(ConfigError, match=f"model.path {weights}: not a safetensors file: unreadable header"):
        plan(f"model.path={tiny}")


def test_a_shard_the_index_names_is_missing(tiny):
    (tiny / "model.safetensors").rename(tiny / "model-00001-of-00002.safetensors")
    weight_map = {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                  "lm_head.weight": "model-00002-of-00002.safetensors"}
    (tiny / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    with pytest.raises(ConfigError, match=f"model.path {tiny}: model-00002-of-00002.safetensors is missing "
                                          r"\(model.safetensors.index.json names it\)"):
        plan(f"model.path={tiny}")
