"""The house: no import circle, no library module importing a command line, no module too long
(scripts/import_graph.py prints the graph these checks read)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from import_graph import PACKAGE, circles, import_graph, library_to_cli  # noqa: E402

MAX_LINES = 450


def test_the_checks_find_a_circle_and_a_library_that_imports_a_command_line():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "grpo_dist.eval"}, "grpo_dist.eval": {"d"}}
    assert circles(graph) == [["a", "b", "c"], ["d", "grpo_dist.eval"]]
    assert library_to_cli(graph) == [("d", "grpo_dist.eval")]


def test_grpo_dist_has_no_import_circle():
    graph = import_graph()
    assert "grpo_dist.controller.loop" in graph and "grpo_dist.evaluation" in graph["grpo_dist.controller.loop"]
    assert circles(graph) == []


def test_no_library_module_imports_a_command_line():
    assert library_to_cli(import_graph()) == []


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_longer_than_a_reader_holds(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES
