"""benchmarks/first_samples.py's table: each sampler's distance from the baseline in standard errors."""

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPT = BENCHMARKS / "first_samples.py"


def load():
    if str(BENCHMARKS) not in sys.path:  # as when run as a script: it imports its neighbour vs_trl
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("first_samples", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_table_gives_each_samplers_distance_from_generate_in_standard_errors():
    results = {"vllm": {"completions": (512, 0.0), "reward": (0.06, 0.012), "length": (58.0, 0.5)},
               "generate": {"completions": (512, 0.0), "reward": (0.04, 0.009), "length": (59.2, 0.5)}}
    lines = load().table(results).splitlines()
    assert lines[0] == " | vllm | generate | vllm - generate, SEs"
    assert lines[2] == "completions | 512.000 ± 0.000 | 512.000 ± 0.000 | "
    assert lines[3] == "reward | 0.060 ± 0.012 | 0.040 ± 0.009 | +1.33"  # 0.02 / hypot(0.012, 0.009) = 0.02 / 0.015
    assert lines[4].endswith(" | -1.70")  # -1.2 / hypot(0.5, 0.5)


def test_without_the_baseline_the_table_has_no_distances():
    lines = load().table({"vllm": {"reward": (0.06, 0.012)}}).splitlines()
    assert lines == [" | vllm", "---|---", "reward | 0.060 ± 0.012"]
