"""Datasets: rows from JSONL, JSON, Parquet or Hugging Face `datasets`; prompts rendered and
tokenized once, in the driver; a deterministic cursor over them.

`prepare_data(config)` runs in launch before Ray starts: every problem with the data is a
`DataError` that names the source, the row (a JSONL file: its line) and the field, and
launch exits 2. docs/data.md describes the formats.
"""

from __future__ import annotations

import json
import random
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from grpo_dist.config.schema import Config, DataConfig, RewardConfig, resolve_path
from grpo_dist.common.types import Prompt

T = TypeVar("T")
TOKENIZE_BATCH = 8192  # prompts per tokenizer call


class DataError(ValueError):
    """Data that cannot be trained on; the message names the source, the row and the field."""


@dataclass
class Table:
    """The rows of one split, with what an error message calls each of them."""

    source: str
    rows: list[dict[str, Any]]
    lines: list[int] | None = None  # a JSONL file's line numbers; else rows count from 1

    def where(self, index: int) -> str:
        if self.lines is not None:
            return f"{self.source}:{self.lines[index]}"
        return f"{self.source} row {index + 1}"


@dataclass
class PreparedData:
    """Every prompt of both splits, rendered and tokenized (the trainer's input)."""

    train: list[Prompt]
    eval: list[Prompt]


# ---------------------------------------------------------------- reading rows


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """Rows of a JSONL file (`builtin:` paths allowed); blank lines are skipped."""
    return _read_jsonl(path).rows


def load_table(source: str, split: str = "train", subset: str | None = None) -> Table:
    """The rows of `source`: a .jsonl, .json or .parquet file, a dataset folder, or a hub id.

    JSONL and JSON are read here (JSONL errors name the line); Parquet files, folders and
    hub ids go through `datasets.load_dataset` (`split` and `subset` apply to the last two).
    """
    path = Path(resolve_path(source))
    if path.suffix == ".jsonl":
        table = _read_jsonl(source)
    elif path.suffix == ".json":
        table = _read_json(source)
    elif path.suffix == ".parquet":
        _check_parquet(source)
        table = _load_dataset(source, "parquet", data_files=str(path), split="train")
    else:
        name = f"{source}[{split}]" if subset is None else f"{source}[{subset}/{split}]"
        table = _load_dataset(name, str(path) if path.is_dir() else source, subset, split=split)
    if not table.rows:
        raise DataError(f"{source}: no rows")
    for index, row in enumerate(table.rows):
        if not isinstance(row, dict):
            raise DataError(f"{table.where(index)}: a row must be an object of fields, got {type(row).__name__}")
    return table


def _read_jsonl(source: str) -> Table:
    """A JSONL file's rows, read line by line; an error names the line."""
    rows, lines = [], []
    try:
        with Path(resolve_path(source)).open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise DataError(f"{source}:{number}: not UTF-8: byte {raw[exc.start]:#04x} at column "
                                    f"{exc.start + 1}") from None
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise DataError(f"{source}:{number}: not valid JSON: {exc}") from None
                    lines.append(number)
    except OSError as exc:
        raise DataError(f"{source}: cannot read: {exc}") from None
    if not rows:
        raise DataError(f"{source}: no rows")
    return Table(source, rows, lines)


def _read_json(source: str) -> Table:
    """A JSON file holding one list of row objects, read whole: its text costs about an eighth of
    what its rows do (docs/faults.md), so it is not streamed. An error names the line."""
    try:
        raw = Path(resolve_path(source)).read_bytes()
    except OSError as exc:
        raise DataError(f"{source}: cannot read: {exc}") from None
    try:
        rows = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        line, line_start = raw.count(b"\n", 0, exc.start) + 1, raw.rfind(b"\n", 0, exc.start) + 1
        raise DataError(f"{source}:{line}: not UTF-8: byte {raw[exc.start]:#04x} at column {exc.start - line_start + 1}"
                        ) from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{source}:{exc.lineno}: not valid JSON: {exc}") from None
    if not isinstance(rows, list):
        raise DataError(f"{source}: a JSON dataset is a list of rows, got {type(rows).__name__} (JSON Lines: .jsonl)")
    return Table(source, rows)


def _check_parquet(source: str) -> None:
    """A clear error for a file that is not Parquet or holds no rows (datasets fails obscurely on both)."""
    import pyarrow
    import pyarrow.parquet

    try:
        rows = pyarrow.parquet.ParquetFile(resolve_path(source)).metadata.num_rows
    except (OSError, pyarrow.ArrowException) as exc:
        raise DataError(f"{source}: cannot read: {exc}") from None
    if rows == 0:
        raise DataError(f"{source}: no rows")


def _load_dataset(name: str, *args: Any, **kwargs: Any) -> Table:
    """`datasets.load_dataset(*args, **kwargs)` as a Table; any failure becomes a DataError."""
    import datasets

    datasets.disable_progress_bars()
    try:
        dataset = datasets.load_dataset(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the library's many error types all mean "cannot load"
        raise DataError(f"{name}: cannot load the dataset: {type(exc).__name__}: {exc}") from None
    return Table(name, dataset.to_list())


# ---------------------------------------------------------------- rows -> prompts


class PromptFormat:
    """How a row becomes prompt text and token ids: data.* plus the tokenizer's chat template.

    The prompt is the row's `data.prompt_field` (or its `messages` when it lacks that field):
    a string, filled into `data.prompt_template`, or a list of {role, content} messages.
    With a chat template it is rendered with the generation prompt, after `system_prompt`.
    """

    def __init__(self, data: DataConfig, tokenizer: Any, needs: Mapping[str, str] | None = None) -> None:
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if data.chat_template == "true" and not has_template:
            raise DataError("data.chat_template=true, but the model's tokenizer has no chat template")
        self.chat = has_template if data.chat_template == "auto" else data.chat_template == "true"
        if data.system_prompt is not None and not self.chat:
            raise DataError("data.system_prompt is set, but no chat template is applied (data.chat_template)")
        self.data = data
        self.tokenizer = tokenizer
        self.needs = dict(needs or {})  # row field -> the reward that needs it
        specials = sorted(getattr(tokenizer, "all_special_tokens", []), key=len, reverse=True)
        self.specials = re.compile("|".join(map(re.escape, specials)) if specials else r"(?!)")

    def prompts(self, table: Table) -> list[Prompt]:
        """Every row of `table` as a Prompt. The texts are tokenized in calls of TOKENIZE_BATCH,
        not one per row (it is the driver's start: benchmarks/eval_exit.py times prepare_data), nor
        all at once (the tokenizer's own records of a million rows took gigabytes)."""
        rendered = [self._render(row, table.where(i)) for i, row in enumerate(table.rows)]
        texts = [text for _, text in rendered]
        # a chat template writes the special tokens (BOS and the like) itself
        ids = [list(tokens) for start in range(0, len(texts), TOKENIZE_BATCH) for tokens in self.tokenizer(
            texts[start : start + TOKENIZE_BATCH], add_special_tokens=not self.chat)["input_ids"]]
        return [Prompt(index=i, row=row, text=text, ids=tokens)
                for i, ((row, text), tokens) in enumerate(zip(rendered, ids, strict=True))]

    def _render(self, row: dict[str, Any], where: str) -> tuple[dict[str, Any], str]:
        """A row's fields for the rewards and its prompt text; `where` names it in errors."""
        field = self.data.prompt_field
        if field not in row and "messages" in row:
            field = "messages"
        if field not in row:
            raise DataError(f"{where}: no field {field!r} (data.prompt_field) and no 'messages'; "
                            f"the row has {sorted(row)}")
        value = row[field]
        self._check_not_blank(value, field, where)
        if isinstance(value, str):
            messages = [{"role": "user", "content": self._filled_template(row, value, where)}]
        elif isinstance(value, list) and self.chat:
            messages = _checked_messages(value, field, where)
        elif isinstance(value, list):
            raise DataError(f"{where}: field {field!r} holds messages, but no chat template is applied "
                            "(data.chat_template, or a tokenizer without one)")
        else:
            raise DataError(f"{where}: field {field!r} must be a string or a list of messages, "
                            f"got {type(value).__name__}")
        row = self._reward_row(row, where)
        if not self.chat:
            return row, messages[0]["content"]
        if self.data.system_prompt is not None and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": self.data.system_prompt}, *messages]
        return row, self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _check_not_blank(self, value: Any, field: str, where: str) -> None:
        """A prompt (or every message of one) that is empty, whitespace or only the tokenizer's
        special tokens is a DataError: nothing to answer, or markup the model reads as structure."""
        if isinstance(value, str):
            contents = [value]
        elif isinstance(value, list) and value and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                      for m in value):
            contents = [m["content"] for m in value]
        else:
            return  # (wrong types are told by _render)
        if all(not content.strip() for content in contents):
            raise DataError(f"{where}: field {field!r} is {'empty' if not ''.join(contents) else 'only whitespace'}")
        if all(not self.specials.sub("", content).strip() for content in contents):
            raise DataError(f"{where}: field {field!r} holds only special tokens of the tokenizer: "
                            f"{''.join(contents)[:80]!r}")

    def _filled_template(self, row: dict[str, Any], prompt: str, where: str) -> str:
        try:
            return self.data.prompt_template.format(**{**row, "prompt": prompt})
        except KeyError as exc:
            raise DataError(f"{where}: data.prompt_template names field {exc} that the row lacks: {sorted(row)}") from None
        except (IndexError, ValueError) as exc:
            raise DataError(f"data.prompt_template {self.data.prompt_template!r} is not a str.format template: "
                            f"{exc}") from None

    def _reward_row(self, row: dict[str, Any], where: str) -> dict[str, Any]:
        """The fields rewards receive: the row's, with the answer field also under `answer`."""
        answer_field = self.data.answer_field
        if answer_field in row and answer_field != "answer":  # (a copy only when it is needed)
            row = {**row, "answer": row[answer_field]}
        for field, reward in self.needs.items():
            if field not in row:
                hint = f" (data.answer_field={answer_field!r})" if field == "answer" else ""
                raise DataError(f"{where}: no field {(answer_field if field == 'answer' else field)!r}{hint}, "
                                f"which reward {reward!r} needs; the row has {sorted(row)}")
        return row


def _checked_messages(messages: list[Any], field: str, where: str) -> list[dict[str, str]]:
    if not messages:
        raise DataError(f"{where}: field {field!r} is an empty list of messages")
    for position, message in enumerate(messages):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise DataError(f"{where}: {field}[{position}] must have string 'role' and 'content', "
                            f"got {str(message)[:80]}")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def build_prompts(rows: list[dict[str, Any]], data: DataConfig, tokenizer: Any, source: str = "rows") -> list[Prompt]:
    """Render and tokenize every row (no reward checks, no length limit): for scripts and tests."""
    return PromptFormat(data, tokenizer).prompts(Table(source, rows))


# ---------------------------------------------------------------- the run's data


def fields_needed(reward: RewardConfig) -> dict[str, str]:
    """Row field -> the name of a configured reward that cannot score without it."""
    from grpo_dist.reward.registry import load_reward, row_fields_needed

    return {
        field: function.name
        for function in reward.functions
        for field in row_fields_needed(load_reward(function.name), function.kwargs)
    }


def prompt_token_limit(config: Config) -> int | None:
    """rollout.max_prompt_tokens, or what the context leaves after max_new_tokens.

    The context is rollout.vllm.max_model_len, else the model's max_position_embeddings.
    """
    from transformers import AutoConfig

    rollout = config.rollout
    context = rollout.vllm.max_model_len
    if context is None:
        model_config = AutoConfig.from_pretrained(resolve_path(config.model.path))
        context = getattr(model_config, "max_position_embeddings", None)
    if context is None:
        return rollout.max_prompt_tokens
    room = context - rollout.max_new_tokens
    episodes, section = config.episodes, "env" if config.env is not None else "agent"
    if episodes is not None and episodes.max_episode_tokens > room:
        raise DataError(f"{section}.max_episode_tokens={episodes.max_episode_tokens} + rollout.max_new_tokens="
                        f"{rollout.max_new_tokens} exceed the context of {context} tokens")
    if room < 1:
        raise DataError(f"rollout.max_new_tokens={rollout.max_new_tokens} leaves no room for a prompt "
                        f"in the context of {context} tokens")
    if rollout.max_prompt_tokens is not None and rollout.max_prompt_tokens > room:
        raise DataError(f"rollout.max_prompt_tokens={rollout.max_prompt_tokens} + rollout.max_new_tokens="
                        f"{rollout.max_new_tokens} exceed the context of {context} tokens")
    return rollout.max_prompt_tokens or room


def prepare_split(table: Table, prompt_format: PromptFormat, limit: int | None) -> list[Prompt]:
    """Every row of `table` as a Prompt, less those over `limit` tokens (counted on stderr).

    A Prompt's index is its row's position in the split, counting dropped rows too.
    """
    prompts = prompt_format.prompts(table)
    kept = [p for p in prompts if limit is None or len(p.ids) <= limit]
    if len(kept) < len(prompts):
        print(f"data: dropped {len(prompts) - len(kept)} of {len(prompts)} rows of {table.source}: "
              f"prompts over {limit} tokens (rollout.max_prompt_tokens)", file=sys.stderr)
    if not kept:
        raise DataError(f"{table.source}: every prompt is longer than {limit} tokens (rollout.max_prompt_tokens)")
    return kept


def prepare_data(config: Config, tokenizer: Any = None) -> PreparedData:
    """Load, render, tokenize and filter both splits, before anything starts; raises DataError."""
    tokenizer = tokenizer if tokenizer is not None else _tokenizer(config)
    data = config.data
    prompt_format = PromptFormat(data, tokenizer, fields_needed(config.reward))
    if config.episodes is not None and config.episodes.history == "per_turn" and not prompt_format.chat:
        section = "env" if config.env is not None else "agent"
        raise DataError(f"{section}.history=per_turn renders each turn with the chat template, and none is applied "
                        f"(data.chat_template, or a tokenizer without one): use {section}.history=append")
    train = prepare_split(load_table(data.train, data.split, data.subset), prompt_format, prompt_token_limit(config))
    return PreparedData(train=train, eval=held_out_prompts(config, tokenizer))


def held_out_prompts(config: Config, tokenizer: Any = None) -> list[Prompt]:
    """The first `data.eval_rows` prompts of `data.eval` (all when null; none without a split)."""
    data = config.data
    if data.eval is None:
        return []
    tokenizer = tokenizer if tokenizer is not None else _tokenizer(config)
    prompt_format = PromptFormat(data, tokenizer, fields_needed(config.reward))
    table = load_table(data.eval, data.eval_split, data.subset)
    return prepare_split(table, prompt_format, prompt_token_limit(config))[: data.eval_rows]


def _tokenizer(config: Config) -> Any:
    from grpo_dist.common.models import load_tokenizer

    return load_tokenizer(config.model.path)


class PromptCursor(Generic[T]):
    """Walks the rows in a seeded random order, reshuffling at every epoch."""

    def __init__(self, rows: list[T], seed: int) -> None:
        self.rows = rows
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._shuffled(0)

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def state(self) -> dict[str, int]:
        """Where the cursor stands, for a checkpoint; `restore` continues from here."""
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position, "rows": len(self.rows)}

    def restore(self, state: dict[str, int]) -> None:
        """Continue from `state()` of a cursor over the same rows with the same seed."""
        if (state["seed"], state["rows"]) != (self.seed, len(self.rows)):
            raise ValueError(
                f"the checkpoint's data cursor walked {state['rows']} rows with seed {state['seed']}; "
                f"this run has {len(self.rows)} rows with seed {self.seed}"
            )
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._shuffled(self.epoch)

    def next_batch(self, size: int) -> list[T]:
        batch = []
        while len(batch) < size:
            if self.position == len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._shuffled(self.epoch)
            batch.append(self.rows[self._order[self.position]])
            self.position += 1
        return batch
