"""The package's import graph has no cycle: between modules, or between the layers
`worker`, `state`, `driver` and `protocol` (read from the source, imports inside functions
included; those under `if TYPE_CHECKING:` are not imports at run time and are left out)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import elastic

ROOT = Path(elastic.__file__).parent
LAYERS = ("worker", "state", "driver", "protocol")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking_only(node):
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _imports(node)


def imported_modules(name: str) -> set[str]:
    """The package's modules that module `name` imports (a `from a import b` names module
    `a.b` when there is one, else `a`)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _imports(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                for alias in node.names
            ]
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: imported_modules(name) for name in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_no_module_imports_itself_through_others() -> None:
    assert cycles(GRAPH) == []


def test_the_layers_import_one_way() -> None:
    between: dict[str, set[str]] = {}
    for name, targets in GRAPH.items():
        if (source := layer(name)) is not None:
            for target in targets:
                if (other := layer(target)) is not None and other != source:
                    between.setdefault(source, set()).add(other)
    assert cycles(between) == [], between


def test_the_walk_sees_imports_at_all() -> None:
    """The check would pass on an empty graph: it must see the imports that are there."""
    assert "elastic.protocol.http" in GRAPH["elastic.driver.job"] | set().union(
        *(GRAPH[m] for m in GRAPH if m.startswith("elastic.driver."))
    )
    assert sum(len(targets) for targets in GRAPH.values()) > 200
