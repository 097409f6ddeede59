"""The family registry: one module per model family, each holding everything as data.

Every module of this package whose name does not start with `_` is a family module,
named after its `model_type` (`-` written `_`), and defines `FAMILY = Family(...)`: its
config keys and defaults, validation hooks, block traits, checkpoint tensor names,
export rule and, for multimodal wrappers, the vision side (see `_family.Family`). A new
family is one new file (docs/guides/adding-a-family.md). Nothing here imports keras or
NumPy: `keras-mha inspect` reads it.

`family_for(model_type)` imports only the module named after the model type; the other
modules are read when asked for all families (`all_families()`) or for a model type
that is an alias (Falcon's `RefinedWeb`) or unknown, so `inspect` stays fast.

Example:
    >>> from keras_mha.families import family_for
    >>> family_for("gpt_neox").blocks.kind, family_for("RefinedWeb").name
    ('decoder', 'falcon')
    >>> family_for("t5").blocks is None  # described by `inspect`, not built
    True
"""

from __future__ import annotations

import os
from importlib import import_module

from keras_mha.families._family import Blocks, Family, Wrapper, read_family
from keras_mha.families._vision import VISION_TOWER_DEFAULTS, VISION_TOWER_LAYOUTS, VisionLayout

GENERIC_NAME = "generic"

# model_type (aliases included) -> family, for the modules imported so far.
_LOADED: dict[str, Family] = {}
_ALL_LOADED = False


def family_module_names() -> tuple[str, ...]:
    """The family modules of this package (every `*.py` not starting with `_`), sorted.

    Example:
        >>> "llama" in family_module_names() and "_family" not in family_module_names()
        True
    """
    directory = os.path.dirname(__file__)
    return tuple(
        sorted(
            name[:-3]
            for name in os.listdir(directory)
            if name.endswith(".py") and not name.startswith("_")
        )
    )


def module_name(model_type: str) -> str:
    """The module a family of this name lives in (`xlm-roberta` -> `xlm_roberta`).

    Example:
        >>> module_name("xlm-roberta")
        'xlm_roberta'
    """
    return model_type.replace("-", "_")


def module_family(module) -> Family:
    """The `FAMILY` a family module defines (TypeError when it defines none)."""
    family = getattr(module, "FAMILY", None)
    if not isinstance(family, Family):
        raise TypeError(
            f"{module.__name__}: a family module defines FAMILY = Family(...); see "
            f"docs/guides/adding-a-family.md"
        )
    return family


def _load(name: str) -> Family | None:
    """Import family module `name` and register its model types; None when there is none."""
    full_name = f"{__name__}.{name}"
    try:
        module = import_module(full_name)
    except ModuleNotFoundError as error:
        if error.name != full_name:
            raise
        return None
    family = module_family(module)
    for model_type in family.model_types:
        claimed = _LOADED.setdefault(model_type, family)
        if claimed is not family:
            raise RuntimeError(
                f"model_type {model_type!r} is claimed by families {claimed.name!r} and "
                f"{family.name!r}"
            )
    return family


def all_families() -> dict[str, Family]:
    """Every `model_type` keras-mha knows (aliases included) -> its family.

    Example:
        >>> all_families()["RefinedWebModel"].name
        'falcon'
    """
    global _ALL_LOADED
    if not _ALL_LOADED:
        for name in family_module_names():
            _load(name)
        _ALL_LOADED = True
    return dict(_LOADED)


def family_for(model_type: str) -> Family | None:
    """The family that reads `model_type` (an alias included), or None when unknown.

    Example:
        >>> family_for("xlm-roberta").name, family_for("no-such-model") is None
        ('xlm-roberta', True)
    """
    if not isinstance(model_type, str):
        return None
    if model_type not in _LOADED and not _ALL_LOADED:
        name = module_name(model_type)
        # Only a plain, public module name is tried: a config's model_type is untrusted.
        if name.isidentifier() and not name.startswith("_"):
            _load(name)
        if model_type not in _LOADED:
            all_families()
    return _LOADED.get(model_type)


def generic_family() -> Family:
    """The fallback for a model type no family claims (read with every spelling)."""
    return family_for(GENERIC_NAME)


def unique_families() -> list[Family]:
    """Every registered family once (aliases collapsed), in module order.

    Example:
        >>> len({family.name for family in unique_families()}) == len(unique_families())
        True
    """
    seen: dict[str, Family] = {}
    for family in all_families().values():
        seen.setdefault(family.name, family)
    return list(seen.values())


def __getattr__(name):
    # Whole-registry views, computed on first use (importing every module costs `inspect`).
    if name == "FAMILIES":
        return all_families()
    if name == "KNOWN_MODEL_TYPES":
        return frozenset(all_families()) - {GENERIC_NAME}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FAMILIES",
    "GENERIC_NAME",
    "KNOWN_MODEL_TYPES",
    "VISION_TOWER_DEFAULTS",
    "VISION_TOWER_LAYOUTS",
    "VisionLayout",
    "Blocks",
    "Family",
    "Wrapper",
    "all_families",
    "family_for",
    "family_module_names",
    "generic_family",
    "module_family",
    "module_name",
    "read_family",
    "unique_families",
]
