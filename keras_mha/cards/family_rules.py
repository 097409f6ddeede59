"""Deprecated: the shared config rules moved to `keras_mha.families._rules`, each
family's hooks to its own module in `keras_mha.families`. Re-exported until 0.4.
"""

from keras_mha._deprecation import warn_moved
from keras_mha.families._rules import (
    LAYER_TYPE_KINDS,
    MOE_RULES,
    derived_head_dim,
    repeat_pattern,
    rope_fields,
    window_layer_kinds,
)
from keras_mha.families.falcon import FALCON_ALIASES

warn_moved("keras_mha.cards.family_rules", "keras_mha.families")

__all__ = [
    "FALCON_ALIASES",
    "LAYER_TYPE_KINDS",
    "MOE_RULES",
    "derived_head_dim",
    "repeat_pattern",
    "rope_fields",
    "window_layer_kinds",
]
