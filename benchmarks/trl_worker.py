"""TRL's side of benchmarks/vs_trl.py, run as TRL's users run it: nothing of grpo_dist imported.

    python benchmarks/trl_worker.py JOB.json OUT.json

The job (written by vs_trl.py) holds the model folder, the rendered prompt texts and answers of
the training and held-out rows, the reward's name and the GRPO settings. This process loads the
model and tokenizer with transformers' Auto classes, evaluates greedily with one batched
`model.generate` per chunk of rows, trains with GRPOTrainer, evaluates again and writes the
numbers (unix times; the driver turns them into seconds from this process's spawn).
Imports: the standard library, torch, transformers, datasets and trl only.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
HASHES = re.compile(r"####\s*([^\n]+)")
NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
EVAL_BATCH = 50  # rows per generate call: left-padded, greedy


def as_number(text: str) -> Fraction | None:
    try:
        return Fraction(text.strip().replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def tagged(completion: str) -> str | None:
    found = ANSWER_TAG.findall(completion)
    return found[-1].strip() if found else None


def boxed(completion: str) -> str | None:
    starts = [match.end() for match in BOXED.finditer(completion)]
    if not starts:
        return None
    depth = 1
    for position in range(starts[-1], len(completion)):
        depth += {"{": 1, "}": -1}.get(completion[position], 0)
        if depth == 0:
            return completion[starts[-1] : position].strip()
    return None


def exact_answer(completion: str, answer: str) -> float:
    """The toy job's rule: 1.0 when the last <answer> tag holds `answer` (as text or the same number)."""
    given = tagged(completion)
    if given is None:
        return 0.0
    expected = str(answer).strip()
    return float(given == expected or (as_number(given) is not None and as_number(given) == as_number(expected)))


def number_answer(completion: str, answer: str) -> float:
    r"""The word problems' rule for numeric answers: the final answer (last \boxed{}, else <answer>,
    else "#### x", else the last number) equals `answer` as a number (grpo_dist's math_answer there)."""
    hashes, numbers = HASHES.findall(completion), NUMBER.findall(completion)
    candidates = (boxed(completion), tagged(completion), hashes[-1].strip() if hashes else None,
                  numbers[-1] if numbers else None)
    given = next((candidate for candidate in candidates if candidate), None)
    if given is None:
        return 0.0
    value = as_number(given)
    return float(value is not None and value == as_number(str(answer)))


RULES = {"exact_answer": exact_answer, "math_answer": number_answer}


def greedy_accuracy(model: Any, tokenizer: Any, rows: list[dict], max_new_tokens: int, rule: Any) -> float:
    """Greedy held-out accuracy: batched, left-padded `model.generate`, replies decoded without special tokens."""
    import torch

    model.eval()
    tokenizer.padding_side = "left"
    correct = 0.0
    for start in range(0, len(rows), EVAL_BATCH):
        batch = rows[start : start + EVAL_BATCH]
        # tokenized as GRPOTrainer tokenizes a text prompt (the driver checked: grpo_dist's ids)
        inputs = tokenizer([row["prompt"] for row in batch], return_tensors="pt", padding=True)
        with torch.no_grad():
            output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                    pad_token_id=tokenizer.pad_token_id)
        replies = tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        correct += sum(rule(reply, row["answer"]) for reply, row in zip(replies, batch))
    return correct / len(rows)


def grpo_config(job: dict, out: Path) -> Any:
    from trl import GRPOConfig

    s = job["settings"]
    return GRPOConfig(
        output_dir=str(out.parent / "trl_run"), max_steps=s["steps"], learning_rate=s["lr"],
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=s["weight_decay"], max_grad_norm=s["max_grad_norm"],
        optim="adamw_torch", per_device_train_batch_size=s["group_size"] * s["prompts_per_step"],
        gradient_accumulation_steps=1, steps_per_generation=1, num_generations=s["group_size"],
        max_completion_length=s["max_new_tokens"], temperature=s["temperature"], top_p=1.0, top_k=0,
        beta=s["beta"], epsilon=s["clip_low"], epsilon_high=s["clip_high"], num_iterations=s["mu"],
        loss_type="grpo", scale_rewards="group", use_cpu=True, bf16=False, seed=s["seed"], report_to="none",
        save_strategy="no", logging_steps=1, disable_tqdm=True, dataloader_num_workers=0,
    )


def main(job_path: Path, out: Path) -> None:
    job = json.loads(job_path.read_text())
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    torch.set_num_threads(job["threads"])
    settings, rule = job["settings"], RULES[job["reward"]]
    tokenizer = AutoTokenizer.from_pretrained(job["model"])
    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32)
    before = greedy_accuracy(model, tokenizer, job["eval"], settings["max_new_tokens"], rule)
    ends: list[float] = []
    tokens: list[int] = []

    class StepTimes(TrainerCallback):
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            ends.append(time.time())

    def reward(completions: list[str], answer: list[str], completion_ids: list[list[int]], **_: Any) -> list[float]:
        tokens.append(sum(len(ids) for ids in completion_ids))
        return [rule(completion, expected) for completion, expected in zip(completions, answer)]

    tokenizer.padding_side = "left"
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=grpo_config(job, out),
                          train_dataset=Dataset.from_list(job["train"]), processing_class=tokenizer,
                          callbacks=[StepTimes()])
    train_started = time.time()
    trainer.train()
    after = greedy_accuracy(trainer.model, tokenizer, job["eval"], settings["max_new_tokens"], rule)
    steps_s = [b - a for a, b in zip([train_started, *ends], ends)]
    rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]  # one per step
    lengths = [entry["completions/mean_length"] for entry in trainer.state.log_history
               if "completions/mean_length" in entry]
    out.write_text(json.dumps({
        "first_step_at": ends[0], "step_s": statistics.median(steps_s[1:] or steps_s),
        "tokens_per_s": sum(tokens) / (ends[-1] - train_started),
        "reward_first_step": rewards[0], "reward_mean": statistics.fmean(rewards),
        "length_first_step": lengths[0], "length_last_step": lengths[-1],
        "accuracy_before": before, "accuracy_after": after, "eval_rows": len(job["eval"])}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
