"""The package's layers, read from its module-level imports: no module imports one that imports it
back, and the backends sit below the data sets."""

from __future__ import annotations

import ast
from pathlib import Path

import cudnnnet

PACKAGE = Path(cudnnnet.__file__).parent


def module_name(path: Path) -> str:
    parts = ["cudnnnet", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_level_imports() -> dict[str, set[str]]:
    """Each module → the package's modules it imports at its top level (relative imports)."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        tree = ast.parse(path.read_text())
        top_level = [*tree.body, *(node for block in tree.body if isinstance(block, ast.If) for node in block.body)]
        imported = set()
        for node in top_level:
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                candidates = [f"{target}.{alias.name}" for alias in node.names] + [target]
                imported.update(next(([c] for c in candidates if c in modules), []))
        graph[name] = imported
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import circles between modules (a package importing its own submodules, or one of them
    importing the package, is not counted)."""
    found, done = [], set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            found.append(path[path.index(name):] + [name])
            return
        if name in done:
            return
        for imported in graph.get(name, ()):
            if not (imported.startswith(name + ".") or name.startswith(imported + ".")):
                visit(imported, path + [name])
        done.add(name)

    for name in graph:
        visit(name, [])
    return found


def test_no_module_imports_one_that_imports_it_back():
    assert cycles(module_level_imports()) == []


def test_the_cycle_check_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) != []


def test_no_backend_imports_the_data_sets():
    graph = module_level_imports()
    below = {name: sorted(dep for dep in deps if dep.startswith("cudnnnet.data"))
             for name, deps in graph.items() if name.startswith("cudnnnet.backends")}
    assert {name: deps for name, deps in below.items() if deps} == {}
