"""The warm start of the arithmetic_reveal task (env/arithmetic_reveal.py): two-turn transcripts.

The environment opens with the sum's second addend hidden (`58+=`); after the model's first
reply it reveals the whole question (`58+67=`) and the model answers again. The default model
(tasks/arithmetic.py) never saw text after its <eos>, so this fine-tunes it on transcripts

    58+=<answer>58</answer><eos>58+67=<answer>S</answer><eos>

with the loss on the two replies only: the first reply is the visible addend (a guess, right
only when the hidden one is 0), S is carry-confused as in the default warm start (the true sum
for `correct_fraction` of the examples, the digit-wise sum without carries for the rest), so
the second turn has the default task's headroom. The shipped model
(`grpo_dist/tasks/assets/arithmetic_reveal/model`; the data are the default task's) is this
command's defaults, 4000 steps at 2e-3 from the default model (7 minutes on 2 quiet cores):

    python -m grpo_dist.tasks.arithmetic_reveal

Fewer steps leave the second turn's sums off by a digit (350 steps: 10% right greedily, and
GRPO had too little to promote); after 4000, greedy second turns are right on 29% of the
held-out rows, about the carry-free ones, as with the default task.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from grpo_dist.env.arithmetic_reveal import hide_addend
from grpo_dist.tasks.arithmetic import ASSET_DIR, completion_text, no_carry_sum, supervised_step

OUT_DIR = ASSET_DIR.parent / "arithmetic_reveal" / "model"


def transcript(tokenizer: PreTrainedTokenizerFast, prompt: str, second_answer: str) -> tuple[list[int], list[int]]:
    """(ids, labels) of one two-turn transcript; labels are -100 outside the replies."""
    eos = [tokenizer.eos_token_id]
    guess = prompt.partition("+")[0]
    pieces = [(tokenizer(hide_addend(prompt))["input_ids"], False),
              (tokenizer(completion_text(guess))["input_ids"] + eos, True),
              (tokenizer(prompt)["input_ids"], False),
              (tokenizer(completion_text(second_answer))["input_ids"] + eos, True)]
    ids = [i for piece, _ in pieces for i in piece]
    labels = [i if trained else -100 for piece, trained in pieces for i in piece]
    return ids, labels


def warm_start(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, train_rows: list[dict], *,
               steps: int, correct_fraction: float, batch_size: int = 64, lr: float = 1e-3,
               seed: int = 0) -> LlamaForCausalLM:
    """Supervised fine-tuning of `model` on two-turn transcripts of `train_rows` (cosine schedule)."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    pad = tokenizer.pad_token_id
    model.train()
    for step in range(steps):
        batch = []
        for row in rng.sample(train_rows, batch_size):
            a, b = (int(x) for x in row["prompt"][:-1].split("+"))
            answer = row["answer"] if rng.random() < correct_fraction else str(no_carry_sum(a, b))
            batch.append(transcript(tokenizer, row["prompt"], answer))
        loss = supervised_step(model, optimizer, schedule, batch, pad)
        if step % 50 == 0 or step == steps - 1:
            print(f"warm start step {step:5d}  loss {loss:.4f}", flush=True)
    model.eval()
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--init", type=Path, default=ASSET_DIR / "model", help="the model to fine-tune")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--correct-fraction", type=float, default=0.3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    train_rows = [json.loads(line) for line in (ASSET_DIR / "train.jsonl").read_text().splitlines()]
    tokenizer = PreTrainedTokenizerFast.from_pretrained(args.init)
    model = LlamaForCausalLM.from_pretrained(args.init, torch_dtype=torch.float32)
    started = time.time()
    warm_start(model, tokenizer, train_rows, steps=args.steps, correct_fraction=args.correct_fraction,
               batch_size=args.batch_size, lr=args.lr, seed=args.seed)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"wrote {args.out} in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
