"""The import graph of grpo_dist: every module's imports of other grpo_dist modules, its circles,
and the library modules that import a command line.

    python scripts/import_graph.py          # prints the graph; exit 1 on a circle or a library->CLI import

Imports inside functions count too: a circle through a deferred import still ties two modules
together. tests/test_layout.py runs the same checks.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "grpo_dist"
COMMAND_LINES = {"grpo_dist.launch", "grpo_dist.eval", "grpo_dist.report"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the grpo_dist modules it imports (a `from package import name` names the
    submodule when there is one, else the package)."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges |= {alias.name for alias in node.names if alias.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module in modules:
                subs = {f"{node.module}.{alias.name}" for alias in node.names} & modules.keys()
                edges |= subs or {node.module}
        graph[name] = edges - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def library_to_cli(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(library module, command line) pairs where a module that is no command line imports one."""
    return [(name, target) for name, targets in sorted(graph.items()) if name not in COMMAND_LINES
            for target in sorted(targets & COMMAND_LINES)]


def main() -> int:
    graph = import_graph()
    for name in sorted(graph):
        print(f"{name} -> {', '.join(sorted(graph[name])) or '-'}")
    problems = [f"circle: {' <-> '.join(circle)}" for circle in circles(graph)]
    problems += [f"library imports a command line: {name} -> {cli}" for name, cli in library_to_cli(graph)]
    print("\n".join(problems) or f"{len(graph)} modules, no circle, no library module imports a command line")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
