"""One learner step's results, saved so that a refactor can show it changed nothing, bit for bit.

    PYTHONPATH=TREE:TREE/tests python scripts/step_fingerprint.py OUT.pt [--groups G.pt]
    python scripts/step_fingerprint.py --compare A.pt B.pt    # max |difference|; exit 1 unless 0

For each of a few settings (GRPO with KL, TIS with two passes of two minibatches, GSPO, Dr.
GRPO with micro-batches) a Learner takes one train_step on the same scored groups (sampled
once and saved with --groups, so that both trees learn from identical data); its metrics and
float32 masters are saved. Run it under two checkouts and compare.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

SETTINGS = {
    "grpo_kl": ["algo.beta=0.1", "algo.aggregation=sequence_mean"],
    "tis_minibatches": ["algo.tis_cap=2.0", "algo.mu=2", "algo.minibatch_size=8", "algo.clip_high=0.28"],
    "gspo": ["algo.ratio_level=sequence", "algo.aggregation=sequence_mean", "algo.clip_low=3e-4",
             "algo.clip_high=4e-4"],
    "dr_grpo_micro": ["algo.aggregation=constant", "algo.advantage_scale=none", "learner.micro_batch_size=3"],
}


def fingerprint(groups_path: str) -> dict[str, dict[str, torch.Tensor]]:
    """setting -> its step's metrics (as float64 scalars) and masters, keyed by name."""
    from learner_helpers import make_config, make_learner, masters, scored_groups

    if os.path.exists(groups_path):
        groups = torch.load(groups_path, weights_only=False)
    else:
        groups = scored_groups(make_config())
        torch.save(groups, groups_path)
    results = {}
    for name, overrides in SETTINGS.items():
        learner = make_learner(*overrides)
        metrics = learner.train_step(groups)
        numbers = {f"metric/{k}": torch.tensor(float(v), dtype=torch.float64) for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not k.startswith(("time/", "system/"))}  # not clocks
        results[name] = numbers | {f"weight/{i}": p for i, p in enumerate(masters(learner))}
    return results


def compare(a: dict, b: dict) -> float:
    """The largest |a - b| over every saved value; inf when the two hold different keys."""
    worst = 0.0
    for name in a:
        if a[name].keys() != b[name].keys():
            return float("inf")
        for key, value in a[name].items():
            other = b[name][key]
            same = torch.equal(value, other) or (value.isnan().all() and other.isnan().all())
            worst = max(worst, 0.0 if same else (value.double() - other.double()).abs().max().item())
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?")
    parser.add_argument("--groups", default="/tmp/step_fingerprint_groups.pt")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"))
    args = parser.parse_args()
    if args.compare:
        worst = compare(*(torch.load(path) for path in args.compare))
        print(f"max |difference| over metrics and weights: {worst}")
        return 0 if worst == 0.0 else 1
    torch.save(fingerprint(args.groups), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
