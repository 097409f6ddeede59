"""The attention computation itself: the generic path, the fused dispatch, blockwise causal.

Everything here takes projected heads, queries `(batch, query_length, num_heads,
head_dim)` and keys/values `(batch, key_length, num_key_value_heads, head_dim)`, and
never repeats K/V for grouped-query attention: the queries are grouped instead,
`(B, T, Hkv, G, D)` against `(B, S, Hkv, D)`. Masks are boolean, `True` where a query
may attend, broadcastable to `(B, 1 | H, T, S)`; a row with nothing to attend gives
zeros.

- `grouped_attention`: `keras.ops` only, the reference, and the path for attention
  weights, dropout and logit soft-capping;
- `fused_attention`: the fastest primitive of each backend (`jax.nn` /
  `keras.ops.dot_product_attention`, torch SDPA without repeating K/V, the grouped
  einsum for GQA on TensorFlow), tested against `grouped_attention`;
- `blockwise_causal_attention`: long causal self-attention one block of queries at a
  time, never forming the masked triangle, where no fused kernel skips it.

Which call takes which, and why: docs/concepts/attention-paths.md.

Example:
    >>> q = keras.random.normal((2, 5, 8, 16))
    >>> kv = keras.random.normal((2, 7, 2, 16))
    >>> tuple(fused_attention(q, kv, kv, scale=16**-0.5).shape)
    (2, 5, 8, 16)
"""

from __future__ import annotations

import keras
from keras import ops

from keras_mha import backends

# Large negative logit for masked positions. Softmax runs in float32, where this
# is far from overflow, and exp() of it underflows to exactly zero.
_MASKED_LOGIT = -1e30


def _split_query_groups(query, num_key_value_heads):
    """(B, T, H, D) -> (B, T, Hkv, G, D), the query heads of group k contiguous."""
    shape = ops.shape(query)
    num_heads, head_dim = query.shape[2], query.shape[3]
    groups = num_heads // num_key_value_heads
    return ops.reshape(query, (shape[0], shape[1], num_key_value_heads, groups, head_dim))


def _grouped_mask(mask, num_key_value_heads):
    """Mask (B|1, 1|H, T, S) -> (B|1, 1|Hkv, 1|G, T, S) matching grouped logits."""
    if mask.shape[1] == 1:
        return ops.expand_dims(mask, axis=2)
    shape = ops.shape(mask)
    groups = mask.shape[1] // num_key_value_heads
    return ops.reshape(mask, (shape[0], num_key_value_heads, groups, shape[2], shape[3]))


def rows_with_any_key(mask):
    """Boolean (B|1, 1|H, T, 1): True for query rows that may attend to something."""
    return ops.any(mask, axis=-1, keepdims=True)


def grouped_attention(
    query,
    key,
    value,
    mask=None,
    *,
    scale,
    logit_soft_cap=None,
    dropout_rate=0.0,
    seed_generator=None,
    training=False,
    return_weights=False,
    key_heads_first=False,
):
    """Reference attention with `keras.ops`, grouping queries for GQA/MQA.

    Args:
        query: `(B, T, H, D)`.
        key: `(B, S, Hkv, D)`; `H` must be a multiple of `Hkv`.
        value: `(B, S, Hkv, Dv)`.
        mask: optional boolean, broadcastable to `(B, 1 | H, T, S)`.
        scale: multiplier of the logits, usually `D ** -0.5`.
        logit_soft_cap: optional `c`; logits become `c * tanh(logits / c)`
            (Gemma 2).
        dropout_rate: dropout on the attention weights, when `training`.
        seed_generator: a `keras.random.SeedGenerator` for the dropout.
        training: whether dropout is active.
        return_weights: also return the weights, `(B, H, T, S)`, before dropout.
        key_heads_first: `key` and `value` are `(B, Hkv, S, D)` (the layout of
            the KV cache) instead of `(B, S, Hkv, D)`.

    Returns:
        `(B, T, H, Dv)` in the dtype of `value`, and the weights (float32)
        when `return_weights`.

    Example:
        >>> q = keras.random.normal((2, 5, 8, 16))
        >>> kv = keras.random.normal((2, 7, 2, 16))
        >>> tuple(grouped_attention(q, kv, kv, scale=16**-0.5).shape)
        (2, 5, 8, 16)
    """
    num_key_value_heads = key.shape[1 if key_heads_first else 2]
    key_axes = "bksd" if key_heads_first else "bskd"
    compute_dtype = value.dtype
    # Scale before the product (as keras.layers.MultiHeadAttention does) so that
    # float16 logits stay small; everything after the product is float32.
    grouped_query = _split_query_groups(query * ops.cast(scale, query.dtype), num_key_value_heads)
    logits = ops.einsum(f"btkgd,{key_axes}->bkgts", grouped_query, key)
    logits = ops.cast(logits, "float32")
    if logit_soft_cap is not None:
        logits = ops.tanh(logits / logit_soft_cap) * logit_soft_cap
    if mask is not None:
        grouped_mask = _grouped_mask(mask, num_key_value_heads)
        logits = ops.where(grouped_mask, logits, _MASKED_LOGIT)
    weights = ops.softmax(logits, axis=-1)
    if mask is not None:
        # A row with nothing to attend would otherwise average every value.
        weights = ops.where(ops.any(grouped_mask, axis=-1, keepdims=True), weights, 0.0)
    weights_before_dropout = weights
    if training and dropout_rate > 0.0:
        weights = keras.random.dropout(weights, dropout_rate, seed=seed_generator)
    output = ops.einsum(f"bkgts,{key_axes}->btkgd", ops.cast(weights, compute_dtype), value)
    out_shape = ops.shape(output)
    output = ops.reshape(output, (out_shape[0], out_shape[1], query.shape[2], value.shape[-1]))
    if not return_weights:
        return output
    w_shape = ops.shape(weights_before_dropout)
    weights_per_head = ops.reshape(
        weights_before_dropout, (w_shape[0], query.shape[2], w_shape[3], w_shape[4])
    )
    return output, weights_per_head


def fused_attention(
    query,
    key,
    value,
    mask=None,
    *,
    scale,
    is_causal=False,
    rows_may_be_empty=True,
    key_heads_first=False,
):
    """The backend's fastest attention primitive, without repeating K/V.

    Args:
        query, key, value, mask, scale: as in `grouped_attention`.
        is_causal: apply a causal mask (aligned at position 0) in the kernel
            instead of through `mask`; only used when `mask` is None.
        rows_may_be_empty: False when every query row of `mask` is known to
            allow at least one key (causal, window and cache masks in
            self-attention), which skips the guard for empty rows.
        key_heads_first: `key` and `value` are `(B, Hkv, S, D)`, the layout of
            the KV cache. PyTorch's SDPA reads them as they are; elsewhere the
            grouped einsum does (a batched matmul per KV head, no transpose of
            the cache), which is also the decode path of JAX and TensorFlow.

    On JAX, Keras picks cuDNN flash attention by itself where the GPU, dtype
    and shapes allow (`flash_attention=None`); forcing it would fail on CPU.

    Returns:
        `(B, T, H, Dv)` in the dtype of `value`.

    Example:
        >>> q = keras.random.normal((2, 5, 8, 16))
        >>> kv = keras.random.normal((2, 7, 2, 16))
        >>> tuple(fused_attention(q, kv, kv, scale=16**-0.5).shape)
        (2, 5, 8, 16)
    """
    row_has_key = None
    if mask is not None and rows_may_be_empty:
        # Kernels turn an all-masked row into NaN or a uniform average; let such
        # rows attend everywhere, then zero them below.
        row_has_key = rows_with_any_key(mask)
        mask = ops.logical_or(mask, ops.logical_not(row_has_key))
    output = backends.current().fused_attention(
        query,
        key,
        value,
        mask,
        scale=scale,
        is_causal=is_causal,
        key_heads_first=key_heads_first,
    )
    if row_has_key is not None:
        # (B|1, 1|H, T, 1) -> (B|1, T, 1|H, 1) to line up with (B, T, H, D).
        output = output * ops.cast(ops.transpose(row_has_key, (0, 2, 1, 3)), output.dtype)
    return output


def reads_cache_prefix_cheaply():
    """Whether slicing a cache's written prefix is a free view: eager PyTorch.

    Elsewhere a step attends to the whole fixed-length cache under a mask: a
    slice would copy under XLA, and a new length per step would recompile.

    Example:
        >>> reads_cache_prefix_cheaply() == (keras.backend.backend() == "torch")  # doctest: +SKIP
        True
    """
    return backends.current().reads_cache_prefix_cheaply()


# The largest block; causal self-attention goes blockwise from _MIN_BLOCKS of
# these up (512 tokens).
CAUSAL_BLOCK_SIZE = 128
_MIN_BLOCKS = 4
# Query rows per block's matmul (query heads of a group x queries of the block):
# measured best on a 2-core CPU under XLA (JAX), 128 for MHA (blocks of 128),
# 256 for GQA with 4 query heads per KV head (blocks of 64, 2-2.7x faster than
# the former tokens-first blocks of 128).
_ROWS_PER_BLOCK = 256
_MIN_BLOCK_SIZE = 32


def causal_block_size(groups):
    """Queries per block of `blockwise_causal_attention` for `groups` query heads per KV head.

    Example:
        >>> [causal_block_size(g) for g in (1, 2, 4, 8, 16)]
        [128, 128, 64, 32, 32]
    """
    return max(_MIN_BLOCK_SIZE, min(CAUSAL_BLOCK_SIZE, _ROWS_PER_BLOCK // groups))


def prefers_blockwise_causal(query, key):
    """Whether plain causal self-attention of these shapes should go blockwise.

    Only where the backend has no kernel that skips the masked triangle itself:
    JAX on CPU (on GPU, cuDNN flash attention does) and TensorFlow (Keras's
    TensorFlow attention always forms the whole logits). PyTorch's SDPA skips
    it already. Needs a static length, equal for queries and keys.
    """
    length = query.shape[1]
    if not isinstance(length, int) or length != key.shape[1]:
        return False
    if length < _MIN_BLOCKS * CAUSAL_BLOCK_SIZE:
        return False
    return backends.current().prefers_blockwise_causal()


def blockwise_causal_attention(query, key, value, *, scale, block_size=None):
    """Causal self-attention computed one block of queries at a time.

    Block `[start, stop)` of queries attends to keys `[0, stop)` with a causal
    mask; the logits above the diagonal blocks are never formed. Same result
    as `fused_attention(..., is_causal=True)`.

    Queries, keys and values are put heads first once, `(B, Hkv, G, T, D)`
    and `(B, Hkv, S, D)`, so that every block is one batched matmul per KV
    head over the `G x block` query rows of its group, with no transpose per
    block (slicing tokens-first tensors per block and handing them to the
    fused kernel transposed each block, and measured 1.4-2.7x slower on JAX).
    Logits and softmax in float32, as in `grouped_attention`; the softmax's
    division comes after the product with the values (as in flash attention),
    on `T x Dv` outputs rather than `T x S` weights.

    Args:
        query, key, value: as in `fused_attention`, with a static query length
            equal to the key length (self-attention, no cache).
        scale: multiplier of the logits.
        block_size: queries per block; default `causal_block_size(groups)`.

    Example:
        >>> x = keras.random.normal((1, 512, 4, 16))
        >>> tuple(blockwise_causal_attention(x, x, x, scale=0.25, block_size=128).shape)
        (1, 512, 4, 16)
    """
    if block_size is None:
        block_size = causal_block_size(query.shape[2] // key.shape[2])
    # JAX compiles the blocks as one program (backends/jax/attention.py).
    return backends.current().blockwise_causal_attention(
        query, key, value, scale, block_size=block_size
    )


def causal_attention_in_blocks(query, key, value, scale, *, block_size):
    """`blockwise_causal_attention` with a given block size, as the backend runs it."""
    length, num_heads = query.shape[1], query.shape[2]
    num_key_value_heads = key.shape[2]
    grouped = _split_query_groups(query * ops.cast(scale, query.dtype), num_key_value_heads)
    grouped = ops.transpose(grouped, (0, 2, 3, 1, 4))  # (B, Hkv, G, T, D)
    key, value = ops.transpose(key, (0, 2, 1, 3)), ops.transpose(value, (0, 2, 1, 3))
    blocks = []
    for start in range(0, length, block_size):
        stop = min(start + block_size, length)
        logits = ops.einsum("bkgtd,bksd->bkgts", grouped[:, :, :, start:stop], key[:, :, :stop])
        query_positions = ops.arange(start, stop, dtype="int32")[:, None]
        allowed = ops.arange(stop, dtype="int32")[None, :] <= query_positions
        logits = ops.where(allowed, ops.cast(logits, "float32"), _MASKED_LOGIT)
        # Softmax normalised after the product with the values: one division per output
        # element instead of one per logit (every row keeps its own key, so no sum is 0).
        exponentials = ops.exp(logits - ops.max(logits, axis=-1, keepdims=True))
        totals = ops.sum(exponentials, axis=-1, keepdims=True)
        unnormalised = ops.einsum(
            "bkgts,bksd->bkgtd", ops.cast(exponentials, value.dtype), value[:, :, :stop]
        )
        blocks.append(ops.cast(ops.cast(unnormalised, "float32") / totals, value.dtype))
    output = ops.transpose(ops.concatenate(blocks, axis=3), (0, 3, 1, 2, 4))  # (B, T, Hkv, G, Dv)
    shape = ops.shape(output)
    return ops.reshape(output, (shape[0], length, num_heads, value.shape[-1]))


def causal_mask_for(query, key):
    """Boolean (1, 1, T, S) lower-triangular mask aligned at position 0."""
    query_positions = ops.arange(ops.shape(query)[1])[:, None]
    key_positions = ops.arange(ops.shape(key)[1])[None, :]
    return (key_positions <= query_positions)[None, None]
