"""Attention layers that run unchanged on TensorFlow, JAX and PyTorch.

Example:
    >>> from keras_mha.layers import GroupedQueryAttention
    >>> layer = GroupedQueryAttention(num_heads=8, num_key_value_heads=2)
"""

from keras_mha.layers.grouped_query_attention import GroupedQueryAttention
from keras_mha.layers.keras_weights import copy_weights_from_keras, copy_weights_to_keras
from keras_mha.layers.multi_head_attention import MultiHeadAttention
from keras_mha.layers.multi_query_attention import MultiQueryAttention
from keras_mha.layers.rotary_embedding import RotaryEmbedding

ATTENTION_LAYER_CLASSES = (GroupedQueryAttention,)

__all__ = [
    "GroupedQueryAttention",
    "MultiHeadAttention",
    "MultiQueryAttention",
    "RotaryEmbedding",
    "copy_weights_from_keras",
    "copy_weights_to_keras",
]
