"""The package's layers, read from every import in its code (at the top of a module and inside
functions alike): no module imports one that imports it back, and no room imports a room above it.
No file of the package has more than 700 lines.

The rooms, from the ground up (a room may import its own floor and those below):

    foundation  errors, limits, util/, backend_lookup, engine, precision, float_images, augmentation, tensor, io/
    backends/   host (NumPy) and cuda (cuBLAS, cuDNN, NVRTC, NCCL)
    layers/, data/
    optim/      optimisers, schedules, loss scaling
    config/     the schema, the reader, overrides, shipped configs
    inference, interop/
    network
    train/      setup, trainer, checks, outputs, several GPUs
    benchmark/
    cli/
"""

from __future__ import annotations

import ast
from pathlib import Path

import cudnnnet

PACKAGE = Path(cudnnnet.__file__).parent

FLOORS = [
    {"cudnnnet.errors", "cudnnnet.limits", "cudnnnet.util", "cudnnnet.backend_lookup", "cudnnnet.engine", "cudnnnet.precision",
     "cudnnnet.float_images", "cudnnnet.augmentation", "cudnnnet.tensor", "cudnnnet.io"},
    {"cudnnnet.backends"},
    {"cudnnnet.layers", "cudnnnet.data"},
    {"cudnnnet.optim"},
    {"cudnnnet.config"},
    {"cudnnnet.inference", "cudnnnet.interop"},
    {"cudnnnet.network"},
    {"cudnnnet.train"},
    {"cudnnnet.benchmark"},
    {"cudnnnet.cli"},
]


def module_name(path: Path) -> str:
    parts = ["cudnnnet", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(node: ast.AST, package: str, modules: set[str]) -> set[str]:
    """The package's modules that one import statement names (the longest that exists)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    if not isinstance(node, ast.ImportFrom):
        return set()
    if node.level:
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    found = {f"{target}.{alias.name}" for alias in node.names} & modules
    return found or ({target} & modules)


def all_imports() -> dict[str, set[str]]:
    """Each module → the package's modules it imports anywhere in its code."""
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    modules = set(paths)
    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        graph[name] = set().union(*(imported_modules(node, package, modules)
                                    for node in ast.walk(ast.parse(path.read_text()))))
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


def floor_of(module: str) -> int | None:
    """The floor of a module's room (None: the package's face, ``cudnnnet`` itself)."""
    for number, rooms in enumerate(FLOORS):
        if any(module == room or module.startswith(room + ".") for room in rooms):
            return number
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs where a module imports one on a higher floor."""
    upward = []
    for name, imported in graph.items():
        here = floor_of(name)
        for other in imported:
            there = floor_of(other)
            if here is not None and there is not None and there > here:
                upward.append((name, other))
    return sorted(upward)


def test_no_module_imports_one_that_imports_it_back():
    assert cycles(all_imports()) == []


def test_the_cycle_check_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) != []


def test_every_module_has_a_floor():
    assert [name for name in all_imports() if name != "cudnnnet" and floor_of(name) is None] == []


def test_no_module_imports_a_room_above_its_own():
    assert upward_imports(all_imports()) == []


def test_the_floor_check_finds_an_import_upward():
    assert upward_imports({"cudnnnet.tensor": {"cudnnnet.network"}, "cudnnnet.network": {"cudnnnet.tensor"}}) \
        == [("cudnnnet.tensor", "cudnnnet.network")]


def test_imports_inside_functions_are_read(tmp_path):
    source = "def load():\n    from ..train import trainer\n"
    tree = ast.parse(source)
    found = set().union(*(imported_modules(node, "cudnnnet.network_pkg", {"cudnnnet.train.trainer"})
                          for node in ast.walk(tree)))
    assert found == {"cudnnnet.train.trainer"}


def test_no_backend_imports_the_data_sets():
    graph = all_imports()
    below = {name: sorted(dep for dep in deps if dep.startswith("cudnnnet.data"))
             for name, deps in graph.items() if name.startswith("cudnnnet.backends")}
    assert {name: deps for name, deps in below.items() if deps} == {}


MAX_MODULE_LINES = 700  # a room a reader takes in; a longer one is split by what it holds


def long_modules(package: Path, limit: int = MAX_MODULE_LINES) -> dict[str, int]:
    """The package's .py files of more than ``limit`` lines → their line counts."""
    counts = {str(path.relative_to(package)): len(path.read_text().splitlines()) for path in package.rglob("*.py")}
    return {name: count for name, count in counts.items() if count > limit}


def test_no_package_file_is_over_700_lines():
    assert long_modules(PACKAGE) == {}


def test_the_length_check_finds_a_long_file(tmp_path):
    (tmp_path / "rooms").mkdir()
    (tmp_path / "rooms" / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (tmp_path / "short.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    assert long_modules(tmp_path) == {"rooms/long.py": MAX_MODULE_LINES + 1}
