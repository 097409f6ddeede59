"""Import paths that moved in keras-mha 0.4, kept working for one release with a warning.

`MOVED_MODULES` maps each old module path to its new one: `import keras_mha.cards.spec`
still works, warns once (`DeprecationWarning` naming the new path) and gives the new
module itself, so `keras_mha.cards.spec.from_config is keras_mha.planning.spec.from_config`.
`MOVED_NAMES` does the same for names a module exported that now live in another
module; the old module's `__getattr__` calls `moved_attribute`. Both tables are removed
in keras-mha 0.5; import from the new paths.

Example:
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     from keras_mha.cards.costs import kv_cache_cost
    >>> str(caught[-1].message).split(";")[0]
    'keras_mha.cards.costs moved to keras_mha.planning.costs'
"""

from __future__ import annotations

import importlib
import sys
import warnings
from importlib.machinery import ModuleSpec

REMOVED_IN = "0.5"

# The 0.3 package `keras_mha.cards` (spec, costs, planner, reports) is `keras_mha.planning`;
# its `rendering/` is `render/`. `keras-mha cards` and the repository's `cards/` keep the name.
_PLANNING_MODULES = (
    "", ".config_values", ".costs", ".errors", ".plan", ".spec",
    ".planner", ".planner.devices", ".planner.gpus", ".planner.inventory", ".planner.memory",
    ".planner.placement", ".planner.quantization", ".planner.serving", ".planner.speed",
    ".planner.suggestions", ".planner.units",
)  # fmt: skip
_RENDER_MODULES = ("", ".formatting", ".memory_report", ".report", ".text")

MOVED_MODULES = {
    **{f"keras_mha.cards{name}": f"keras_mha.planning{name}" for name in _PLANNING_MODULES},
    **{f"keras_mha.cards.rendering{name}": f"keras_mha.planning.render{name}"
       for name in _RENDER_MODULES},
    # Library code that lived in the command-line folder; `commands/` is the CLI only now.
    "keras_mha.commands.prune_data": "keras_mha.data.text",
    "keras_mha.commands.progress": "keras_mha.progress",
    # The KV cache's records and writes sit below the layers with the other tensor-level
    # pieces every backend shares (`KVCache` itself is what `init_cache` returns).
    "keras_mha.layers.kv_cache": "keras_mha.backends.common.kv_cache",
}  # fmt: skip

# module -> {name: the module that holds it now}
MOVED_NAMES = {
    "keras_mha.planning.render.memory_report": {
        "MemoryRequest": "keras_mha.planning.planner.request",
        "plan_format": "keras_mha.planning.planner.request",
    },
    "keras_mha.planning.render.report": {
        "DEFAULT_SEQ_LEN_CAP": "keras_mha.planning.plan",
        "context_length": "keras_mha.planning.plan",
        "default_seq_len": "keras_mha.planning.plan",
    },
}


def _warn(old: str, new: str, stacklevel: int) -> None:
    warnings.warn(
        f"{old} moved to {new}; import it from there ({old} is removed in keras-mha {REMOVED_IN})",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


def moved_attribute(module_name: str, name: str):
    """`getattr` for a name that moved out of `module_name`: warn and return it from its new
    module; AttributeError (as Python words it) for any other name.

    Example:
        >>> moved_attribute("keras_mha.hub", "no_such_name")
        Traceback (most recent call last):
        ...
        AttributeError: module 'keras_mha.hub' has no attribute 'no_such_name'
    """
    new_module = MOVED_NAMES.get(module_name, {}).get(name)
    if new_module is None:
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
    _warn(f"{module_name}.{name}", f"{new_module}.{name}", stacklevel=3)
    return getattr(importlib.import_module(new_module), name)


class _MovedModuleFinder:
    """Finds the old module paths (nothing exists at them any more) and loads each as its
    new module. First on `sys.meta_path`: an old path inside a moved package
    (`keras_mha.cards.planner`) would otherwise be found again, as a second copy of the new
    module, through the package's `__path__`. It answers for the old paths only."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED_MODULES:
            return ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):
        return None  # the default module; exec_module puts the new one in its place

    def exec_module(self, module):
        old, new = module.__name__, MOVED_MODULES[module.__name__]
        # The importer's frame is 2 up: the import system's own frames are skipped.
        _warn(old, new, stacklevel=2)
        # The import system returns what sys.modules holds after this call.
        sys.modules[old] = importlib.import_module(new)


def install() -> None:
    """Make the old module paths importable (done once, by `import keras_mha`).

    Example:
        >>> install()
        >>> sum(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path)
        1
    """
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModuleFinder())
