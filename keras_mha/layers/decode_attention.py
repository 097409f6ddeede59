"""Query tokens against the KV cache, written so that XLA on CPU reads the cache once.

Two paths, each for the backend where it was measured faster than the grouped einsum
of `attention_kernels.grouped_attention`: `flat_cache_attention` on TensorFlow (two
flat matmuls that read the cache in place, with a variable cache updated by a scatter:
see `kv_cache.py`), and `single_query_attention` on JAX's CPU backend, below.

The general path computes the logits and the weighted values as batched matmuls
(`einsum`). On XLA's CPU backend a matmul operand is a *reshaped* view of the cache
(`(B, Hkv, S, D)` seen as `(B * Hkv, S, D)`), and when the cache was just updated in
place by `dynamic_update_slice` XLA fuses the update into that reshape: the update
is then done twice and, to keep the donated buffer intact, both the key and the value
cache are copied several times per step (measured: four copies of each in a
grouped-query step, the step 1.3-1.5x slower than a hand-written reference).

Here the two products are elementwise multiplies and sums over the cache in its own
4-D shape, which XLA fuses into loops reading the updated buffer in place: no copy
of the cache at all. Used for a single query token on JAX's CPU backend with
several query heads per KV head and a float32 cache; with one query head per KV head
(multi-head attention) XLA's matrix-vector kernels are faster, and with a bfloat16
cache converting it element by element to float32 costs more than the copies
(measured: 0.47x the reference's speed against 1.02x), so the einsum path stays.

Example:
    >>> q = keras.random.normal((1, 1, 8, 16))
    >>> k = keras.random.normal((1, 2, 32, 16))
    >>> tuple(single_query_attention(q, k, k, None, scale=0.25).shape)
    (1, 1, 8, 16)
"""

from __future__ import annotations

import keras
from keras import ops

_MASKED_LOGIT = -1e30


def applies_flat(query, key):
    """Whether `flat_cache_attention` is the path for this step (XLA on TensorFlow).

    Example:
        >>> applies_flat(ops.ones((1, 1, 8, 16)), ops.ones((1, 2, 32, 16)))  # doctest: +SKIP
        True
    """
    return keras.backend.backend() == "tensorflow" and query.shape[2] is not None


def flat_cache_attention(query, key, value, mask, *, scale, rows_may_be_empty=True):
    """Attention of `(B, T, H, D)` queries over a heads-first cache as two flat matmuls.

    `key`, `value` `(B, Hkv, S, D)` are read as `(B * Hkv, S, D)` (a free
    reshape of the cache as it lies) by a matmul against the queries grouped
    per KV head `(B * Hkv, G * T, D)`, contracting the cache's last axis, and
    the weights `(B * Hkv, G * T, S)` by a matmul against the values. XLA's
    CPU compiler reads the cache in place through both; the grouped einsum
    of `attention_kernels.grouped_attention` made it copy the keys
    transposed at every step. `mask` is None or boolean, broadcastable to
    `(B, 1 | H, T, S)`; the softmax is in float32 and a row with nothing to
    attend gives zeros. Returns `(B, T, H, Dv)` in the dtype of `value`.

    Example:
        >>> q = keras.random.normal((1, 1, 8, 16))
        >>> k = v = keras.random.normal((1, 2, 32, 16))
        >>> tuple(flat_cache_attention(q, k, v, None, scale=0.25).shape)
        (1, 1, 8, 16)
    """
    shape = ops.shape(query)
    batch, length = shape[0], shape[1]
    num_heads, head_dim = query.shape[2], query.shape[3]
    kv_heads, max_length = key.shape[1], key.shape[2]
    groups = num_heads // kv_heads
    # (B, T, H, D) -> (B, Hkv, G, T, D) -> (B * Hkv, G * T, D).
    grouped = ops.reshape(
        query * ops.cast(scale, query.dtype), (batch, length, kv_heads, groups, head_dim)
    )
    grouped = ops.reshape(ops.transpose(grouped, (0, 2, 3, 1, 4)), (-1, groups * length, head_dim))
    flat_key = ops.reshape(key, (-1, max_length, head_dim))
    logits = ops.cast(ops.einsum("bqd,bsd->bqs", grouped, flat_key), "float32")
    logits = ops.reshape(logits, (batch, kv_heads, groups, length, max_length))
    grouped_mask = None
    if mask is not None:
        # (B|1, 1|H, T, S) -> (B|1, 1|Hkv, 1|G, T, S).
        if mask.shape[1] == 1:
            grouped_mask = mask[:, :, None]
        else:
            grouped_mask = ops.reshape(
                mask, (ops.shape(mask)[0], kv_heads, groups, mask.shape[2], mask.shape[3])
            )
        logits = ops.where(grouped_mask, logits, _MASKED_LOGIT)
    weights = ops.softmax(logits, axis=-1)
    if grouped_mask is not None and rows_may_be_empty:
        weights = ops.where(ops.any(grouped_mask, axis=-1, keepdims=True), weights, 0.0)
    weights = ops.reshape(ops.cast(weights, value.dtype), (-1, groups * length, max_length))
    flat_value = ops.reshape(value, (-1, max_length, value.shape[-1]))
    output = ops.einsum("bqs,bsd->bqd", weights, flat_value)
    # (B * Hkv, G * T, Dv) -> (B, Hkv, G, T, Dv) -> (B, T, H, Dv).
    output = ops.reshape(output, (batch, kv_heads, groups, length, value.shape[-1]))
    output = ops.transpose(output, (0, 3, 1, 2, 4))
    return ops.reshape(output, (batch, length, num_heads, value.shape[-1]))


def applies(query, key):
    """Whether `single_query_attention` is the faster path for these shapes here."""
    if keras.backend.backend() != "jax" or query.shape[1] != 1:
        return False
    if query.shape[2] == key.shape[1]:
        return False  # One query head per KV head: the einsum path's matrix-vector kernels.
    if keras.backend.standardize_dtype(key.dtype) != "float32":
        return False  # Half-precision caches: converting every element costs more (measured).
    import jax

    return jax.default_backend() == "cpu"


def single_query_attention(query, key, value, mask, *, scale, rows_may_be_empty=True):
    """Attention of one query token `(B, 1, H, D)` over `key`, `value` `(B, Hkv, S, D)`.

    `mask`: None or boolean, broadcastable to `(B, 1 | H, 1, S)`. Softmax in float32;
    a row with nothing to attend gives zeros, as `attention_kernels.grouped_attention`.
    Returns `(B, 1, H, Dv)` in the dtype of `value`.
    """
    batch = ops.shape(query)[0]
    num_heads, head_dim = query.shape[2], query.shape[3]
    kv_heads = key.shape[1]
    groups = num_heads // kv_heads
    grouped = ops.reshape(
        query * ops.cast(scale, query.dtype), (batch, kv_heads, groups, 1, head_dim)
    )
    # (B, Hkv, G, 1, D) * (B, Hkv, 1, S, D) summed over D: (B, Hkv, G, S).
    logits = ops.sum(ops.cast(grouped, "float32") * ops.cast(key[:, :, None], "float32"), axis=-1)
    grouped_mask = None
    if mask is not None:
        # (B|1, 1|H, 1, S) -> (B|1, 1|Hkv, 1|G, S).
        if mask.shape[1] == 1:
            grouped_mask = mask[:, :, :1]
        else:
            grouped_mask = ops.reshape(mask, (ops.shape(mask)[0], kv_heads, groups, mask.shape[-1]))
        logits = ops.where(grouped_mask, logits, _MASKED_LOGIT)
    weights = ops.softmax(logits, axis=-1)
    if grouped_mask is not None and rows_may_be_empty:
        weights = ops.where(ops.any(grouped_mask, axis=-1, keepdims=True), weights, 0.0)
    # (B, Hkv, G, S, 1) * (B, Hkv, 1, S, Dv) summed over S: (B, Hkv, G, Dv), in float32.
    output = ops.sum(weights[..., None] * ops.cast(value[:, :, None], "float32"), axis=3)
    output = ops.cast(output, value.dtype)
    return ops.reshape(output, (batch, 1, num_heads, value.shape[-1]))
