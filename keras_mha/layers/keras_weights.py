"""Weight mapping between keras-mha layers and Keras's built-in attention layers.

`keras.layers.MultiHeadAttention` and `keras.layers.GroupQueryAttention`
(default `attention_axes`, no `use_gate`) hold four `EinsumDense` sublayers
whose kernels have exactly our shapes:

| keras built-in                 | keras-mha                        | shape                  |
|--------------------------------|----------------------------------|------------------------|
| `_query_dense.kernel` / `.bias` | `query_kernel` / `query_bias`   | `(F_q, H, D)` / `(H, D)` |
| `_key_dense.kernel` / `.bias`   | `key_kernel` / `key_bias`       | `(F_k, Hkv, D)`        |
| `_value_dense.kernel` / `.bias` | `value_kernel` / `value_bias`   | `(F_v, Hkv, D)`        |
| `_output_dense.kernel` / `.bias`| `output_kernel` / `output_bias` | `(H, D, F_out)` / `(F_out,)` |

For `keras.layers.MultiHeadAttention`, `Hkv = H`. The KV-head order is the
same in both (query head `h` uses KV head `h // (H // Hkv)`), so the mapping
is a plain copy. Keras's built-ins have one `use_bias` for all four
projections; copying between layers whose bias settings differ is an error.
"""

from __future__ import annotations

from keras import ops

_PAIRS = (
    ("_query_dense", "query"),
    ("_key_dense", "key"),
    ("_value_dense", "value"),
    ("_output_dense", "output"),
)


def _check_compatible(keras_layer, layer):
    if not getattr(keras_layer, "built", False) or not layer.built:
        raise ValueError(
            "Both layers must be built before copying weights (call each once on data)."
        )
    if getattr(keras_layer, "_gate_dense", None) is not None:
        raise ValueError(
            "The Keras layer uses `use_gate=True`; keras-mha layers have no output gate."
        )
    for keras_name, ours in _PAIRS:
        dense = getattr(keras_layer, keras_name, None)
        if dense is None:
            raise ValueError(
                f"{type(keras_layer).__name__} has no `{keras_name}`; expected "
                "keras.layers.MultiHeadAttention or keras.layers.GroupQueryAttention."
            )
        our_kernel = getattr(layer, f"{ours}_kernel")
        if tuple(dense.kernel.shape) != tuple(our_kernel.shape):
            raise ValueError(
                f"`{keras_name}.kernel` has shape {tuple(dense.kernel.shape)} but "
                f"`{ours}_kernel` has shape {tuple(our_kernel.shape)}: build both layers with "
                "the same heads, head size and feature sizes (and default attention_axes)."
            )
        our_bias = getattr(layer, f"{ours}_bias", None)
        if (dense.bias is None) != (our_bias is None):
            raise ValueError(
                f"`{keras_name}` {'has' if dense.bias is not None else 'has no'} bias but "
                f"`{ours}_bias` {'exists' if our_bias is not None else 'does not exist'}: "
                "set use_bias / use_output_bias to match the Keras layer's use_bias."
            )


def copy_weights_from_keras(keras_layer, layer):
    """Copy a built `keras.layers.MultiHeadAttention` / `GroupQueryAttention` into `layer`.

    Example:
        >>> ref = keras.layers.GroupQueryAttention(head_dim=8, num_query_heads=4,
        ...                                        num_key_value_heads=2)
        >>> x = keras.random.normal((1, 5, 16)); _ = ref(x, x)
        >>> ours = GroupedQueryAttention(4, 2, head_dim=8); _ = ours(x)
        >>> copy_weights_from_keras(ref, ours)
    """
    _check_compatible(keras_layer, layer)
    for keras_name, ours in _PAIRS:
        dense = getattr(keras_layer, keras_name)
        getattr(layer, f"{ours}_kernel").assign(ops.convert_to_numpy(dense.kernel))
        if dense.bias is not None:
            getattr(layer, f"{ours}_bias").assign(ops.convert_to_numpy(dense.bias))


def copy_weights_to_keras(layer, keras_layer):
    """Copy `layer`'s projections into a built Keras built-in attention layer.

    Head gates are not part of Keras's layers: only an ungated layer (all
    gates 1) maps exactly; a gated one raises.

    Example:
        >>> ours = GroupedQueryAttention(4, 2, head_dim=8); ours.build((None, None, 16))
        >>> ref = keras.layers.GroupQueryAttention(head_dim=8, num_query_heads=4,
        ...                                        num_key_value_heads=2)
        >>> x = keras.random.normal((1, 5, 16)); _ = ref(x, x)
        >>> copy_weights_to_keras(ours, ref)
    """
    _check_compatible(keras_layer, layer)
    gates = ops.convert_to_numpy(layer.head_gates)
    if not (gates == 1).all():
        raise ValueError(
            f"`layer` has head gates {gates.tolist()}; Keras's layers have none. Remove the "
            "gated heads with `layer.prune_heads(...)` first."
        )
    for keras_name, ours in _PAIRS:
        dense = getattr(keras_layer, keras_name)
        dense.kernel.assign(ops.convert_to_numpy(getattr(layer, f"{ours}_kernel")))
        if dense.bias is not None:
            dense.bias.assign(ops.convert_to_numpy(getattr(layer, f"{ours}_bias")))
