"""The docs say what the code does: CI runs the README's test command; docs/config.md, the reference
of every config field, is what scripts/config_reference.py generates now; the README stays an entry point."""

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


def test_the_configuration_reference_is_current():
    reference = subprocess.run([sys.executable, str(ROOT / "scripts" / "config_reference.py")],
                               capture_output=True, text=True, check=True).stdout
    assert reference == (ROOT / "docs" / "config.md").read_text(), \
        "regenerate it: python scripts/config_reference.py > docs/config.md"


def test_the_readme_is_an_entry_point_that_links_to_pages_that_exist():
    assert len(README.encode()) <= 12 * 1024, "the README is an entry point: move details to docs/"
    links = set(re.findall(r"\b((?:docs|deploy)/[\w./-]+\.md|CHANGELOG\.md)", README))
    assert "docs/config.md" in links
    assert [link for link in sorted(links) if not (ROOT / link).is_file()] == []
