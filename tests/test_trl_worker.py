"""benchmarks/trl_worker.py, TRL's side of benchmarks/vs_trl.py: it imports nothing of grpo_dist,
so it holds its own copies of the reward rules; they must score as grpo_dist's do."""

import ast
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from grpo_dist.config.schema import resolve_path
from grpo_dist.reward.rules import exact_answer, math_answer

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "benchmarks" / "trl_worker.py"
ALLOWED_IMPORTS = {"torch", "transformers", "datasets", "trl"}
REAL_JOB_EVAL_ROWS = 100  # configs/smollm2_word_problems.yaml data.eval_rows


@pytest.fixture(scope="module")
def worker():
    spec = importlib.util.spec_from_file_location("trl_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def eval_rows(task: str) -> list[dict]:
    path = resolve_path(f"builtin:{task}/eval.jsonl")
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def replies(answer: str) -> list[str]:
    """Right and wrong replies in every shape the rules read: tags, boxes, hashes, last numbers."""
    wrong = str(int(answer) + 1)
    return [f"The answer is {answer}.", f"The answer is {wrong}.", f"{answer} apples, so {wrong}",
            f"<answer>{answer}</answer>", f"<answer> {answer} </answer>", f"<answer>{wrong}</answer>",
            f"<answer>{answer}.0</answer>", f"\\boxed{{{answer}}} then 3", f"#### {answer}\nok", "no number here",
            f"<answer>x</answer> {answer}", f"{answer}/1", ""]


def test_the_workers_exact_answer_scores_the_toy_jobs_eval_rows_as_grpo_dists(worker):
    for row in eval_rows("arithmetic"):
        for reply in replies(row["answer"]):
            assert worker.exact_answer(reply, row["answer"]) == exact_answer(row["prompt"], reply, row["answer"]), reply


def test_the_workers_number_rule_scores_the_real_jobs_eval_rows_as_math_answer(worker):
    for row in eval_rows("word_problems")[:REAL_JOB_EVAL_ROWS]:
        for reply in replies(row["answer"]):
            assert worker.number_answer(reply, row["answer"]) == math_answer(row["prompt"], reply, row["answer"]), reply


def test_the_worker_imports_only_the_standard_library_and_trls_stack():
    tree = ast.parse(WORKER.read_text())
    names = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert names - ALLOWED_IMPORTS - set(sys.stdlib_module_names) - {"__future__"} == set()
