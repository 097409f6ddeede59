"""Deprecated: moved to `keras_mha.models.rebuild` (it builds keras layers, which the
cost side never imports). Re-exported until 0.4.
"""

from keras_mha._deprecation import warn_moved
from keras_mha.models.rebuild import (
    ATTENTION_PARTS,
    attention_layer_arguments,
    attention_layer_class,
    build_attention,
)

warn_moved("keras_mha.cards.rebuild", "keras_mha.models.rebuild")

__all__ = [
    "ATTENTION_PARTS",
    "attention_layer_arguments",
    "attention_layer_class",
    "build_attention",
]
