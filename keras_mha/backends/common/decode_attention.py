"""Query tokens against a KV cache, written so that XLA on CPU does not copy the cache.

Two paths, each for the backend where it was measured faster than the grouped einsum
of `attention_kernels.grouped_attention` over the updated cache (each backend's
`cache_kernel`, in `keras_mha/backends/`, picks):

- `flat_cache_attention` on TensorFlow: two flat matmuls that read a cache of
  variables, updated in place by a scatter (`kv_cache.py`), as it lies;
- for one query token on JAX's CPU backend, `two_fusion_attention` (grouped queries,
  a cache of some size: `prefers_two_fusions`): the softmax's numerator and denominator
  in two fusions that each read the written cache once, so that XLA updates the donated
  buffers in place; else `single_query_attention`: attention over the cache as the step
  received it plus the step's own key, which XLA copies four times per step.

Why the general einsum copies, with the measurements, is in
docs/concepts/attention-paths.md.

Example:
    >>> q = keras.random.normal((1, 1, 8, 16))
    >>> cache = keras.random.normal((1, 2, 32, 16))
    >>> tuple(two_fusion_attention(q, cache, cache, None, scale=0.25).shape)
    (1, 1, 8, 16)
"""

from __future__ import annotations

import numpy as np
from keras import ops

_MASKED_LOGIT = -1e30


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


def _grouped(query, key, mask, scale):
    """`(queries (B, Hkv, G, D) scaled, mask (B|1, 1|Hkv, 1|G, S) or None)` of one token."""
    batch = ops.shape(query)[0]
    num_heads, head_dim = query.shape[2], query.shape[3]
    kv_heads, max_length = key.shape[1], key.shape[2]
    groups = num_heads // kv_heads
    grouped = ops.reshape(query * ops.cast(scale, query.dtype), (batch, kv_heads, groups, head_dim))
    if mask is None:
        return grouped, None
    # (B|1, 1|H, 1, S) -> (B|1, 1|Hkv, 1|G, S), the query axis folded away.
    if mask.shape[1] == 1:
        return grouped, mask[:, :, :1]
    return grouped, ops.reshape(mask, (ops.shape(mask)[0], kv_heads, groups, max_length))


def single_query_attention(
    query, new_key, new_value, key, value, mask, *, position, scale, rows_may_be_empty=True
):
    """Attention of one query token over a cache as it was before this step, plus its own key.

    The step's key/value `(B, 1, Hkv, D)` go to cache position `position`; `key`, `value`
    `(B, Hkv, S, D)` are the cache *before* that write, so that XLA reads them as
    the step received them while the write updates the (donated) buffers in place;
    reading the updated cache through the matmuls made XLA copy both buffers several
    times per step (see docs/concepts/attention-paths.md). One softmax covers both
    parts: the cache's positions other than `position`, and the new key.

    Args:
        query: `(B, 1, H, D)`.
        new_key, new_value: `(B, 1, Hkv, D)`, this step's.
        key, value: `(B, Hkv, S, D)`, the cache before the write.
        mask: None or boolean, broadcastable to `(B, 1 | H, 1, S)`, over the cache with
            the new token at `position` (the causal / cache mask included).
        position: where the new token goes: a Python int or a scalar tensor.
        scale: multiplier of the logits.
        rows_may_be_empty: False when the mask leaves every row a key.

    Returns:
        `(B, 1, H, Dv)` in the dtype of `value`; softmax in float32, and a row with
        nothing to attend gives zeros, as `attention_kernels.grouped_attention`.

    Example:
        >>> q = keras.random.normal((1, 1, 8, 16)); new = keras.random.normal((1, 1, 2, 16))
        >>> k = keras.random.normal((1, 2, 32, 16))
        >>> tuple(single_query_attention(q, new, new, k, k, None, position=5, scale=0.25).shape)
        (1, 1, 8, 16)
    """
    batch, num_heads = ops.shape(query)[0], query.shape[2]
    max_length = key.shape[2]
    grouped, grouped_mask = _grouped(query, key, mask, scale)
    # (B, Hkv, G, S) over the old cache and (B, Hkv, G, 1) for the new key.
    logits = ops.cast(ops.einsum("bkgd,bksd->bkgs", grouped, key), "float32")
    new_key = ops.transpose(new_key, (0, 2, 1, 3))
    new_logit = ops.cast(ops.einsum("bkgd,bksd->bkgs", grouped, new_key), "float32")
    position = ops.cast(position, "int32")
    old_allowed = ops.arange(max_length, dtype="int32") != position
    new_allowed = None
    if grouped_mask is not None:
        old_allowed = ops.logical_and(grouped_mask, old_allowed)
        new_allowed = ops.take(grouped_mask, ops.reshape(position, (1,)), axis=-1)
        new_logit = ops.where(new_allowed, new_logit, _MASKED_LOGIT)
    logits = ops.where(old_allowed, logits, _MASKED_LOGIT)
    peak = ops.maximum(ops.max(logits, axis=-1, keepdims=True), new_logit)
    weights, new_weight = ops.exp(logits - peak), ops.exp(new_logit - peak)
    total = ops.sum(weights, axis=-1, keepdims=True) + new_weight
    attended = ops.einsum("bkgs,bksd->bkgd", ops.cast(weights, value.dtype), value)
    new_value = ops.transpose(new_value, (0, 2, 1, 3))
    output = (ops.cast(attended, "float32") + new_weight * ops.cast(new_value, "float32")) / total
    if grouped_mask is not None and rows_may_be_empty:
        # A row with nothing to attend would otherwise average every value.
        has_key = ops.logical_or(ops.any(old_allowed, axis=-1, keepdims=True), new_allowed)
        output = ops.where(has_key, output, 0.0)
    output = ops.cast(output, value.dtype)
    return ops.reshape(output, (batch, 1, num_heads, value.shape[-1]))


# XLA's CPU compiler puts a matmul into an XNNPACK fusion with its neighbours only above
# some size: below this many query-head x cache x head-size elements (and for one query
# head per KV head, or one KV head) the two fusions copied the cache 8-10 times per
# step, the cache-as-passed path 4 times (compiled HLO, jax 0.10).
_TWO_FUSIONS_MIN_ELEMENTS = 2**18


def prefers_two_fusions(query, key):
    """Whether `two_fusion_attention` is the step's path (else `single_query_attention`).

    Example:
        >>> prefers_two_fusions(ops.ones((1, 1, 8, 64)), ops.ones((1, 2, 2048, 64)))
        True
    """
    num_heads, head_dim = query.shape[2], query.shape[3]
    kv_heads, max_length = key.shape[1], key.shape[2]
    grouped = 1 < kv_heads < num_heads
    return grouped and num_heads * max_length * head_dim >= _TWO_FUSIONS_MIN_ELEMENTS


def two_fusion_attention(query, key, value, mask, *, scale, rows_may_be_empty=True):
    """Attention of one query token over the cache its step has just written, copy-free on XLA.

    XLA's CPU compiler updates a donated cache in place only while each buffer is read by
    a single XNNPACK fusion that takes the buffer as it lies: a matmul alone in its fusion
    leaves the `(B, Hkv, S, D) -> (B * Hkv, S, D)` view outside it, fuses that view with
    the update, and copies the buffer (four copies per step; see
    docs/concepts/attention-paths.md). Hence two fusions, each reading the cache once:

    - the numerator `sum_s exp(l_s - max l) v_s`: both matmuls, the mask as an additive
      bias, the max and the exponential, one chain (no second user of the weights);
    - the denominator `sum_s exp(l_s - max l)`: the queries of all KV heads against the
      keys viewed `(B, Hkv * S, D)`, pairs of different heads masked out, reduced along
      the keys; `Hkv` times the work of one head's logits, but no copy of the cache.

    Both maxima are over the same logits (two matmul layouts, so equal up to rounding).

    Args:
        query: `(B, 1, H, D)`.
        key, value: `(B, Hkv, S, D)`, the cache with this step's key and value written.
        mask: None or boolean, broadcastable to `(B, 1 | H, 1, S)`.
        scale: multiplier of the logits.
        rows_may_be_empty: False when the mask leaves every row a key.

    Returns:
        `(B, 1, H, Dv)` in the dtype of `value`; the logits and softmax in float32 for a
        float32 cache, and a row with nothing to attend gives zeros, as
        `attention_kernels.grouped_attention`.

    Example:
        >>> q = keras.random.normal((1, 1, 8, 16))
        >>> k = keras.random.normal((1, 2, 32, 16))
        >>> tuple(two_fusion_attention(q, k, k, None, scale=0.25).shape)
        (1, 1, 8, 16)
    """
    batch, num_heads = ops.shape(query)[0], query.shape[2]
    grouped, grouped_mask = _grouped(query, key, mask, scale)
    bias = None if grouped_mask is None else ops.where(grouped_mask, 0.0, _MASKED_LOGIT)
    numerator = _weighted_values(grouped, key, value, bias)
    total = _softmax_total(grouped, key, bias)
    output = ops.cast(numerator, "float32") / total
    if grouped_mask is not None and rows_may_be_empty:
        # A row with nothing to attend would otherwise average every value.
        output = ops.where(ops.any(grouped_mask, axis=-1, keepdims=True), output, 0.0)
    output = ops.cast(output, value.dtype)
    return ops.reshape(output, (batch, 1, num_heads, value.shape[-1]))


def _weighted_values(grouped, key, value, bias):
    """`(B, Hkv, G, Dv)`: `sum_s exp(l_s - max l) v_s`, one chain from the keys to the values."""
    logits = ops.cast(ops.einsum("bkgd,bksd->bkgs", grouped, key), "float32")
    if bias is not None:
        logits = logits + bias
    weights = ops.exp(logits - ops.max(logits, axis=-1, keepdims=True))
    return ops.einsum("bkgs,bksd->bkgd", ops.cast(weights, value.dtype), value)


def _softmax_total(grouped, key, bias):
    """`(B, Hkv, G, 1)`: `sum_s exp(l_s - max l)`, from the keys viewed `(B, Hkv * S, D)`."""
    batch, kv_heads, groups, head_dim = ops.shape(grouped)
    max_length = key.shape[2]
    queries = ops.reshape(grouped, (batch, kv_heads * groups, head_dim))
    keys = ops.reshape(key, (batch, kv_heads * max_length, head_dim))
    logits = ops.cast(ops.einsum("bcd,brd->bcr", queries, keys), "float32")
    # Query head (k, g) against key row (k', s): only k == k' counts. A constant.
    query_head = np.repeat(np.arange(kv_heads), groups)[:, None]
    key_head = np.repeat(np.arange(kv_heads), max_length)[None, :]
    other_heads = np.where(query_head == key_head, 0.0, _MASKED_LOGIT).astype("float32")
    logits = logits + ops.convert_to_tensor(other_heads)  # on the logits' device
    if bias is not None:
        # (B|1, Hkv|1, G|1, S) -> (B|1, Hkv * G, Hkv * S): the same bias for every k'.
        shape = ops.shape(bias)
        full = ops.broadcast_to(
            bias[:, :, :, None, :], (shape[0], kv_heads, groups, kv_heads, max_length)
        )
        logits = logits + ops.reshape(full, (shape[0], kv_heads * groups, kv_heads * max_length))
    weights = ops.exp(logits - ops.max(logits, axis=-1, keepdims=True))
    return ops.reshape(ops.sum(weights, axis=-1), (batch, kv_heads, groups, 1))
