"""No import cycle in `kernel_gateway`: each module's imports, read with `ast`, form no loop.

Only what runs when a module is imported counts: its module-level imports (inside `try` or an
`if` too), not those under `if TYPE_CHECKING:` (never run) nor those inside functions (run
later, when they are called). `from a.b import c` is an import of the module `a.b.c` when
there is one, else of `a.b`. A cycle is named module by module, back to where it started.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kernel_gateway"
NAME = PACKAGE.name


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its `__init__.py`)."""
    found: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if "__pycache__" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def module_level(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements run when the module is imported."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _type_checking(node.test):
                yield from module_level(node.body)
            yield from module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from module_level(block)
            for handler in node.handlers:
                yield from module_level(handler.body)
        elif isinstance(node, ast.With):
            yield from module_level(node.body)


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports when it is imported."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in module_level(tree.body):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        found |= {t for t in targets if t in modules and t != name}
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as its modules in order, the first repeated at the end."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path = [start]
        stack = [iter(sorted(graph[start]))]
        while stack:
            target = next(stack[-1], None)
            if target is None:
                done.add(path.pop())
                stack.pop()
            elif target in path:
                return [*path[path.index(target) :], target]
            elif target not in done:
                path.append(target)
                stack.append(iter(sorted(graph[target])))
    return None


def test_find_cycle_names_the_loop() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]


def test_the_package_has_no_import_cycle() -> None:
    modules = module_names()
    assert f"{NAME}.sessions.session" in modules  # the walk sees the package
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "an import cycle in the package: " + " -> ".join(cycle or [])
