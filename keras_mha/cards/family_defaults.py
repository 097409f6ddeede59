"""Deprecated: each family's defaults moved to its module (`Family.defaults` in
`keras_mha.families`); vision towers' to `keras_mha.families.VISION_TOWER_DEFAULTS`.

This module rebuilds the 0.2 mapping from them until 0.4.
"""

from keras_mha._deprecation import warn_moved
from keras_mha.families import FAMILIES, VISION_TOWER_DEFAULTS
from keras_mha.families.dbrx import DBRX_ATTN_DEFAULTS

warn_moved("keras_mha.cards.family_defaults", "keras_mha.families.family_for(t).defaults")

FAMILY_DEFAULTS = {
    **{name: dict(family.defaults) for name, family in FAMILIES.items() if family.defaults},
    **VISION_TOWER_DEFAULTS,
}

__all__ = ["DBRX_ATTN_DEFAULTS", "FAMILY_DEFAULTS"]
