"""A chaos run (slow tier): the built-in task with 2 rollout workers and 2 reward actors trains
60 steps while tests/faults.py's Chaos kills or freezes a random one of them every few steps,
in sync and in async mode. Nothing is lost:

- the run exits 0 with every step in metrics.jsonl once, each with the whole batch, drawn once
  (the data cursor moves by one batch a step) and no prompt twice within an epoch;
- no group is staler than the bound (sync: sampled by exactly the weights before its step);
- the served weights were verified for every version that sampled a batch;
- sync mode is deterministic (chunks sent again keep their prompts and seeds), so the run
  with faults trains exactly as one without: the same rewards every step and the same final
  accuracy; async mode's accuracy is within noise of the run without faults.

The faults injected and survived, and what they cost in wall time, are printed (pytest -s)
and reported in docs/checkpoints.md.
"""

import json
from pathlib import Path

import pytest

from faults import Chaos
from runs import SMALL, finish, start, train_records, wait_for

pytestmark = pytest.mark.slow

STEPS, PROMPTS, GROUP, BOUND = 60, 8, 4, 1
RUN = [*SMALL, f"trainer.steps={STEPS}", f"rollout.prompts_per_step={PROMPTS}", f"rollout.group_size={GROUP}",
       "rollout.num_workers=2", "rollout.num_cpus=0.25", "reward.num_workers=2", "reward.num_cpus=0.25",
       "learner.num_cpus=0.5", "algo.lr=1e-4", "data.eval_rows=64", "trainer.call_timeout_s=6",
       "cluster.max_restarts=50", "trainer.checkpoint_every=0", "trainer.save_final=false",
       "trainer.samples_every=1", f"trainer.samples_per_log={PROMPTS}"]
MODES = {"sync": ["trainer.mode=sync"], "async": ["trainer.mode=async", f"trainer.max_staleness={BOUND}"]}


def train(tmp_path: Path, name: str, mode: str, chaos: bool) -> tuple[Path, dict, list[tuple[str, str, int]]]:
    """One run: (its directory, summary.json, the faults injected)."""
    run_dir, log = tmp_path / name, tmp_path / f"{name}.log"
    run = start(*RUN, *MODES[mode], f"trainer.output_dir={tmp_path}", f"trainer.run_name={name}", log=log)
    injector = None
    try:
        if chaos:
            wait_for(lambda: len(train_records(run_dir)) >= 2, run)
            injector = Chaos(["RolloutWorker", "RewardWorker"], run.pid, lambda: len(train_records(run_dir)),
                             every=5, seed=1)
            injector.start()
        code, output = finish(run, timeout=900, log=log)
    finally:
        if injector is not None:
            injector.stop()
    assert code == 0, output[-4000:]
    return run_dir, json.loads((run_dir / "summary.json").read_text()), [] if injector is None else injector.faults


@pytest.fixture(scope="module")
def calm(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """The same runs without faults, to compare against."""
    folder = tmp_path_factory.mktemp("calm")
    return {mode: train(folder, f"calm_{mode}", mode, chaos=False)[:2] for mode in MODES}


@pytest.mark.parametrize("mode", list(MODES))
def test_a_run_under_chaos_loses_nothing(tmp_path, calm, mode):
    run_dir, summary, faults = train(tmp_path, "chaos", mode, chaos=True)
    calm_dir, calm_summary = calm[mode]
    kinds = {(name, action): sum(f[:2] == (name, action) for f in faults) for name, action, _ in faults}
    print(f"\n{mode}: {len(faults)} faults {kinds}; wall {summary['wall_seconds']} s with them, "
          f"{calm_summary['wall_seconds']} s without; accuracy {summary['eval_accuracy_after']} vs "
          f"{calm_summary['eval_accuracy_after']}; restarts {summary['rollout_restarts']} + "
          f"{summary['reward_restarts']}, hangs {summary['rollout_hangs']} + {summary['reward_hangs']}")
    assert len(faults) >= 8, faults
    survived = summary["rollout_restarts"] + summary["reward_restarts"]
    assert survived >= len(faults) - 1, (faults, summary)  # (a fault may land as the run shuts down)
    assert summary["rollout_hangs"] + summary["reward_hangs"] >= 1

    records = train_records(run_dir)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    positions = [(r["data/epoch"], r["data/position"]) for r in records]
    assert positions == [(r["data/epoch"], r["data/position"]) for r in train_records(calm_dir)]  # drawn once each
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    by_step: dict[int, list[dict]] = {}
    for sample in samples:
        by_step.setdefault(sample["step"], []).append(sample)
    assert sorted(by_step) == list(range(1, STEPS + 1))
    for step, groups in by_step.items():
        assert len(groups) == PROMPTS and all(len(g["completions"]) == GROUP for g in groups), step
        assert len({g["prompt_index"] for g in groups}) == PROMPTS, step  # no group twice in a batch
    epochs: dict[float, list[int]] = {}
    for record in records:
        epochs.setdefault(record["data/epoch"], []).extend(g["prompt_index"] for g in by_step[record["step"]])
    assert all(len(indices) == len(set(indices)) for indices in epochs.values())  # none trained twice

    trained_by = {r["step"]: int(r["policy/version"]) - 1 for r in records}
    lags = [trained_by[s["step"]] - s["policy_version"] for s in samples]
    assert 0 <= min(lags) and max(lags) <= (0 if mode == "sync" else BOUND), lags
    verified = {r["step"]: r["weights/verified_version"] for r in records}
    assert all(verified[s["step"]] >= s["policy_version"] for s in samples)  # every sampling version checked

    if mode == "sync":  # deterministic: exactly the run without faults
        calm_rewards = [r["reward/mean"] for r in train_records(calm_dir)]
        assert [r["reward/mean"] for r in records] == calm_rewards
        assert summary["eval_accuracy_after"] == calm_summary["eval_accuracy_after"]
    else:
        noise = 3 * (summary["eval_accuracy_stderr_after"] + calm_summary["eval_accuracy_stderr_after"])
        assert abs(summary["eval_accuracy_after"] - calm_summary["eval_accuracy_after"]) <= max(noise, 0.1)
