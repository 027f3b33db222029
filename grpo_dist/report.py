"""Command line: draw a run's report again, from RUN_DIR/metrics.jsonl (plots.py draws it).

    python -m grpo_dist.report RUN_DIR [--output PATH]      (default: RUN_DIR/report.png)

Exit codes: 0 written (its path is printed), 2 no metrics.jsonl there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpo_dist.observe.plots import write_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo_dist.report", description="Plot a run's metrics.jsonl.")
    parser.add_argument("run_dir", help="a run directory (holds metrics.jsonl)")
    parser.add_argument("--output", help="the PNG to write (default: RUN_DIR/report.png)")
    args = parser.parse_args(argv)
    try:
        path = write_report(Path(args.run_dir), Path(args.output) if args.output else None)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
