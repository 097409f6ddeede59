"""Floating-point operations of attention layers, to show what pruning saves."""

from __future__ import annotations

from keras_mha.layers import ATTENTION_LAYER_CLASSES
from keras_mha.layers.validation import positive_int
from keras_mha.pruning.discovery import require_attention_layers


def attention_flops(layer, query_length, key_length=None):
    """FLOPs of one forward call of one attention layer, for one example.

    Counts multiply-adds as 2 FLOPs in the five matrix products, from the
    layer's current (physical) head counts: the query projection
    `2 T F_q H D`, the key and value projections `2 S (F_k + F_v) Hkv D`, the
    logits `2 H T S D`, the weighted sum of values `2 H T S D` and the output
    projection `2 T H D F_out`. Softmax, biases, masks and gates are left out
    (they are `O(H T S)` and `O(T F)`, small next to these). Gated-off heads
    still count: only physical removal saves FLOPs.

    Args:
        layer: a built `GroupedQueryAttention` (or subclass).
        query_length: `T`.
        key_length: `S`; default `T` (self-attention).

    Example:
        >>> layer = MultiHeadAttention(num_heads=4); layer.build((None, None, 32))
        >>> attention_flops(layer, query_length=10)
        94720
    """
    if not isinstance(layer, ATTENTION_LAYER_CLASSES) or not layer.built:
        raise ValueError(f"`layer` must be a built keras-mha attention layer; received {layer!r}.")
    query_length = positive_int("query_length", query_length)
    key_length = query_length if key_length is None else positive_int("key_length", key_length)
    heads, kv_heads, head_dim = layer.num_heads, layer.num_key_value_heads, layer.head_dim
    output_dim = layer.output_dim or layer._query_features
    projections = 2 * query_length * layer._query_features * heads * head_dim
    projections += (
        2 * key_length * (layer._key_features + layer._value_features) * kv_heads * head_dim
    )
    attention = 2 * 2 * heads * query_length * key_length * head_dim
    output = 2 * query_length * heads * head_dim * output_dim
    return projections + attention + output


def model_attention_flops(model, query_length, key_length=None):
    """Sum of `attention_flops` over every keras-mha attention layer of `model`.

    Assumes every layer sees sequences of the same length (true for encoder
    stacks). FLOPs of the other layers are not counted: pruning heads does not
    change them.

    Example:
        >>> from keras_mha.layers import MultiHeadAttention
        >>> inputs = keras.Input((8, 16))
        >>> model = keras.Model(inputs, MultiHeadAttention(4, name="attention")(inputs))
        >>> from keras_mha.pruning import prune_heads
        >>> before = model_attention_flops(model, query_length=8)
        >>> _ = prune_heads(model, heads={"attention": [0]})
        >>> model_attention_flops(model, query_length=8) < before
        True
    """
    return sum(
        attention_flops(layer, query_length, key_length)
        for layer in require_attention_layers(model).values()
    )
