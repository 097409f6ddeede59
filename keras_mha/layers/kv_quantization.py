"""int8 and float8 KV caches: quantize a step's keys and values, read them back for attention.

The scheme is `keras_mha.planning.kv_formats` (the table the planner counts bytes with): one
symmetric scale per token and KV head, for keys and values each, `scale = max |x| /
max_code` (127 for int8, 448 for float8 e4m3fn), stored in the layer's compute dtype; a
row is quantized once, when its token is written, so the cache stays a fixed-shape buffer
updated in place as the float one (`kv_cache.py`). Per-channel keys (KIVI) would need a
group of tokens before their scale is known, hence a float window beside the cache;
per-token rows need none. Attention reads the cache dequantized in float32 and cast to the
compute dtype, with the softmax in float32 as for a float cache; the step's own tokens
are attended as the cache now holds them, so every decode path gives the same numbers.

float8 codes are computed and read in plain `keras.ops` arithmetic (round to nearest even,
saturating at 448; its bits kept as `uint8`), since TensorFlow can neither bitcast nor
scatter float8 tensors; it matches `ml_dtypes.float8_e4m3fn` bit for bit (tested).
Reading them back costs a few elementwise operations per element, which XLA and
`torch.compile` fuse into the dequantization.

Example:
    >>> x = keras.random.normal((1, 3, 2, 8))
    >>> codes, scale = quantize(x, "int8", "float32")
    >>> tuple(codes.shape), tuple(scale.shape), str(codes.dtype).split(".")[-1]
    ((1, 3, 2, 8), (1, 3, 2, 1), 'int8')
    >>> error = ops.max(ops.abs(dequantize(codes, scale, "int8", "float32") - x))
    >>> bool(error <= ops.max(scale) / 2 + 1e-6)
    True
"""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_mha.backends.common import kv_cache
from keras_mha.planning.kv_formats import RUNTIME_QUANTIZED

_E4M3_MAX = 448.0
_E4M3_MAX_BITS = 126  # 0x7E = 448; 0x7F is NaN
_E4M3_MIN_EXPONENT = -6  # below it, subnormals: steps of 2**-9


def encode_float8(x):
    """`uint8` bits of float32 `x` rounded to float8 e4m3fn (nearest even, saturating).

    Example:
        >>> ops.convert_to_numpy(encode_float8(ops.convert_to_tensor([1.0, -0.5, 1000.0])))
        array([ 56, 176, 126], dtype=uint8)
    """
    magnitude = ops.minimum(ops.abs(x), _E4M3_MAX)
    exponent = ops.floor(ops.log2(ops.maximum(magnitude, 2.0**_E4M3_MIN_EXPONENT)))
    # Three mantissa bits: steps of 2**(e - 3); q in [8, 16] for normals (16 carries into
    # the next exponent), [0, 8] for subnormals, and (e + 6) * 8 + q is then the pattern.
    steps = ops.round(magnitude / ops.power(2.0, exponent - 3.0))
    bits = ops.minimum((exponent - _E4M3_MIN_EXPONENT) * 8.0 + steps, float(_E4M3_MAX_BITS))
    bits = bits + ops.where(x < 0, 128.0, 0.0)
    return ops.cast(bits, "uint8")


def decode_float8(bits):
    """float32 values of float8 e4m3fn `bits` (`uint8`), by arithmetic (no table, no
    constant that a compiled graph would have to capture).

    Example:
        >>> ops.convert_to_numpy(decode_float8(ops.convert_to_tensor([56, 176], "uint8")))
        array([ 1. , -0.5], dtype=float32)
    """
    bits = ops.cast(bits, "float32")
    negative = bits >= 128.0
    magnitude = bits - ops.where(negative, 128.0, 0.0)
    exponent = ops.floor(magnitude / 8.0)
    mantissa = magnitude - 8.0 * exponent
    # Normals (1 + m / 8) * 2**(e - 7) = (8 + m) * 2**(e - 10); subnormals m * 2**-9.
    significand = mantissa + ops.where(exponent > 0, 8.0, 0.0)
    value = significand * ops.power(2.0, ops.maximum(exponent, 1.0) - 10.0)
    return ops.where(negative, -value, value)


def quantize(x, kv_dtype, scale_dtype):
    """`(codes, scale)` of `x` `(..., head_dim)`: a scale per row of the last axis.

    Args:
        x: keys or values, any float dtype.
        kv_dtype: `"int8"` or `"float8_e4m3fn"`.
        scale_dtype: the scales' dtype (the layer's compute dtype); the codes are
            computed against the scale as stored.

    Returns:
        `codes` (`int8`, or `uint8` float8 bits) shaped as `x`, and `scale` `(..., 1)`.
    """
    max_code = RUNTIME_QUANTIZED[kv_dtype].max_code
    x = ops.cast(x, "float32")
    # amax: keras.ops.max breaks a torch.compile graph (an isinstance check), and a step
    # compiled with tensor-only guards would then reuse a resumed frame of another dtype.
    largest = ops.amax(ops.abs(x), axis=-1, keepdims=True)
    scale = ops.cast(largest / max_code, scale_dtype)
    stored = ops.cast(scale, "float32")
    scaled = x / ops.where(stored > 0, stored, 1.0)
    if kv_dtype == "int8":
        codes = ops.cast(ops.clip(ops.round(scaled), -max_code, max_code), "int8")
    else:
        codes = encode_float8(scaled)
    return codes, scale


def dequantize(codes, scale, kv_dtype, dtype):
    """`codes * scale` in float32, cast to `dtype`.

    Example:
        >>> codes, scale = quantize(ops.ones((1, 2, 4)), "float8_e4m3fn", "float32")
        >>> ops.convert_to_numpy(dequantize(codes, scale, "float8_e4m3fn", "float32"))[0, 0]
        array([1., 1., 1., 1.], dtype=float32)
    """
    values = ops.cast(codes, "float32") if kv_dtype == "int8" else decode_float8(codes)
    return ops.cast(values * ops.cast(scale, "float32"), dtype)


def write(cache, key, value, cache_index, start):
    """Quantize this call's keys/values `(B, T, Hkv, D)` into `cache` at `cache_index`.

    Returns:
        `(key, value, cache, valid)`: the keys and values as the cache now holds them
        (dequantized, in their dtype), the written cache and `kv_cache.write`'s `valid`.
    """
    kv_dtype, scale_dtype = kv_cache.kv_dtype(cache), kv_cache.dtype_name(cache.key_scale.dtype)
    key_parts = quantize(key, kv_dtype, scale_dtype)
    value_parts = quantize(value, kv_dtype, scale_dtype)
    written, valid = kv_cache.write(cache, key_parts, value_parts, cache_index, start)
    held_key = dequantize(*key_parts, kv_dtype, key.dtype)
    return held_key, dequantize(*value_parts, kv_dtype, value.dtype), written, valid


def dequantize_cache(cache, dtype):
    """A `KVCache` of `cache`'s keys and values in `dtype` (the whole length).

    Example:
        >>> cache = kv_cache.QuantizedKVCache.zeros(1, 2, 8, 4, "int8", "float32")
        >>> tuple(dequantize_cache(cache, "float32").key.shape)
        (1, 2, 8, 4)
    """
    kv_dtype = kv_cache.kv_dtype(cache)
    return kv_cache.KVCache(
        dequantize(cache.key, cache.key_scale, kv_dtype, dtype),
        dequantize(cache.value, cache.value_scale, kv_dtype, dtype),
    )


def cache_bytes(cache):
    """Bytes of a cache's buffers (codes and scales), as allocated.

    Example:
        >>> cache_bytes(kv_cache.QuantizedKVCache.zeros(1, 2, 8, 4, "int8", "float32"))
        256
    """
    return sum(
        int(np.prod(buffer.shape)) * _ITEMSIZES[kv_cache.dtype_name(buffer.dtype)]
        for buffer in cache
    )


_ITEMSIZES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "uint8": 1}


__all__ = [
    "RUNTIME_QUANTIZED",
    "cache_bytes",
    "decode_float8",
    "dequantize",
    "dequantize_cache",
    "encode_float8",
    "quantize",
    "write",
]
