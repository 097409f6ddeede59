"""Which kernel computes a call's attention, with the masks that kernel needs.

`attend` takes projected, rotated queries and either this call's keys/values or a
KV cache, and picks the path (the reasons for each are in
docs/concepts/attention-paths.md):

- the generic `keras.ops` path, `attention_kernels.grouped_attention`, when the call
  needs the weights, active dropout or a soft cap (`use_fused` False);
- `attention_kernels.blockwise_causal_attention` for long plain causal self-attention
  where the backend has no kernel that skips the masked triangle (JAX-CPU, TensorFlow);
- `attention_kernels.fused_attention` for other calls without a cache, and for a
  prefill into an empty cache;
- over a cache: `decode_attention.single_query_attention` (one query token written
  into the cache, JAX-CPU), `decode_attention.flat_cache_attention` (TensorFlow),
  else `attention_kernels.fused_attention(..., key_heads_first=True)`.

The backend checks live in `keras_mha.backends` (each backend's
`prefers_blockwise_causal`, `cache_kernel`, `reads_cache_prefix_cheaply`, reached through
`attention_kernels` or `backends.current()`); this module only orders them.

Example:
    >>> options = AttentionOptions(num_heads=8, scale=0.25, causal=True, use_fused=True)
    >>> heads, weights = attend(q, k, v, options, padding_masks.gather(x))  # doctest: +SKIP
    >>> weights is None  # the fused kernels return no weights  # doctest: +SKIP
    True
"""

from __future__ import annotations

from typing import Any, NamedTuple

from keras import ops

from keras_mha import backends
from keras_mha.backends.common import attention_kernels, decode_attention, masks


class AttentionOptions(NamedTuple):
    """How a layer attends in one call: its constants and the call's choices."""

    num_heads: int
    scale: float
    causal: bool
    use_fused: bool
    sliding_window: int | None = None
    logit_soft_cap: float | None = None
    dropout: float = 0.0
    seed_generator: Any = None
    training: bool = False


class CacheUse(NamedTuple):
    """A call's KV cache: as passed in, after this call's write, and where it wrote.

    `index` is None for a read-only (cross-attention) cache, which `written` then is;
    `start` is the Python int behind `index`, or None when it is traced.
    """

    cache: Any
    written: Any
    index: Any = None
    start: int | None = None


def attend(q, k, v, options, padding, attention_mask=None, cache=None):
    """`(heads (B, T, H, Dv), weights (B, H, T, S) or None)` of queries `q` `(B, T, H, D)`.

    Args:
        q: the projected (and rotated) queries.
        k, v: this call's keys and values `(B, S, Hkv, D)`; None with a read-only cache.
        options: an `AttentionOptions`.
        padding: the call's `padding_masks.AttentionInputs` (its masks and kind).
        attention_mask: the caller's mask (over the whole cache when there is one).
        cache: a `CacheUse`, or None.

    Example:
        >>> attend(q, k, v, AttentionOptions(num_heads=8, scale=0.25, causal=False,
        ...                                  use_fused=True), gather(x))  # doctest: +SKIP
    """
    query_mask = padding.query_mask
    if cache is None:
        return _attend_inputs(
            q,
            k,
            v,
            options,
            attention_mask=attention_mask,
            query_mask=query_mask,
            value_mask=padding.value_mask,
            key_mask=padding.key_mask,
            self_attention=padding.self_attention,
        )
    if cache.start == 0 and k.dtype == cache.written.key.dtype:
        # A prefill: the cache holds exactly these keys so far, so attend to them as
        # they are, with the fused / blockwise causal paths. Keys were padded by the
        # cache, not by this call's mask: the caller's mask spans the whole cache.
        if attention_mask is not None:
            max_length = cache.written.max_length
            attention_mask = _mask_prefix(attention_mask, q, max_length, options.num_heads)
        return _attend_inputs(
            q, k, v, options, attention_mask=attention_mask, query_mask=query_mask
        )
    return _attend_cache(q, k, v, cache, attention_mask, query_mask, options)


def _mask_prefix(attention_mask, query, max_length, num_heads):
    """The first `query_length` keys of a mask given over the whole cache."""
    mask = masks.normalise_attention_mask(
        attention_mask,
        batch=query.shape[0],
        query_length=query.shape[1],
        key_length=max_length,
        num_heads=num_heads,
    )
    return mask[..., : query.shape[1]]


def _attend_inputs(
    q,
    k,
    v,
    options,
    *,
    attention_mask=None,
    query_mask=None,
    value_mask=None,
    key_mask=None,
    self_attention=True,
):
    """Attention of `q` over keys/values `(B, S, Hkv, D)` projected in this call."""
    mask, plain_causal = masks.combine_masks(
        query=q,
        key=k,
        num_heads=options.num_heads,
        attention_mask=attention_mask,
        query_mask=query_mask,
        value_mask=value_mask,
        key_mask=key_mask,
        causal=options.causal,
        sliding_window=options.sliding_window,
    )
    if plain_causal and not options.use_fused:
        # Only the fused kernels apply a causal mask by themselves.
        mask, plain_causal = attention_kernels.causal_mask_for(q, k), False
    if k.dtype != q.dtype:
        k, v = ops.cast(k, q.dtype), ops.cast(v, q.dtype)
    if not options.use_fused:
        return _generic_attention(q, k, v, mask, options)
    if plain_causal and attention_kernels.prefers_blockwise_causal(q, k):
        return attention_kernels.blockwise_causal_attention(q, k, v, scale=options.scale), None
    # Causal, window and cache masks always leave a query its own key in
    # self-attention; only these masks can empty a row.
    rows_may_be_empty = not self_attention or any(
        m is not None for m in (attention_mask, query_mask, value_mask, key_mask)
    )
    heads = attention_kernels.fused_attention(
        q,
        k,
        v,
        mask,
        scale=options.scale,
        is_causal=plain_causal,
        rows_may_be_empty=rows_may_be_empty,
    )
    return heads, None


# A backend's `cache_kernel` names for one query token written into the cache: they read
# the cache before or after this step's write (decode_attention.py).
_SINGLE_QUERY_KERNELS = ("two_fusions", "single_query")


def _attend_cache(q, k, v, cache, attention_mask, query_mask, options):
    """Attention of `q` over the cache's written positions (all of a read-only cache)."""
    keys, values = cache.written.key, cache.written.value
    start = cache.start
    # A read-only cache (`index` None) has no offset: every position counts.
    key_length, offset, causal = cache.written.max_length, cache.index, options.causal
    if start is not None and attention_kernels.reads_cache_prefix_cheaply():
        # Attend to the written prefix only (a free view here), which needs no mask
        # for a single token.
        first, stop = masks.visible_prefix(start, q.shape[1], options.sliding_window, causal)
        keys, values = keys[:, :, first:stop], values[:, :, first:stop]
        if attention_mask is not None:
            attention_mask = masks.normalise_attention_mask(
                attention_mask,
                batch=q.shape[0],
                query_length=q.shape[1],
                key_length=key_length,
                num_heads=options.num_heads,
            )[..., first:stop]
        key_length, offset = stop - first, start - first
        if q.shape[1] == 1 and attention_mask is None and query_mask is None:
            offset = None  # Every key of the prefix is visible: no mask at all.
    mask = None
    if offset is not None or attention_mask is not None or query_mask is not None:
        mask, _ = masks.combine_masks(
            query=q,
            key_length=key_length,
            num_heads=options.num_heads,
            attention_mask=attention_mask,
            query_mask=query_mask,
            causal=causal and offset is not None,
            sliding_window=options.sliding_window if offset is not None else None,
            query_offset=offset,
        )
    if keys.dtype != q.dtype:
        keys, values = ops.cast(keys, q.dtype), ops.cast(values, q.dtype)
    if not options.use_fused:
        return _generic_attention(q, keys, values, mask, options, key_heads_first=True)
    rows_may_be_empty = attention_mask is not None or query_mask is not None
    kernel = backends.current().cache_kernel(q, keys)
    if kernel in _SINGLE_QUERY_KERNELS and cache.index is not None and keys.dtype == q.dtype:
        if kernel == "two_fusions":
            # Each cache buffer read by one fusion: XLA then updates it in place.
            heads = decode_attention.two_fusion_attention(
                q, keys, values, mask, scale=options.scale, rows_may_be_empty=rows_may_be_empty
            )
            return heads, None
        # The cache as it was, plus this step's key: XLA then copies it less.
        heads = decode_attention.single_query_attention(
            q,
            ops.cast(k, q.dtype),
            ops.cast(v, q.dtype),
            cache.cache.key,
            cache.cache.value,
            mask,
            position=cache.index if start is None else start,
            scale=options.scale,
            rows_may_be_empty=rows_may_be_empty,
        )
        return heads, None
    if kernel == "flat":
        heads = decode_attention.flat_cache_attention(
            q, keys, values, mask, scale=options.scale, rows_may_be_empty=rows_may_be_empty
        )
        return heads, None
    heads = attention_kernels.fused_attention(
        q,
        keys,
        values,
        mask,
        scale=options.scale,
        rows_may_be_empty=rows_may_be_empty,
        key_heads_first=True,
    )
    return heads, None


def _generic_attention(q, k, v, mask, options, key_heads_first=False):
    return attention_kernels.grouped_attention(
        q,
        k,
        v,
        mask,
        scale=options.scale,
        logit_soft_cap=options.logit_soft_cap,
        dropout_rate=options.dropout,
        seed_generator=options.seed_generator,
        training=options.training,
        return_weights=True,
        key_heads_first=key_heads_first,
    )
