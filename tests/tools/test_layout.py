"""The code's layout: no two modules import each other, directly or around a circle.

Imports under `if TYPE_CHECKING:` are for annotations only and do not count.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fp4cli", "kernels", "tasks")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _imported(node: ast.AST, modules: set[str]) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        found = set()
        for alias in node.names:
            full = f"{node.module}.{alias.name}"
            if full in modules:
                found.add(full)
            elif node.module in modules:
                found.add(node.module)
        return found
    return set()


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports at run time (at the top or inside functions)."""
    paths = {_module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    modules = set(paths)
    graph = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text())
        graph[name] = set().union(*(_imported(n, modules) for n in _runtime_nodes(tree))) - {name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while (member := stack.pop()) != module:
                group.append(member)
            if group:
                circles.append(sorted([module, *group]))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return circles


def test_the_circle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_circles(graph) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_around_a_circle() -> None:
    assert import_circles(import_graph()) == []
