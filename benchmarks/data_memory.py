"""Peak resident memory of `prepare_data` on a generated JSONL file of N arithmetic rows, and
what the prompts it returns hold: so that a large file is seen to be read once, not held twice.

    .venv/bin/python benchmarks/data_memory.py [--rows 1000000] [--format json]

`--format json` writes the rows as one JSON list (.json, read whole) instead.

Each figure comes from a fresh process: its peak RSS (ru_maxrss) after the imports and the
tokenizer, then after prepare_data, and the RSS left once the prompts are built (they are the
trainer's input and stay). The file is written to a temporary folder and removed.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MEASURE = """
import json, resource, sys, time
import psutil
from grpo_dist.config.schema import load_config
from grpo_dist.tasks.data import prepare_data
from grpo_dist.common.models import load_tokenizer
config = load_config(None, [f"data.train={sys.argv[1]}", "data.eval=null"])
tokenizer = load_tokenizer(config.model.path)
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
before = peak()
started = time.perf_counter()
data = prepare_data(config, tokenizer)
print(json.dumps({"prompts": len(data.train), "seconds": round(time.perf_counter() - started, 1),
                  "peak_mb_before": round(before), "peak_mb_after": round(peak()),
                  "rss_mb_holding_prompts": round(psutil.Process().memory_info().rss / 2**20)}))
"""


def write_rows(path: Path, rows: int) -> int:
    """`rows` arithmetic rows (the default task's shape) as JSONL, or as a JSON list when `path`
    ends in .json; returns the file's size in bytes."""
    draw = random.Random(0)
    lines = []
    for _ in range(rows):
        a, b = draw.randint(0, 99), draw.randint(0, 99)
        lines.append(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}))
    path.write_text("[" + ",\n".join(lines) + "]" if path.suffix == ".json" else "".join(f"{line}\n" for line in lines))
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--format", choices=["jsonl", "json"], default="jsonl")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"rows.{args.format}"
        size = write_rows(path, args.rows)
        result = subprocess.run([sys.executable, "-c", MEASURE, str(path)], cwd=ROOT, capture_output=True,
                                text=True, check=True)
    print(json.dumps({"rows": args.rows, "format": args.format, "file_mb": round(size / 2**20, 1), **json.loads(result.stdout)}))


if __name__ == "__main__":
    main()
