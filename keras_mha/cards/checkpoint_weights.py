"""Deprecated: moved to `keras_mha.models.checkpoint_weights` (it reads weights through
the family tables whole models use). Re-exported until 0.4; the 0.2 key-pattern
detection (`find_attention_tensors`) is replaced by `attention_tensors` there.
"""

from keras_mha._deprecation import warn_moved
from keras_mha.models.checkpoint_weights import (
    ATTENTION_PARTS,
    BUFFER_ALIGNMENT,
    CONFIG_FILE_NAME,
    INDEX_FILE_NAME,
    SAFETENSORS_DTYPES,
    SINGLE_FILE_NAME,
    CheckpointError,
    SafetensorsCheckpoint,
    aligned_empty,
    load_attention_weights,
)

warn_moved("keras_mha.cards.checkpoint_weights", "keras_mha.models.checkpoint_weights")

__all__ = [
    "ATTENTION_PARTS",
    "BUFFER_ALIGNMENT",
    "CONFIG_FILE_NAME",
    "INDEX_FILE_NAME",
    "SAFETENSORS_DTYPES",
    "SINGLE_FILE_NAME",
    "CheckpointError",
    "SafetensorsCheckpoint",
    "aligned_empty",
    "load_attention_weights",
]
