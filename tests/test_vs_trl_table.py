"""benchmarks/vs_trl.py's table: times as TRL / ours, the sampled and held-out numbers side by side only."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from vs_trl import table  # noqa: E402


def run(wall: float, reward: float, length_first: float, length_last: float, accuracy: float) -> dict:
    return {"wall_s": wall, "first_step_s": wall / 4, "step_s": wall / 10, "tokens_per_s": 1000 / wall,
            "reward_first_step": reward, "reward_mean": reward, "length_first_step": length_first,
            "length_last_step": length_last, "accuracy_before": 0.12, "accuracy_after": accuracy, "eval_rows": 100}


def test_the_table_divides_times_and_shows_lengths_and_accuracy_without_ratios():
    lines = table({"trl": [run(600.0, 0.0625, 58.25, 41.0, 0.31)], "sync": [run(400.0, 0.015625, 58.5, 63.96, 0.13)]},
                  steps=6).splitlines()
    rows = {line.split(" | ")[0]: line.split(" | ")[1:] for line in lines[2:]}
    assert rows["wall s"] == ["600.00", "400.00", "1.50"]
    assert rows["completion tokens/s"] == ["1.67", "2.50", "1.50"]  # ours / TRL
    assert rows["completion length, step 1"] == ["58.2", "58.5", ""]
    assert rows["completion length, last step"] == ["41.0", "64.0", ""]
    assert rows["training reward, step 1"] == ["0.062", "0.016", ""]
    assert rows["accuracy after"] == ["0.310 ± 0.046", "0.130 ± 0.034", ""]  # sqrt(p (1 - p) / 100)
