"""The embedded default task: two-digit addition, `58+67=` -> `<answer>125</answer>`.

Everything here is offline and deterministic: a character-level tokenizer built with the
`tokenizers` library, a tiny Llama built from a config, the train/eval splits, and a
supervised warm start. Run `python -m grpo_dist.tasks.arithmetic` to rebuild the assets
that ship in `grpo_dist/tasks/assets/arithmetic/` (data files, tokenizer, model).

Why the warm start is "carry-confused". A tiny model that is fine-tuned briefly on correct
sums learns slowly and erratically under RL on two CPU cores (see the project's notes).
RL post-training is at its best when the policy can already produce the right behaviour
but prefers a wrong one; so the warm start is trained on labels that drop the carries
(`58+67` -> `15`, the digit-wise sums mod 10) for `1 - correct_fraction` of the examples
and are right for the rest. The resulting model computes both ways and, greedily,
answers with the mistake whenever a carry occurs (about 70% of the problems). Nothing
in the GRPO run knows about carries: the reward only says whether the final answer is
the true sum, and the policy has to find out which of its habits pays.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from grpo_dist.tasks import tiny
from grpo_dist.tasks.splits import write_splits

ASSET_DIR = Path(__file__).parent / "assets" / "arithmetic"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
CHARACTERS = "0123456789+="


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer (tasks/tiny.py); the answer tags are single tokens."""
    return tiny.build_tokenizer(CHARACTERS, added=[ANSWER_OPEN, ANSWER_CLOSE])


def build_model(vocab_size: int, seed: int = 0) -> LlamaForCausalLM:
    """A ~0.8M-parameter Llama; head_dim 32 so that vLLM's CPU attention accepts it."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def no_carry_sum(a: int, b: int) -> int:
    """The classic mistake: add each column mod 10 and drop every carry (58+67 -> 15)."""
    digits, place = 0, 1
    while a or b:
        digits += ((a % 10 + b % 10) % 10) * place
        a, b, place = a // 10, b // 10, place * 10
    return digits


def make_splits(seed: int = 0, eval_rows: int = 1000) -> tuple[list[dict], list[dict]]:
    """All 10,000 pairs of 0..99, shuffled once; the first `eval_rows` are held out."""
    pairs = [(a, b) for a in range(100) for b in range(100)]
    random.Random(seed).shuffle(pairs)
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in pairs]
    return rows[eval_rows:], rows[:eval_rows]


def completion_text(answer: str) -> str:
    return f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"


def warm_start(
    tokenizer: PreTrainedTokenizerFast,
    train_rows: list[dict],
    *,
    steps: int,
    correct_fraction: float,
    batch_size: int = 128,
    lr: float = 3e-3,
    seed: int = 0,
) -> LlamaForCausalLM:
    """Supervised training on prompt -> answer, loss on the completion tokens only."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = build_model(len(tokenizer), seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / steps))
    )
    model.train()
    for step in range(steps):
        batch = rng.sample(train_rows, batch_size)
        input_ids, labels = [], []
        for row in batch:
            a, b = (int(x) for x in row["prompt"][:-1].split("+"))
            answer = row["answer"] if rng.random() < correct_fraction else str(no_carry_sum(a, b))
            prompt_ids = tokenizer(row["prompt"])["input_ids"]
            completion_ids = tokenizer(completion_text(answer))["input_ids"] + [tokenizer.eos_token_id]
            input_ids.append(prompt_ids + completion_ids)
            labels.append([-100] * len(prompt_ids) + completion_ids)
        loss = supervised_step(model, optimizer, schedule, list(zip(input_ids, labels)), tokenizer.pad_token_id)
        if step % 200 == 0 or step == steps - 1:
            print(f"warm start step {step:5d}  loss {loss:.4f}", flush=True)
    model.eval()
    return model


def supervised_step(model: LlamaForCausalLM, optimizer: torch.optim.Optimizer,
                    schedule: torch.optim.lr_scheduler.LRScheduler, rows: list[tuple[list[int], list[int]]],
                    pad: int) -> float:
    """One optimizer step of next-token loss on (input ids, labels) rows, right-padded to one
    width (labels -100 where no loss), gradients clipped to norm 1; returns the loss."""
    width = max(len(ids) for ids, _ in rows)
    ids = torch.tensor([x + [pad] * (width - len(x)) for x, _ in rows])
    labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in rows])
    loss = model(input_ids=ids, attention_mask=(ids != pad).long(), labels=labels).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    schedule.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ASSET_DIR)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--correct-fraction", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    train_rows, eval_rows = make_splits(args.seed)
    write_splits(args.out, train_rows, eval_rows)
    tokenizer = build_tokenizer()
    started = time.time()
    model = warm_start(
        tokenizer, train_rows, steps=args.steps, correct_fraction=args.correct_fraction,
        batch_size=args.batch_size, seed=args.seed,
    )
    model.save_pretrained(args.out / "model")
    tokenizer.save_pretrained(args.out / "model")
    print(f"wrote {args.out} in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
