"""The docs say what the code does: CI runs the README's test command; every config field is documented."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", README.split("## What the default job does")[0])


def test_readme_has_exactly_two_commands_and_ci_runs_the_test_one_then_the_slow_tier():
    run_default, run_tests = readme_commands()
    assert run_default.endswith("python -m grpo_dist.launch")
    assert run_tests.endswith('python -m pytest -m "not slow"')
    ci_lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci_lines[-2:] == [run_tests, ".venv/bin/python -m pytest -m slow"]


def test_readme_configuration_reference_is_current():
    reference = subprocess.run([sys.executable, str(ROOT / "scripts" / "config_reference.py")],
                               capture_output=True, text=True, check=True).stdout
    assert reference.strip() in README, "regenerate it: python scripts/config_reference.py"
