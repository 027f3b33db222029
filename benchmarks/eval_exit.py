"""Seconds from `python -m grpo_dist.eval`'s printed result to the end of its process, and
`prepare_data` of the default task: this checkout against a baseline commit, alternating.

    .venv/bin/python benchmarks/eval_exit.py [--baseline main] [--repeats 3]

A 2-step default run (this checkout) gives the policy both evaluate. The exit is timed from
outside: from reading the result's last line ("}") on the pipe to the process's end.
`prepare_data` is timed inside a fresh process of each checkout: the median of five calls
after a first one, the tokenizer loaded once.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import ROOT, one_run, print_medians, unpack  # noqa: E402

PREPARE_DATA = """
import json, statistics, time
from grpo_dist.config.schema import load_config
from grpo_dist.tasks.data import prepare_data
from grpo_dist.common.models import load_tokenizer
config = load_config(None)
tokenizer = load_tokenizer(config.model.path)
prepare_data(config, tokenizer)
seconds = []
for _ in range(5):
    started = time.perf_counter()
    prepare_data(config, tokenizer)
    seconds.append(time.perf_counter() - started)
print(json.dumps({"prepare_data_s": statistics.median(seconds)}))
"""


def checkout_env(root: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(root)}


def eval_exit_s(root: Path, run_dir: Path) -> float:
    command = [sys.executable, "-m", "grpo_dist.eval", "--checkpoint", str(run_dir), "cluster.address=local"]
    process = subprocess.Popen(command, cwd=root, env=checkout_env(root), stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    printed = None
    for line in process.stdout:
        if line.rstrip() == "}":
            printed = time.time()
    if process.wait() != 0 or printed is None:
        raise RuntimeError(f"eval in {root} failed (exit {process.returncode})")
    return time.time() - printed


def prepare_data_s(root: Path) -> float:
    result = subprocess.run([sys.executable, "-c", PREPARE_DATA], cwd=root, env=checkout_env(root),
                            capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])["prepare_data_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="main", help="git ref of the baseline")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, dict[str, list[float]]] = {"baseline": {}, "this": {}}
    with tempfile.TemporaryDirectory() as tmp:
        one_run(ROOT, 2, Path(tmp) / "policy")
        roots = {"baseline": unpack(args.baseline, Path(tmp) / "baseline"), "this": ROOT}
        for _ in range(args.repeats):
            for name, root in roots.items():
                measured = {"eval_exit_s": eval_exit_s(root, Path(tmp) / "policy" / "run"),
                            "prepare_data_s": prepare_data_s(root)}
                for key, value in measured.items():
                    runs[name].setdefault(key, []).append(value)
                print(name, json.dumps({k: round(v, 3) for k, v in measured.items()}), flush=True)
    print_medians(runs, args.baseline, args.repeats, digits=3)


if __name__ == "__main__":
    main()
