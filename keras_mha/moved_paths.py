"""Import paths that moved in keras-mha 0.3, kept working for one release with a warning.

`MOVED_MODULES` maps each old module path to its new one: `import keras_mha.cards.hub`
still works, warns once (`DeprecationWarning` naming the new path) and gives the new
module itself, so `keras_mha.cards.hub.load_config is keras_mha.hub.load_config`.
`MOVED_NAMES` does the same for names a package or module exported
(`from keras_mha.cards import load_config`); the module's `__getattr__` calls
`moved_attribute`. Both tables are removed in keras-mha 0.4; import from the new paths.

Example:
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     from keras_mha.cards import load_config
    >>> str(caught[0].message).split(";")[0]
    'keras_mha.cards.load_config moved to keras_mha.hub.load_config'
"""

from __future__ import annotations

import importlib
import sys
import warnings
from importlib.machinery import ModuleSpec

REMOVED_IN = "0.4"

MOVED_MODULES = {
    "keras_mha.cards.hub": "keras_mha.hub.config",
    "keras_mha.cards.hub_cache": "keras_mha.hub.cache",
    "keras_mha.cards.hub_fetch": "keras_mha.hub.fetch",
    "keras_mha.cards.hub_files": "keras_mha.hub.files",
    "keras_mha.cards.hub_inputs": "keras_mha.hub.inputs",
    "keras_mha.cards.bundled": "keras_mha.hub.bundled",
    "keras_mha.cards.config_json": "keras_mha.hub.config_json",
    "keras_mha.cards.memory": "keras_mha.cards.planner.memory",
    "keras_mha.cards.gpus": "keras_mha.cards.planner.gpus",
    "keras_mha.cards.units": "keras_mha.cards.planner.units",
    "keras_mha.cards.report": "keras_mha.cards.rendering.report",
    "keras_mha.cards.memory_report": "keras_mha.cards.rendering.memory_report",
    "keras_mha.cards.families": "keras_mha.families",
    "keras_mha.cards.rebuild": "keras_mha.models.rebuild",
    "keras_mha.cards.checkpoint_weights": "keras_mha.models.checkpoint_weights",
}

# module -> {name: the module that holds it now}
MOVED_NAMES = {
    "keras_mha.cards": {
        "LoadedConfig": "keras_mha.hub",
        "bundled_config_path": "keras_mha.hub",
        "list_bundled": "keras_mha.hub",
        "load_config": "keras_mha.hub",
        "build_attention": "keras_mha.models",
        "load_attention_weights": "keras_mha.models",
    },
    "keras_mha.cli": {
        "parse_seq_lens": "keras_mha.commands.inspect",
        "write_stdout": "keras_mha.commands.output",
    },
}


def _warn(old: str, new: str, stacklevel: int) -> None:
    warnings.warn(
        f"{old} moved to {new}; import it from there ({old} is removed in keras-mha {REMOVED_IN})",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


def warn_rebuilt(old: str, new: str) -> None:
    """The warning of an old module kept as a file because it rebuilds its 0.2 tables from
    the new modules (`keras_mha.cards.family_defaults`, `keras_mha.models.families`), or of
    such a rebuilt name; `new` says where the data lives now.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_rebuilt("keras_mha.cards.family_defaults", "keras_mha.families")
        >>> str(caught[0].message).split(";")[0]
        'keras_mha.cards.family_defaults moved to keras_mha.families'
    """
    _warn(old, new, stacklevel=3)


def moved_attribute(module_name: str, name: str):
    """`getattr` for a name that moved out of `module_name`: warn and return it from its new
    module; AttributeError (as Python words it) for any other name.

    Example:
        >>> moved_attribute("keras_mha.cards", "no_such_name")
        Traceback (most recent call last):
        ...
        AttributeError: module 'keras_mha.cards' has no attribute 'no_such_name'
    """
    new_module = MOVED_NAMES.get(module_name, {}).get(name)
    if new_module is None:
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
    _warn(f"{module_name}.{name}", f"{new_module}.{name}", stacklevel=3)
    return getattr(importlib.import_module(new_module), name)


class _MovedModuleFinder:
    """Finds the old module paths (nothing exists at them any more) and loads each as its
    new module. Appended to `sys.meta_path`, so it is asked only after the real files."""

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
        sys.meta_path.append(_MovedModuleFinder())
