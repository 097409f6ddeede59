"""`convert_attention`: every keras-mha attention layer of a model to fewer KV heads.

Example:
    >>> from keras_mha.models import from_pretrained
    >>> model = from_pretrained("path/to/llama-2-style-mha")  # doctest: +SKIP
    >>> convert_attention(model, 8, method="mean")  # doctest: +SKIP
    >>> model.save("gqa.keras")  # doctest: +SKIP
"""

from __future__ import annotations

from keras_mha.errors import PruningError
from keras_mha.layers.kv_conversion import check_kv_conversion


def check_conversion(model, num_key_value_heads, method="mean"):
    """The attention layers of `model` as `{path: layer}`, once every one can be converted.

    Raises:
        PruningError: no keras-mha attention layer, an unbuilt one, or a count or method
            some layer cannot take (the message names the layer).

    Example:
        >>> list(check_conversion(model, 4))  # doctest: +SKIP
        ['block_0/attention', 'block_1/attention']
    """
    from keras_mha.pruning.discovery import require_attention_layers

    try:
        layers = require_attention_layers(model)
    except ValueError as error:
        raise PruningError(str(error), key="model") from None
    for path, layer in layers.items():
        check_kv_conversion(layer, num_key_value_heads, method, where=path)
    return layers


def convert_attention(model, num_key_value_heads, *, method="mean", recompile=True):
    """Convert every keras-mha attention layer of `model` to `num_key_value_heads` KV heads.

    Works on whole models from `keras_mha.models.from_pretrained` and on any Keras
    model (functional, `Sequential`, subclassed) holding keras-mha attention layers.
    Each layer's key/value heads are pooled in groups (see
    `GroupedQueryAttention.convert_kv_heads`): `1` gives multi-query attention, a
    count equal to today's changes nothing. Every layer is checked before any
    changes, so on error the model is untouched. Head gates, RoPE, q/k norms, biases,
    sliding windows and the KV cache keep working, and `.keras` save/load keeps the
    new shapes. A compiled model is compiled again with a fresh optimizer of the
    same configuration (its slot variables had the old shapes); pass
    `recompile=False` to leave that to you.

    Args:
        model: a built Keras model (or a single attention layer).
        num_key_value_heads: KV heads per layer after conversion; a divisor of each
            layer's current count.
        method: `"mean"` (Ainslie et al. 2023), `"first"` or `"regroup"`.
        recompile: compile a compiled model again (see above).

    Returns:
        `model`, converted in place.

    Raises:
        PruningError: see `check_conversion`.

    Example:
        >>> inputs = keras.Input((16, 64))
        >>> outputs = MultiHeadAttention(8, causal=True)(inputs)
        >>> model = convert_attention(keras.Model(inputs, outputs), 2)
        >>> model.layers[1].num_key_value_heads
        2
    """
    from keras_mha.pruning.gates import sync_training_state
    from keras_mha.pruning.surgery import check_flag, variables_replaced

    check_flag("recompile", recompile)
    layers = check_conversion(model, num_key_value_heads, method)
    sync_training_state(model)
    with variables_replaced(model, recompile=recompile):
        for layer in layers.values():
            layer.convert_kv_heads(int(num_key_value_heads), method=method)
    return model
