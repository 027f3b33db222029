"""The import graph of grpo_dist: every module's imports of other grpo_dist modules, its circles,
the library modules that import a command line, and the functions too long to read at once.

    python scripts/import_graph.py          # prints the graph; exit 1 on a circle, a library->CLI import
                                            # or a function longer than MAX_FUNCTION_LINES
    python scripts/import_graph.py --classes [N]   # the N largest classes: methods, attributes, lines

An import is any of: `import a.b`, `from a import b`, a relative `from . import b` / `from ..a
import b`, and `importlib.import_module` with a constant name. A computed name is not followed: the
registries (reward/registry.py, env/registry.py) name their built-ins in strings, which are data.
Imports inside functions count too: a circle through a deferred import still ties
two modules together. tests/test_layout.py runs the same checks.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "grpo_dist"
COMMAND_LINES = {"grpo_dist.launch", "grpo_dist.eval", "grpo_dist.report"}
MAX_FUNCTION_LINES = 60


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports (a `from package import name` names the
    submodule when there is one, else the package)."""
    modules = {module_name(path, package): path for path in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]  # the package `.` means
        edges: set[str] = set()
        for node in ast.walk(tree):
            edges |= imported(node, here, modules.keys())
        graph[name] = edges - {name}
    return graph


def imported(node: ast.AST, here: str, modules: set[str] | dict) -> set[str]:
    """The package's modules that one statement or call imports; `here` is the module's package."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # from .x import y: `here`, minus a package per extra dot, then x
            anchor = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
            base = f"{anchor}.{base}" if base else anchor
        subs = {f"{base}.{alias.name}" for alias in node.names} & set(modules)
        return subs or ({base} & set(modules))
    if isinstance(node, ast.Call) and is_import_module(node.func) and node.args:
        target = node.args[0]
        if isinstance(target, ast.Constant) and isinstance(target.value, str):
            name = f"{here}{target.value}" if target.value.startswith(".") else target.value
            return {name} & set(modules)
    return set()


def is_import_module(func: ast.expr) -> bool:
    """`importlib.import_module` or a bare `import_module`."""
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id == "import_module")


def long_functions(package: Path = PACKAGE, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """("path:line name", lines) of every function or method longer than `limit` lines, longest first."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append((f"{path.relative_to(package.parent)}:{node.lineno} {node.name}", lines))
    return sorted(found, key=lambda item: -item[1])


def class_sizes(package: Path = PACKAGE) -> list[tuple[str, int, int, int]]:
    """("path:line Class(Bases)", methods, attributes, lines) of every class, most methods first. Methods are
    those defined in its body; attributes the distinct `self.x` its methods assign (inherited ones not counted)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef):
                continue
            methods = [item for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]
            attributes = {target.attr for method in methods for target in ast.walk(method)
                          if isinstance(target, ast.Attribute) and isinstance(target.ctx, ast.Store)
                          and isinstance(target.value, ast.Name) and target.value.id == "self"}
            bases = ", ".join(ast.unparse(base) for base in node.bases)
            where = f"{path.relative_to(package.parent)}:{node.lineno} {node.name}" + (f"({bases})" if bases else "")
            found.append((where, len(methods), len(attributes), node.end_lineno - node.lineno + 1))
    return sorted(found, key=lambda item: (-item[1], -item[2]))


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
    if sys.argv[1:2] == ["--classes"]:
        count = int(sys.argv[2]) if len(sys.argv) > 2 else 15
        print("methods attributes lines class")
        for where, methods, attributes, lines in class_sizes()[:count]:
            print(f"{methods:7d} {attributes:10d} {lines:5d} {where}")
        return 0
    graph = import_graph()
    for name in sorted(graph):
        print(f"{name} -> {', '.join(sorted(graph[name])) or '-'}")
    problems = [f"circle: {' <-> '.join(circle)}" for circle in circles(graph)]
    problems += [f"library imports a command line: {name} -> {cli}" for name, cli in library_to_cli(graph)]
    problems += [f"function of {lines} lines (> {MAX_FUNCTION_LINES}): {where}" for where, lines in long_functions()]
    print("\n".join(problems) or f"{len(graph)} modules, no circle, no library module imports a command line, "
          f"no function over {MAX_FUNCTION_LINES} lines")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
