"""The family registry: one module per model family, each holding everything as data.

Every module of this package whose name does not start with `_` is a family module and
defines `FAMILY = Family(...)` (or `FAMILIES = (...)`): its config keys and defaults,
validation hooks, block traits, checkpoint tensor names, export rule and, for
multimodal wrappers, the vision side (see `_family.Family`). The registry collects them
by listing the package, so a new family is one new file
(docs/guides/adding-a-family.md). Nothing here imports keras or NumPy: `keras-mha
inspect` reads it.

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
from keras_mha.families._vision import VISION_TOWER_DEFAULTS


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


def module_families(module) -> tuple[Family, ...]:
    """The families a family module defines (`FAMILY`, or the tuple `FAMILIES`)."""
    families = getattr(module, "FAMILIES", None)
    if families is None:
        families = (getattr(module, "FAMILY", None),)
    if not families or not all(isinstance(family, Family) for family in families):
        raise TypeError(
            f"{module.__name__}: a family module defines FAMILY = Family(...) or "
            f"FAMILIES = (Family(...), ...); see docs/guides/adding-a-family.md"
        )
    return tuple(families)


def _collect() -> dict[str, Family]:
    registry: dict[str, Family] = {}
    for name in family_module_names():
        for family in module_families(import_module(f"{__name__}.{name}")):
            for model_type in family.model_types:
                if model_type in registry:
                    raise RuntimeError(
                        f"model_type {model_type!r} is claimed by families "
                        f"{registry[model_type].name!r} and {family.name!r}"
                    )
                registry[model_type] = family
    return registry


# model_type (aliases included) -> its family.
FAMILIES: dict[str, Family] = _collect()
GENERIC = FAMILIES["generic"]
KNOWN_MODEL_TYPES = frozenset(FAMILIES) - {"generic"}


def family_for(model_type: str) -> Family | None:
    """The family that reads `model_type` (an alias included), or None when unknown.

    Example:
        >>> family_for("xlm-roberta").name, family_for("no-such-model") is None
        ('roberta', True)
    """
    return FAMILIES.get(model_type)


def unique_families() -> list[Family]:
    """Every registered family once (aliases collapsed), in module order.

    Example:
        >>> len({family.name for family in unique_families()}) == len(unique_families())
        True
    """
    seen: dict[str, Family] = {}
    for family in FAMILIES.values():
        seen.setdefault(family.name, family)
    return list(seen.values())


__all__ = [
    "FAMILIES",
    "GENERIC",
    "KNOWN_MODEL_TYPES",
    "VISION_TOWER_DEFAULTS",
    "Blocks",
    "Family",
    "Wrapper",
    "family_for",
    "family_module_names",
    "module_families",
    "read_family",
    "unique_families",
]
