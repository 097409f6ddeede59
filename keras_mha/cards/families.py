"""Deprecated: the family table moved to `keras_mha.families` (one module per family).

`keras_mha.families.all_families()` maps every `model_type` (aliases included) to its
`Family`; this module re-exports it as `FAMILIES`, with `Family` and `read_family`, until
0.4.
"""

from keras_mha._deprecation import warn_moved
from keras_mha.families import FAMILIES, Family, read_family

warn_moved("keras_mha.cards.families", "keras_mha.families")

__all__ = ["FAMILIES", "Family", "read_family"]
