"""A local model folder checked from its files before anything starts: a config, a tokenizer that
fits the embedding, a chat template when one is required, safetensors files as long as their
headers say. No torch or transformers import: JSON and the `tokenizers` library, milliseconds
for a small model, a fraction of a second for a real one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpo_dist.config.schema import ConfigError, resolve_path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
SAFETENSORS_INDEX = "model.safetensors.index.json"


def check_model_folder(path: str, chat_template: str) -> None:
    """Raise ConfigError naming the folder (or file) when model.path cannot serve this run.

    Hub ids are left to the loaders. A tokenizer may be shorter than the embedding (padded
    vocabularies are common) but not longer: its last ids would have no row to embed them.
    """
    folder = Path(resolve_path(path))
    if not folder.is_dir():
        return
    config = _read_json(folder / "config.json", "not a Hugging Face model folder")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(f"model.path {folder}: no tokenizer ({', '.join(TOKENIZER_FILES)})")
    rows = (config.get("text_config") or config).get("vocab_size")
    tokens = _tokenizer_length(folder / "tokenizer.json")
    if rows is not None and tokens is not None and tokens > rows:
        raise ConfigError(f"model.path {folder}: tokenizer.json has {tokens} tokens, but the model's embedding has "
                          f"{rows} rows (config.json vocab_size): a tokenizer of another model?")
    _check_weight_files(folder)
    if chat_template == "true" and not _has_chat_template(folder):
        raise ConfigError(f"data.chat_template=true, but the tokenizer in {folder} has no chat template "
                          f"({' or '.join(CHAT_TEMPLATE_FILES)}, or tokenizer_config.json's chat_template)")


def _check_weight_files(folder: Path) -> None:
    """Every safetensors file the folder has, or its index names, is there and as long as its
    header says (a truncated download or copy). Reads the headers only: milliseconds."""
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = _read_json(index, "").get("weight_map")
        if not isinstance(weight_map, dict):
            raise ConfigError(f"model.path {index}: no weight_map")
        for name in sorted(set(weight_map.values())):
            if not (folder / name).is_file():
                raise ConfigError(f"model.path {folder}: {name} is missing ({SAFETENSORS_INDEX} names it)")
    for path in sorted(folder.glob("*.safetensors")):
        _check_safetensors(path)


def _check_safetensors(path: Path) -> None:
    """A safetensors file is an 8-byte header length, a JSON header, then the tensors' bytes up
    to the largest end offset the header gives."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        length = int.from_bytes(handle.read(8), "little") if size >= 8 else size
        if size < 8 or 8 + length > size:
            raise ConfigError(f"model.path {path}: truncated: {size} bytes, shorter than its header")
        try:
            header = json.loads(handle.read(length))
            end = max((entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"),
                      default=0)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise ConfigError(f"model.path {path}: not a safetensors file: unreadable header ({exc!r})") from None
    if 8 + length + end != size:
        raise ConfigError(f"model.path {path}: {size} bytes, but its header says {8 + length + end}: truncated "
                          "or damaged (copy or download it again)")


def _read_json(path: Path, missing: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"model.path {path.parent}: no {path.name}, {missing}") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model.path {path}: cannot read: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"model.path {path}: not a JSON object")
    return data


def _tokenizer_length(path: Path) -> int | None:
    """Ids of a tokenizer.json, added tokens included (None without the file)."""
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=True)
    except Exception as exc:  # the Rust library raises its own Exception types
        raise ConfigError(f"model.path {path}: not a tokenizer: {exc}") from None


def _has_chat_template(folder: Path) -> bool:
    if any((folder / name).is_file() for name in CHAT_TEMPLATE_FILES):
        return True
    settings = folder / "tokenizer_config.json"
    return settings.is_file() and bool(_read_json(settings, "").get("chat_template"))
