"""data.py: every dataset format, messages and chat templates, field names, the length limit, and
errors that name the source, the row and the field before anything starts."""

import json
import re
import subprocess
import time
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from faults import session_processes

from gsm8k_helpers import ROWS, write_gsm8k
from grpo_dist.config.schema import load_config
from grpo_dist.tasks.data import DataError, PromptCursor, load_table, prepare_data, read_jsonl
from grpo_dist.common.models import load_tokenizer
from grpo_dist.tasks.tiny import save_tiny_model

ROOT = Path(__file__).resolve().parent.parent
ARITHMETIC = [{"prompt": "1+2=", "answer": "3"}, {"prompt": "40+2=", "answer": "42"}, {"prompt": "7+7=", "answer": "14"}]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> str:
    """A tiny model whose tokenizer has a ChatML template; context 512 tokens."""
    folder = tmp_path_factory.mktemp("chat_model")
    save_tiny_model(folder, "qwen2", chat=True, max_positions=512)
    return str(folder)


def write_jsonl(path: Path, rows: list, blank_lines: bool = False) -> str:
    lines = [json.dumps(row) for row in rows]
    path.write_text(("\n\n" if blank_lines else "\n").join(lines) + "\n")
    return str(path)


def config(*overrides: str):
    return load_config(None, ["data.eval=null", *overrides])


def test_jsonl_json_parquet_and_dataset_folders_give_the_same_rows(tmp_path):
    write_jsonl(tmp_path / "rows.jsonl", ARITHMETIC, blank_lines=True)
    (tmp_path / "rows.json").write_text(json.dumps(ARITHMETIC))
    pq.write_table(pa.Table.from_pylist(ARITHMETIC), tmp_path / "rows.parquet")
    for name in ("rows.jsonl", "rows.json", "rows.parquet"):
        assert load_table(str(tmp_path / name)).rows == ARITHMETIC, name
    folder = write_gsm8k(tmp_path / "gsm8k", train=6, test=2)
    assert load_table(str(folder), "train", "main").rows == ROWS[:6]
    assert load_table(str(folder), "test", "main").rows == ROWS[6:8]


def test_the_default_task_prepares_every_row():
    config = load_config(None)
    data = prepare_data(config)
    assert len(data.train) == 9000 and len(data.eval) == 1000
    first = data.train[0]
    assert first.index == 0 and first.text == first.row["prompt"]
    # one token per character (the task's tokenizer), for every row of both splits: the one
    # batched tokenizer call neither pads the shorter prompts nor mixes up rows
    assert {len(p.ids) == len(p.text) for p in data.train + data.eval} == {True}
    assert {len(p.text) for p in data.train} >= {4, 6}  # "1+2=" and "40+59=" alike
    tokenizer = load_tokenizer(config.model.path)
    assert all(tokenizer.decode(p.ids) == p.text for p in data.eval)


def test_field_names_and_templates_are_configurable(tmp_path):
    rows = [{"question": "2+2?", "solution": "4"}, {"question": "3+3?", "solution": "6"}]
    path = write_jsonl(tmp_path / "q.jsonl", rows)
    data = prepare_data(config(f"data.train={path}", "data.prompt_field=question", "data.answer_field=solution",
                               "data.prompt_template='Q: {prompt} ({solution})'"))
    assert [p.text for p in data.train] == ["Q: 2+2? (4)", "Q: 3+3? (6)"]
    # rewards receive every field of the row, and the answer field also as `answer`
    assert data.train[0].row == {"question": "2+2?", "solution": "4", "answer": "4"}


def test_a_chat_template_renders_messages_and_prompts_with_the_system_prompt(tmp_path, chat_model):
    rows = [{"messages": [{"role": "user", "content": "Hi"}], "answer": "1"},
            {"prompt": "What is 2+2?", "answer": "4"},
            {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Go"}],
             "answer": "2"}]
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    data = prepare_data(config(f"model.path={chat_model}", f"data.train={path}", "data.system_prompt=Think."))
    assert [p.text for p in data.train] == [
        "<|im_start|>system\nThink.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nThink.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nGo<|im_end|>\n<|im_start|>assistant\n",
    ]
    assert data.train[1].ids[0] == 3  # <|im_start|> as one token, no BOS added to the template's text
    tokenizer = load_tokenizer(chat_model)
    # the same as a call per prompt (three lengths: no padding), without special tokens added
    assert [p.ids for p in data.train] == [tokenizer(p.text, add_special_tokens=False)["input_ids"] for p in data.train]
    assert len({len(p.ids) for p in data.train}) == 3
    plain = prepare_data(config(f"model.path={chat_model}", "data.chat_template=false"))
    assert plain.train[0].text == "25+99="


@pytest.mark.parametrize("rows,overrides,message", [
    ([{"prompt": "a", "answer": "1"}, {"question": "b", "answer": "2"}], [],
     r"rows.jsonl:2: no field 'prompt' \(data.prompt_field\)"),
    ([{"prompt": "a"}], [], r"rows.jsonl:1: no field 'answer' \(data.answer_field='answer'\), which reward "
                            r"'exact_answer' needs"),
    ([{"prompt": "a", "answer": "1"}, {"prompt": 7, "answer": "1"}], [], "rows.jsonl:2: field 'prompt' must be"),
    ([{"prompt": "a", "answer": "1"}], ["data.prompt_template='{prompt} {hint}'"],
     r"rows.jsonl:1: data.prompt_template names field 'hint'"),
    ([{"messages": [{"role": "user", "content": "a"}], "answer": "1"}], ["data.chat_template=false"],
     "rows.jsonl:1: field 'messages' holds messages, but no chat template is applied"),
    ([[1, 2]], [], "rows.jsonl:1: a row must be an object"),
    ([{"prompt": "a"}], ["reward.functions=[{name: answer_format}]", "reward.accuracy_from=answer_format",
                         "data.system_prompt=x"], "data.system_prompt is set, but no chat template"),
    ([{"prompt": "a", "answer": "1"}], ["data.chat_template=true"], "the model's tokenizer has no chat template"),
])
def test_bad_rows_name_the_row_and_the_field(tmp_path, rows, overrides, message):
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    with pytest.raises(DataError, match=message):
        prepare_data(config(f"data.train={path}", *overrides))


@pytest.mark.parametrize("prompt,message", [
    ("", "field 'prompt' is empty"),
    (" \n\t ", "field 'prompt' is only whitespace"),
    ("<eos><pad>", "field 'prompt' holds only special tokens of the tokenizer: '<eos><pad>'"),
    (" <unk> \n", "field 'prompt' holds only special tokens"),
])
def test_blank_prompts_and_prompts_of_special_tokens_name_their_row(tmp_path, prompt, message):
    """Nothing to answer, or only markup the model reads as structure (its end of text): exit 2 at
    the row. A prompt that merely contains special tokens is a prompt."""
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": prompt, "answer": "1"}]
    with pytest.raises(DataError, match=f"rows.jsonl:2: {re.escape(message)}"):
        prepare_data(config(f"data.train={write_jsonl(tmp_path / 'rows.jsonl', rows)}"))
    rows[1]["prompt"] = "<eos>1+1="
    assert [p.text for p in prepare_data(config(f"data.train={write_jsonl(tmp_path / 'ok.jsonl', rows)}")).train] \
        == ["1+1=", "<eos>1+1="]


def test_blank_messages_name_their_row(tmp_path, chat_model):
    rows = [{"messages": [{"role": "system", "content": ""}, {"role": "user", "content": "  "}], "answer": "1"}]
    with pytest.raises(DataError, match="rows.jsonl:1: field 'messages' is only whitespace"):
        prepare_data(config(f"model.path={chat_model}", f"data.train={write_jsonl(tmp_path / 'rows.jsonl', rows)}"))


def test_a_reward_that_needs_no_answer_needs_no_answer_field(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "a"}])
    data = prepare_data(config(f"data.train={path}", "reward.functions=[{name: answer_format}]",
                               "reward.accuracy_from=answer_format"))
    assert data.train[0].row == {"prompt": "a"}


@pytest.mark.parametrize("messages,message", [
    ([{"role": "user"}], r"messages\[0\] must have string 'role' and 'content'"),
    ([{"role": "user", "content": "a"}, {"content": "b"}], r"messages\[1\] must have"),
    ([], "field .messages. is an empty list of messages"),
])
def test_messages_need_role_and_content(tmp_path, chat_model, messages, message):
    rows = [{"messages": [{"role": "user", "content": "fine"}], "answer": "1"}, {"messages": messages, "answer": "1"}]
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    with pytest.raises(DataError, match="rows.jsonl:2: " + message):
        prepare_data(config(f"model.path={chat_model}", f"data.train={path}"))


def test_unreadable_malformed_and_empty_sources(tmp_path):
    (tmp_path / "broken.jsonl").write_text('{"prompt": "a"}\n\n{"prompt": \n')
    with pytest.raises(DataError, match=r"broken.jsonl:3: not valid JSON"):
        read_jsonl(str(tmp_path / "broken.jsonl"))
    (tmp_path / "binary.jsonl").write_bytes(b'{"prompt": "a", "answer": "1"}\n{"prompt": "caf\xe9"}\n')  # Latin-1
    with pytest.raises(DataError, match="binary.jsonl:2: not UTF-8: byte 0xe9 at column 16"):
        load_table(str(tmp_path / "binary.jsonl"))
    (tmp_path / "blank.jsonl").write_text("\n\n")
    with pytest.raises(DataError, match="blank.jsonl: no rows"):
        load_table(str(tmp_path / "blank.jsonl"))
    (tmp_path / "binary.json").write_bytes(b'[{"prompt": "a", "answer": "1"},\n {"prompt": "caf\xe9"}]')  # a .json
    with pytest.raises(DataError, match="binary.json:2: not UTF-8: byte 0xe9 at column 17"):  # file: its line
        load_table(str(tmp_path / "binary.json"))
    (tmp_path / "broken.json").write_text('[{"prompt": "a"},\n\n {"prompt": }]')
    with pytest.raises(DataError, match=r"broken.json:3: not valid JSON: Expecting value: line 3 column 13"):
        load_table(str(tmp_path / "broken.json"))
    (tmp_path / "object.json").write_text('{"prompt": "a"}')
    with pytest.raises(DataError, match="a JSON dataset is a list of rows"):
        load_table(str(tmp_path / "object.json"))
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(DataError, match="bad.parquet: cannot read: .*magic bytes"):
        load_table(str(tmp_path / "bad.parquet"))
    pq.write_table(pa.Table.from_pylist([], schema=pa.schema([("prompt", pa.string())])), tmp_path / "empty.parquet")
    with pytest.raises(DataError, match="empty.parquet: no rows"):
        load_table(str(tmp_path / "empty.parquet"))
    with pytest.raises(DataError, match=r"\[main/validation\]: cannot load.*Unknown split"):
        load_table(str(write_gsm8k(tmp_path / "gsm8k")), "validation", "main")


def test_long_prompts_are_dropped_and_counted(tmp_path, capsys):
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "1" * 60 + "=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    # the arithmetic model's context is 64 positions: 64 - max_new_tokens 8 = 56 prompt tokens by default
    data = prepare_data(config(f"data.train={path}"))
    assert [p.index for p in data.train] == [0, 2]  # indexes are positions in the split, dropped rows counted
    assert "dropped 1 of 3 rows" in capsys.readouterr().err
    with pytest.raises(DataError, match="every prompt is longer than 3 tokens"):
        prepare_data(config(f"data.train={path}", "rollout.max_prompt_tokens=3"))
    with pytest.raises(DataError, match="rollout.max_prompt_tokens=60 \\+ rollout.max_new_tokens=8 exceed the "
                                        "context of 64"):
        prepare_data(config(f"data.train={path}", "rollout.max_prompt_tokens=60"))
    assert len(prepare_data(config(f"data.train={path}", "rollout.vllm.max_model_len=16")).train) == 2


def test_eval_rows_and_the_cursor():
    data = prepare_data(load_config(None, ["data.eval_rows=5"]))
    assert [p.index for p in data.eval] == [0, 1, 2, 3, 4]
    cursor = PromptCursor(data.train[:5], seed=0)
    first_epoch = cursor.next_batch(5)
    assert sorted(p.index for p in first_epoch) == [0, 1, 2, 3, 4]


def test_the_cli_exits_2_on_bad_data_and_leaves_nothing_behind(tmp_path):
    """Ray and the actors start while the data are read (docs/speed.md): bad data is exit 2 with
    one message, the last line; Ray and the actors are stopped again, no process of the run is
    left, nothing is written. (One kind of bad row: every DataError takes this door, and each
    message is checked on prepare_data above.)"""
    message = "rows.jsonl:2: not valid JSON"
    (tmp_path / "rows.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": \n')
    run = subprocess.Popen([sys.executable, "-m", "grpo_dist.launch", f"data.train={tmp_path / 'rows.jsonl'}",
                            "cluster.address=local", f"trainer.output_dir={tmp_path / 'runs'}"], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    stdout, stderr = run.communicate(timeout=300)
    assert run.returncode == 2, stderr[-2000:]
    assert message in stderr and stderr.strip().splitlines()[-1].startswith("error: ")
    deadline = time.monotonic() + 30
    while session_processes(run.pid) and time.monotonic() < deadline:  # Ray's processes end with the driver
        time.sleep(0.2)
    assert not session_processes(run.pid)
    assert not (tmp_path / "runs").exists()
