"""The package's import graph: no cycles, and the cost side never imports keras or a backend.

The graph is read from the source (the AST of every module, `import x` and
`from x import y`, inside functions too), so an import deferred into a function to dodge
a cycle is still an edge and still fails here.
"""

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from keras_mha.moved_paths import MOVED_MODULES, MOVED_NAMES

pytestmark = pytest.mark.backend_independent

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "keras_mha"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE_ROOT.rglob("*.py"))}


@functools.cache
def _syntax_tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def import_statements(name: str, path: Path) -> list[tuple[str, str | None]]:
    """Every import in the module's source as (module, name): `import a.b` is ("a.b", None),
    `from a import b` is ("a", "b"); relative imports resolved against the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(_syntax_tree(path)):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found += [(base, alias.name) for alias in node.names]
    return found


def imported_modules(name: str, path: Path, modules) -> set[str]:
    """The package's modules that `name` imports anywhere in its source (parents of a
    module imported by its full name are not counted: importing `a.b.c` runs `a/__init__`,
    which is not an import *by* this module)."""
    found = set()
    for module, imported_name in import_statements(name, path):
        submodule = f"{module}.{imported_name}"
        found.add(submodule if imported_name and submodule in modules else module)
    return {imported for imported in found if imported in modules and imported != name}


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each as a list."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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


def test_the_graph_reader_sees_deferred_and_relative_imports(tmp_path):
    modules = {"keras_mha.a", "keras_mha.b", "keras_mha.c", "keras_mha.d"}
    source = tmp_path / "a.py"
    source.write_text(
        "from keras_mha import b\n"
        "def f():\n"
        "    from .c import thing\n"
        "    import keras_mha.d\n"
        "    import json\n"
    )
    assert imported_modules("keras_mha.a", source, modules) == {
        "keras_mha.b",
        "keras_mha.c",
        "keras_mha.d",
    }
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_no_import_cycles_in_the_package():
    assert cycles(import_graph()) == []


def folder(module: str) -> str:
    """The folder a module lives in, one level below the package: `keras_mha.planning.plan`
    is in `keras_mha.planning`; a top-level module (`keras_mha.errors`) is its own."""
    return ".".join(module.split(".")[:2])


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph drawn between folders (the package's own `__init__`, which exports
    from every folder lazily, left out)."""
    folders: dict[str, set[str]] = {}
    for module, imported in graph.items():
        if module == "keras_mha":
            continue
        source = folders.setdefault(folder(module), set())
        source.update(folder(target) for target in imported if target != "keras_mha")
    for source, targets in folders.items():
        targets.discard(source)
    return folders


def test_the_folder_graph_reader_sees_a_cycle_through_deferred_imports():
    graph = {"keras_mha.a.x": {"keras_mha.b.y"}, "keras_mha.b.y": set(),
             "keras_mha.b.z": {"keras_mha.a.w"}, "keras_mha.a.w": set()}  # fmt: skip
    assert cycles(folder_graph(graph)) == [["keras_mha.a", "keras_mha.b"]]


def test_no_import_cycles_between_folders():
    # Imports inside functions count: a deferred import still makes the folders depend on
    # each other. `backends/` sits at the bottom, as Keras's backend does: the layers and
    # models ask it, it imports neither.
    assert cycles(folder_graph(import_graph())) == []


def test_the_backends_import_nothing_above_them():
    # The layers, models and pruning call `backends.current()`; what a backend needs of
    # them lives in `backends/common/` or comes as an argument.
    above = {"layers", "models", "pruning", "analysis", "distribution", "conversion"}
    imported = folder_graph(import_graph())["keras_mha.backends"]
    assert sorted(imported & {f"keras_mha.{name}" for name in above}) == []


def test_only_the_command_line_imports_commands():
    graph = import_graph()
    upward = sorted(
        f"{module} imports {target}"
        for module, imported in graph.items()
        for target in imported
        if folder(target) == "keras_mha.commands"
        and folder(module) not in ("keras_mha.commands", "keras_mha.cli")
    )
    assert upward == []


def test_nothing_in_the_checkout_imports_through_a_moved_path():
    root = PACKAGE_ROOT.parent
    sources = [root / folder for folder in ("keras_mha", "benchmarks", "tools")]
    through_old_paths = [
        f"{path.relative_to(root)}: {module}{'.' + name if name else ''}"
        for folder in sources
        for path in sorted(folder.rglob("*.py"))
        for module, name in import_statements(module_name(path), path)
        if module in MOVED_MODULES or name in MOVED_NAMES.get(module, {})
    ]
    assert through_old_paths == []


# -- the cost side: no keras, no backend -----------------------------------------------------

HEAVY = ["keras", "tensorflow", "jax", "torch", "transformers", "numpy", "huggingface_hub"]
# `typing` costs a few ms at import; inspect's start-up does without it.
STARTUP_HEAVY = [*HEAVY, "typing"]
# `keras-mha inspect`'s side of the package: every module of these is imported.
COST_SIDE = ("keras_mha.hub", "keras_mha.planning.planner", "keras_mha.planning.render")
COST_SIDE_MODULES = (
    "keras_mha.planning",
    "keras_mha.planning.spec",
    "keras_mha.planning.costs",
    "keras_mha.planning.plan",
)

_PROBE = """
import importlib, json, sys
from keras_mha.cli import main
exit_code = main(["inspect", "bundled:meta-llama/Meta-Llama-3-8B", "--gpu", "H100",
                  "--format", "json"])
after_inspect = sorted({{name.split(".")[0] for name in sys.modules}} & set({startup_heavy!r}))
import pkgutil
for package in {packages!r}:
    module = importlib.import_module(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        importlib.import_module(info.name)
for name in {modules!r}:
    importlib.import_module(name)
heavy = sorted({{name.split(".")[0] for name in sys.modules}} & set({heavy!r}))
sys.stderr.write(json.dumps({{"exit_code": exit_code, "inspect": after_inspect, "all": heavy}}))
"""


def test_the_cost_side_and_inspect_import_no_keras_backend_or_hub():
    # A DeprecationWarning is an error: the new paths never go through a moved one.
    probe = _PROBE.format(
        packages=COST_SIDE, modules=COST_SIDE_MODULES, heavy=HEAVY, startup_heavy=STARTUP_HEAVY
    )
    completed = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
    )
    result = json.loads(completed.stderr.splitlines()[-1])
    assert result == {"exit_code": 0, "inspect": [], "all": []}


# -- backend code lives in keras_mha/backends ----------------------------------------------

BACKEND_PACKAGES = ("torch", "jax", "jaxlib", "tensorflow")
# Modules outside `keras_mha/backends/` that may import a backend or Keras's private
# modules, and why. Everything else asks `keras_mha.backends`.
BACKEND_CODE_ELSEWHERE = {
    # Variables created without memory and filled later: Keras has no public API for it;
    # the code reads Keras's own deferred-variable list, the same on every backend.
    "keras_mha.models.deferred": {"keras.src.backend.common"},
}


def _imports_backend_code(name: str, path: Path) -> set[str]:
    """The backend packages and private Keras modules that `name` imports anywhere."""
    found = set()
    for module, imported_name in import_statements(name, path):
        top = module.split(".")[0]
        if top in BACKEND_PACKAGES:
            found.add(top)
        elif module.startswith("keras.src"):
            found.add(module)
        elif module == "keras" and imported_name == "src":
            found.add("keras.src")
    return found


def _asks_keras_backend(path: Path) -> bool:
    """Whether the module calls `keras.backend.backend()` (docstrings are not code)."""
    for node in ast.walk(_syntax_tree(path)):
        function = getattr(node, "func", None) if isinstance(node, ast.Call) else None
        if (
            isinstance(function, ast.Attribute)
            and function.attr == "backend"
            and isinstance(function.value, ast.Attribute)
            and function.value.attr == "backend"
            and isinstance(function.value.value, ast.Name)
            and function.value.value.id == "keras"
        ):
            return True
    return False


def test_only_keras_mha_backends_asks_which_backend_runs_or_imports_one():
    outside = {
        name: path
        for name, path in package_modules().items()
        if not (name == "keras_mha.backends" or name.startswith("keras_mha.backends."))
    }
    asking = sorted(name for name, path in outside.items() if _asks_keras_backend(path))
    importing = {
        name: found - BACKEND_CODE_ELSEWHERE.get(name, set())
        for name, path in outside.items()
        for found in [_imports_backend_code(name, path)]
    }
    assert asking == []
    assert {name: found for name, found in importing.items() if found} == {}
    unused = {
        n
        for n, allowed in BACKEND_CODE_ELSEWHERE.items()
        if n not in outside or not (_imports_backend_code(n, outside[n]) & allowed)
    }
    assert unused == set()  # an exception nobody needs any more is removed


def test_the_backend_code_test_sees_what_it_looks_for(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text(
        '"""keras.backend.backend() in a docstring is not code."""\n'
        "import keras\n"
        "def f():\n"
        "    import torch.nn.functional\n"
        "    from keras.src.backend import get_autocast_scope\n"
        "    return keras.backend.backend()\n"
    )
    assert _asks_keras_backend(source)
    found = _imports_backend_code("keras_mha.probe", source)
    assert found == {"torch", "keras.src.backend"}
    plain = tmp_path / "plain.py"  # another path: syntax trees are cached by path
    plain.write_text('"""keras.backend.backend()"""\nimport numpy\n')
    assert not _asks_keras_backend(plain)
    assert _imports_backend_code("keras_mha.plain", plain) == set()


def test_every_backend_module_defines_the_whole_interface():
    from keras_mha import backends

    for backend in ("jax", "tensorflow", "torch"):
        path = PACKAGE_ROOT / "backends" / backend / "__init__.py"
        tree = _syntax_tree(path)
        defined = {
            target.id
            for node in tree.body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        } | {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert sorted(set(backends.INTERFACE) - defined) == [], backend
