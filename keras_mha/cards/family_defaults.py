"""Deprecated: each family's defaults moved to its module (`Family.defaults` in
`keras_mha.families`); vision towers' to `keras_mha.families.VISION_TOWER_DEFAULTS`.

This module rebuilds the 0.2 mapping from them until 0.4.
"""

from keras_mha.families import VISION_TOWER_DEFAULTS, all_families
from keras_mha.families.dbrx import DBRX_ATTN_DEFAULTS
from keras_mha.moved_paths import warn_rebuilt

warn_rebuilt("keras_mha.cards.family_defaults", "keras_mha.families (each Family.defaults)")

FAMILY_DEFAULTS = {
    **{name: dict(family.defaults) for name, family in all_families().items() if family.defaults},
    **VISION_TOWER_DEFAULTS,
}

__all__ = ["DBRX_ATTN_DEFAULTS", "FAMILY_DEFAULTS"]
