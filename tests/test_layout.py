"""The house: no import circle, no library module importing a command line, no module or function
too long (scripts/import_graph.py prints the graph these checks read)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from import_graph import PACKAGE, circles, class_sizes, import_graph, library_to_cli, long_functions  # noqa: E402

MAX_LINES = 450


def test_the_checks_find_a_circle_and_a_library_that_imports_a_command_line():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "grpo_dist.eval"}, "grpo_dist.eval": {"d"}}
    assert circles(graph) == [["a", "b", "c"], ["d", "grpo_dist.eval"]]
    assert library_to_cli(graph) == [("d", "grpo_dist.eval")]


def write_package(root: Path, files: dict[str, str]) -> Path:
    """A package `pkg` under `root` holding `files` (relative path -> source); returns its folder."""
    for name, source in files.items():
        (root / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "pkg" / name).write_text(source)
    return root / "pkg"


def test_relative_imports_and_import_module_are_edges_and_close_a_circle(tmp_path):
    package = write_package(tmp_path, {
        "__init__.py": "",
        "a.py": "from . import b\n",                                       # pkg.a -> pkg.b
        "b.py": "from .sub.c import thing\n",                              # pkg.b -> pkg.sub.c
        "sub/__init__.py": "",
        "sub/c.py": "import importlib\n\ndef load():\n    return importlib.import_module('pkg.sub.d')\n",
        "sub/d.py": "from ..a import name\n",                              # pkg.sub.d -> pkg.a
        "sub/e.py": "from importlib import import_module\nimport_module('.c', __package__)\n",
    })
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.sub.c"}
    assert graph["pkg.sub.c"] == {"pkg.sub.d"} and graph["pkg.sub.d"] == {"pkg.a"}
    assert graph["pkg.sub.e"] == {"pkg.sub.c"}
    assert circles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.sub.d"]]


def test_a_function_over_the_limit_is_found(tmp_path):
    body = "".join(f"    x = {i}\n" for i in range(59))
    package = write_package(tmp_path, {"m.py": f"def fits():\n{body}\n\ndef too_long():\n{body}    return x\n"})
    assert long_functions(package) == [("pkg/m.py:63 too_long", 61)]  # fits() holds 60 lines: the limit


def test_class_sizes_count_own_methods_and_the_attributes_they_assign(tmp_path):
    source = ("class Base:\n    def __init__(self):\n        self.a = self.b = 1\n\n\n"
              "class Child(Base):\n    def f(self):\n        self.a, self.c = 2, self.b\n\n    def g(self):\n"
              "        other.d = 3\n")
    assert class_sizes(write_package(tmp_path, {"m.py": source})) == [
        ("pkg/m.py:6 Child(Base)", 2, 2, 6), ("pkg/m.py:1 Base", 1, 2, 3)]


def test_no_function_is_longer_than_a_reader_holds():
    assert long_functions() == [], "shorten them (scripts/import_graph.py lists them)"


def test_grpo_dist_has_no_import_circle():
    graph = import_graph()
    assert "grpo_dist.controller.evaluator" in graph and "grpo_dist.observe.evaluation" in graph["grpo_dist.controller.evaluator"]
    assert circles(graph) == []


def test_no_library_module_imports_a_command_line():
    assert library_to_cli(import_graph()) == []


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_longer_than_a_reader_holds(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for name in graph.get(todo.pop(), set()) - seen:
            seen.add(name)
            todo.append(name)
    return seen


def test_failure_handling_never_calls_the_publisher_back():
    """The Supervisor (recovery.py) and Retry (retry.py) get actors back and return the rollout workers
    that need weights; the WeightPublisher repairs them. Neither reaches publish.py, and LearnerWatch
    (actors.py) reaches neither: no circle of calls among the Supervisor, the publisher and LearnerWatch."""
    graph = import_graph()
    publish, recovery, retry = (f"grpo_dist.controller.{name}" for name in ("publish", "recovery", "retry"))
    assert publish not in reachable(graph, recovery) | reachable(graph, retry)
    assert not {publish, recovery, retry} & reachable(graph, "grpo_dist.controller.actors")
