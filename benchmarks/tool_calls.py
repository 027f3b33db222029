"""Tool calls from the real SmolLM2-135M-Instruct with the hermes tools block (env/render.py), read
by the hermes parser (agent/tool_calls.py): how often sampled replies call the tool, and how long a
parse takes.

    python benchmarks/tool_calls.py [--samples 32] [--seed 0] [--threads 1]

The model (scripts/real_model.py) gets the `add` tool through ChatRenderer's system block and the
question "What is 23+48?", zero-shot and after one example exchange (a call, its tool reply, the
answer); replies are sampled at temperature 1 (48 new tokens) and counted as calls, malformed
calls or prose. Then parse_reply's time per reply, on a hermes reply and on prose.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from real_model import prepare  # noqa: E402

from grpo_dist.agent.tool_calls import parse_reply  # noqa: E402
from grpo_dist.env.render import ChatRenderer  # noqa: E402
from grpo_dist.common.models import load_tokenizer  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]
EXAMPLE = [{"role": "user", "content": "What is 12+30?"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 12, "b": 30}'}}]},
           {"role": "tool", "content": "42"}, {"role": "assistant", "content": "12+30 = 42."}]
QUESTION = {"role": "user", "content": "What is 23+48?"}


def call_ids(index: int) -> str:
    return f"call_{index}"


def sample_kinds(model, renderer: ChatRenderer, history: list[dict], samples: int) -> Counter:
    """Replies sampled after history + the question, counted by what the hermes parser reads."""
    ids = renderer.opening_ids([*history, QUESTION])
    out = model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=True, temperature=1.0, top_p=1.0,
                         top_k=0, num_return_sequences=samples, eos_token_id=2, pad_token_id=2)
    kinds: Counter = Counter()
    for row in out[:, len(ids):].tolist():
        parsed = parse_reply(renderer.decode(row, skip_special=True), "hermes", call_ids)
        kinds["calls" if parsed.tool_calls else "malformed" if parsed.malformed else "prose"] += 1
    return kinds


def parse_microseconds(text: str, repeats: int = 20_000) -> float:
    started = time.perf_counter()
    for _ in range(repeats):
        parse_reply(text, "hermes", call_ids)
    return (time.perf_counter() - started) / repeats * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    folder = prepare()
    renderer = ChatRenderer(load_tokenizer(str(folder)), TOOLS)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    torch.manual_seed(args.seed)
    print("| prompt | calls | malformed calls | prose | seconds |\n|---|---|---|---|---|")
    for name, history in (("one example exchange first", EXAMPLE), ("zero-shot", [])):
        started = time.perf_counter()
        kinds = sample_kinds(model, renderer, history, args.samples)
        print(f"| {name} | {kinds['calls']} | {kinds['malformed']} | {kinds['prose']} | "
              f"{time.perf_counter() - started:.0f} |", flush=True)
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 23, "b": 48}}\n</tool_call>'
    print(f"\nparse_reply: {parse_microseconds(call):.1f} us a one-call reply, "
          f"{parse_microseconds('23 + 48 = 71. ' * 20):.1f} us a 280-character prose reply")


if __name__ == "__main__":
    main()
