"""Keras's quantization contract on the attention layers, with Keras's own `Dense` doing the maths.

`model.quantize(mode)` calls `quantize` on every leaf layer. A quantized
`GroupedQueryAttention` moves each projection (query, key, value, output) into a
`keras.layers.Dense` over the flattened heads, `(features, heads * head_dim)`, copies
the float kernel and bias in, and calls that Dense's `quantize(mode, config=...)`: the
scales, packing, int8 / int4 / float8 matmuls, GPTQ and AWQ variables and their `.keras`
serialisation are Keras's, not a second copy. The layer's dtype policy becomes the
Dense's quantized policy (`layer.quantization_mode` reports the mode), so a `.keras`
file rebuilds the quantized projections in `build` and loads their variables.

What stays in float: RoPE (no weights), the q/k norm scales, the head gates, the
attention itself and the KV cache.

Example:
    >>> layer = GroupedQueryAttention(4, 2, head_dim=8)
    >>> layer.build((None, None, 32))
    >>> layer.quantize("int8")
    >>> layer.quantization_mode, str(layer.query_dense._kernel.dtype)
    ('int8', 'int8')
"""

from __future__ import annotations

import contextlib
import gc

import keras
from keras import ops

#: The projections of an attention layer, in the order their Dense layers are built.
PROJECTIONS = ("query", "key", "value", "output")


def float_policy(policy):
    """The float policy a quantized policy was made from (`int8_from_bfloat16` -> `bfloat16`).

    Example:
        >>> float_policy(keras.dtype_policies.get("int8_from_float32")).name
        'float32'
    """
    if policy.quantization_mode is None:
        return policy
    return keras.dtype_policies.get(policy.get_config()["source_name"])


def _shapes(layer, query_features, key_features, value_features, output_dim):
    """`{projection: (inputs, units)}`: each float kernel (`float_shapes`) as its Dense's matrix."""
    kernels = float_shapes(layer, query_features, key_features, value_features, output_dim)
    matrices = {}
    for name in PROJECTIONS:
        shape = kernels[f"{name}_kernel"]
        # The output kernel is (heads, head_dim, outputs); the others (inputs, heads, head_dim).
        matrices[name] = (
            (shape[0] * shape[1], shape[2]) if name == "output" else (shape[0], shape[1] * shape[2])
        )
    return matrices


def float_shapes(layer, query_features, key_features, value_features, output_dim):
    """`{name: shape}` of a float layer's projection variables, in the order it builds them.

    Kernels are `(features, heads, head_dim)` (the output's `(heads, head_dim, output_dim)`),
    biases `(heads, head_dim)` (the output's `(output_dim,)`); biases only where used.

    Example:
        >>> layer = GroupedQueryAttention(4, 2, head_dim=8)
        >>> float_shapes(layer, 32, 32, 32, 32)["key_kernel"]
        (32, 2, 8)
    """
    heads, kv_heads, head_dim = layer.num_heads, layer.num_key_value_heads, layer.head_dim
    shapes = {
        "query_kernel": (query_features, heads, head_dim),
        "key_kernel": (key_features, kv_heads, head_dim),
        "value_kernel": (value_features, kv_heads, head_dim),
    }
    if layer.use_bias:
        shapes["query_bias"] = (heads, head_dim)
        shapes["key_bias"] = shapes["value_bias"] = (kv_heads, head_dim)
    shapes["output_kernel"] = (heads, head_dim, output_dim)
    if layer.use_output_bias:
        shapes["output_bias"] = (output_dim,)
    return shapes


def float_variables_of_quantized(layer):
    """`{float variable name: (projection Dense, float shape)}` of a quantized `layer`: where
    each variable of the float layer lives once the layer is quantized (checkpoint loading
    quantizes straight into the Dense, `keras_mha.models.quantized_loading`).

    Example:
        >>> layer = GroupedQueryAttention(4, 2, head_dim=8, dtype="int8_from_float32")
        >>> layer.build((None, None, 32))
        >>> dense, shape = float_variables_of_quantized(layer)["output_kernel"]
        >>> dense.name, shape
        ('output_dense', (4, 8, 32))
    """
    output_dim = layer.output_dim or layer._query_features
    shapes = float_shapes(
        layer, layer._query_features, layer._key_features, layer._value_features, output_dim
    )
    return {
        name: (getattr(layer, f"{name.split('_')[0]}_dense"), shape)
        for name, shape in shapes.items()
    }


def _use_bias(layer, name):
    return layer.use_output_bias if name == "output" else layer.use_bias


def _dense(layer, name, units, policy):
    return keras.layers.Dense(
        units,
        use_bias=_use_bias(layer, name),
        kernel_initializer="zeros",
        dtype=policy,
        name=f"{name}_dense",
    )


def build_quantized(layer, query_features, key_features, value_features, output_dim):
    """Create `layer`'s projections as Dense layers of its quantized policy (a `.keras` load).

    Keras's `Dense.build` makes the mode's variables (int8 kernel and scale, ...), which
    the file's values then fill.
    """
    shapes = _shapes(layer, query_features, key_features, value_features, output_dim)
    for name in PROJECTIONS:
        features, units = shapes[name]
        dense = _dense(layer, name, units, layer.dtype_policy)
        dense.build((None, None, features))
        setattr(layer, f"{name}_dense", dense)
    layer._is_quantized = True


_frozen = [0]


@contextlib.contextmanager
def cheap_collections():
    """Within it, the `gc.collect()` Keras runs per deleted variable (`Dense.quantize`
    deletes the float kernel) scans only objects made inside: the rest are frozen
    (`gc.freeze`), which takes the time of `model.quantize` from minutes to seconds in a
    large process. Float buffers are still freed by reference counting. Reentrant: a nested
    entry freezes what was made since the outer one; only the outermost exit unfreezes.

    Example:
        >>> with cheap_collections():
        ...     pass
    """
    _frozen[0] += 1
    gc.freeze()  # on every entry: what was made since an outer entry is frozen out too
    try:
        yield
    finally:
        _frozen[0] -= 1
        if _frozen[0] == 0:
            gc.unfreeze()


def quantize_attention(layer, mode, config=None):
    """Quantize `layer`'s four projections in place with Keras's `Dense.quantize(mode)`.

    Args:
        layer: a built `GroupedQueryAttention` (or subclass), not quantized.
        mode: `"int8"`, `"int4"`, `"float8"`, `"gptq"` or `"awq"`, as `Model.quantize`.
        config: a `keras.quantizers.QuantizationConfig`, or None for the mode's default.
    """
    output_dim = layer.output_dim or layer._query_features
    shapes = _shapes(
        layer, layer._query_features, layer._key_features, layer._value_features, output_dim
    )
    policy = float_policy(layer.dtype_policy)
    with cheap_collections():
        _quantize_projections(layer, mode, config, shapes, policy)
    layer._is_quantized = True
    # Set after `_is_quantized`: Keras's setter would otherwise quantize again.
    layer.dtype_policy = layer.query_dense.dtype_policy


def _quantize_projections(layer, mode, config, shapes, policy):
    for name in PROJECTIONS:
        features, units = shapes[name]
        dense = _dense(layer, name, units, policy)
        dense.build((None, None, features))
        kernel_name, bias_name = f"{name}_kernel", f"{name}_bias"
        dense.kernel.assign(ops.reshape(getattr(layer, kernel_name), (features, units)))
        if dense.bias is not None:
            dense.bias.assign(ops.reshape(getattr(layer, bias_name), (units,)))
            delattr(layer, bias_name)
        delattr(layer, kernel_name)
        dense.quantize(mode, config=config)
        setattr(layer, f"{name}_dense", dense)


def refuse_quantized(layer, action, error=ValueError):
    """Raise `error` (one line) when `layer` is quantized: `action` needs its float kernels.

    Example:
        >>> layer = GroupedQueryAttention(4, 2, head_dim=8)
        >>> layer.build((None, None, 32))
        >>> refuse_quantized(layer, "prune_heads")  # float: nothing raised
    """
    mode = getattr(layer, "quantization_mode", None)
    if mode is not None:
        raise error(
            f"layer {layer.name!r} is quantized ({mode}): {action} needs float kernels; "
            "run it on the float model, before quantize"
        )


__all__ = [
    "PROJECTIONS",
    "build_quantized",
    "cheap_collections",
    "float_policy",
    "float_shapes",
    "float_variables_of_quantized",
    "quantize_attention",
    "refuse_quantized",
]
