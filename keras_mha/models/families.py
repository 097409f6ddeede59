"""Deprecated: each family's block traits moved to its module in `keras_mha.families`
(`Family.blocks`), the checks to `keras_mha.models.supported`. Re-exported until 0.4.
"""

from keras_mha.families import Blocks as FamilyTraits
from keras_mha.families import unique_families
from keras_mha.models.supported import ACTIVATIONS, activation_name, built_family
from keras_mha.moved_paths import warn_rebuilt

warn_rebuilt("keras_mha.models.families", "keras_mha.families (each Family.blocks)")

FAMILY_TRAITS = {family.name: family.blocks for family in unique_families() if family.blocks}


def traits_for(spec) -> FamilyTraits:
    """The block traits of `spec`'s family (`built_family(spec).blocks`)."""
    return built_family(spec).blocks


__all__ = ["ACTIVATIONS", "FAMILY_TRAITS", "FamilyTraits", "activation_name", "traits_for"]
