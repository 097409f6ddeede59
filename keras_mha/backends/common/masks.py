"""Combining every kind of attention mask into one boolean mask.

All masks are boolean with `True` where a query may attend to a key. The
combined mask has shape `(B | 1, 1 | H, T, S)`, ready for
`attention_kernels.grouped_attention` / `fused_attention`.

Positions make causal, sliding-window and KV-cache masks one formula:
query `i` sits at `query_offset + i`, key `j` at `j`, and

    causal:          key_position <= query_position
    sliding window:  query_position - key_position < window   (Mistral: the
                     window counts the query's own token)
    cache:           key_position < query_offset + query_length (slots that
                     have been written so far)
"""

from __future__ import annotations

from keras import ops


def _static_dim(tensor, axis):
    dim = tensor.shape[axis]
    return dim if isinstance(dim, int) else None


def _check_broadcast(name, mask_shape, target_shape, target_names):
    """Raise if a static mask shape cannot broadcast to the target shape."""
    for got, want, what in zip(mask_shape, target_shape, target_names, strict=True):
        if got is None or want is None:
            continue
        if got not in (1, want):
            raise ValueError(
                f"`{name}` has shape {tuple(mask_shape)}, which does not broadcast to "
                f"({', '.join(target_names)}) = {tuple(target_shape)}: "
                f"its {what} dimension is {got}, expected 1 or {want}."
            )


def normalise_attention_mask(attention_mask, *, batch, query_length, key_length, num_heads):
    """Return `attention_mask` as boolean `(B|1, 1|H, T, S)`, checking its shape.

    Accepted shapes: `(T, S)`, `(B, T, S)` and `(B, 1 | H, T, S)`, each dimension
    either the full size or 1.

    Example:
        >>> m = normalise_attention_mask(ops.ones((2, 3, 4)), batch=2, query_length=3,
        ...                              key_length=4, num_heads=8)
        >>> tuple(m.shape)
        (2, 1, 3, 4)
    """
    mask = ops.cast(attention_mask, "bool")
    rank = len(mask.shape)
    if rank == 2:
        mask = mask[None, None]
    elif rank == 3:
        mask = mask[:, None]
    elif rank != 4:
        raise ValueError(
            f"`attention_mask` must have rank 2 (query_length, key_length), "
            f"3 (batch, query_length, key_length) or 4 (batch, num_heads, query_length, "
            f"key_length); received shape {tuple(attention_mask.shape)}."
        )
    _check_broadcast(
        "attention_mask",
        mask.shape,
        (batch, num_heads, query_length, key_length),
        ("batch", "num_heads", "query_length", "key_length"),
    )
    return mask


def _padding_mask(name, mask, *, batch, length, axis_name):
    mask = ops.cast(mask, "bool")
    if len(mask.shape) != 2:
        raise ValueError(
            f"`{name}` must have shape (batch, {axis_name}); received {tuple(mask.shape)}."
        )
    _check_broadcast(name, mask.shape, (batch, length), ("batch", axis_name))
    return mask


def combine_masks(
    *,
    query,
    key=None,
    num_heads,
    attention_mask=None,
    query_mask=None,
    value_mask=None,
    key_mask=None,
    causal=False,
    sliding_window=None,
    query_offset=None,
    key_length=None,
):
    """Build the combined boolean mask, or None when nothing is masked.

    Args:
        query: projected queries `(B, T, H, D)` (only shapes are read).
        key: projected keys `(B, S, Hkv, D)` (the whole cache when decoding).
        num_heads: number of query heads.
        attention_mask: explicit mask, see `normalise_attention_mask`.
        query_mask, value_mask, key_mask: padding masks `(B, T)` and `(B, S)`,
            as propagated by `Embedding(mask_zero=True)`.
        causal: queries attend only to keys at their position or before.
        sliding_window: queries attend only to the `sliding_window` most recent
            positions (including their own). Implies causal.
        query_offset: position of the first query (KV-cache decoding); when set,
            keys at or beyond `query_offset + T` (unwritten cache slots) are masked.
        key_length: the number of keys `S`, when `key` is None (a KV cache
            stored heads first); an int or a scalar tensor.

    Returns:
        `(mask, is_plain_causal)`: `mask` is boolean `(B|1, 1|H, T, S)` or None;
        `is_plain_causal` says that the only constraint is an aligned causal
        mask, which kernels can apply themselves (`is_causal=True`, mask None).

    Example:
        >>> q = ops.ones((1, 4, 2, 8)); k = ops.ones((1, 4, 2, 8))
        >>> mask, plain = combine_masks(query=q, key=k, num_heads=2, causal=True)
        >>> (mask, plain)
        (None, True)
    """
    batch = _static_dim(query, 0)
    query_length = _static_dim(query, 1)
    if key is not None:
        key_length = ops.shape(key)[1]
    static_key_length = key_length if isinstance(key_length, int) else None
    causal = causal or sliding_window is not None
    has_other = any(m is not None for m in (attention_mask, query_mask, value_mask, key_mask))
    if causal and not has_other and sliding_window is None and query_offset is None:
        return None, True
    if not (causal or has_other or query_offset is not None):
        return None, False

    mask = None

    def merge(current, extra):
        return extra if current is None else ops.logical_and(current, extra)

    if attention_mask is not None:
        mask = normalise_attention_mask(
            attention_mask,
            batch=batch,
            query_length=query_length,
            key_length=static_key_length,
            num_heads=num_heads,
        )
    if query_mask is not None:
        rows = _padding_mask(
            "query_mask", query_mask, batch=batch, length=query_length, axis_name="query_length"
        )
        mask = merge(mask, rows[:, None, :, None])
    for name, padding in (("value_mask", value_mask), ("key_mask", key_mask)):
        if padding is not None:
            cols = _padding_mask(
                name, padding, batch=batch, length=static_key_length, axis_name="key_length"
            )
            mask = merge(mask, cols[:, None, None, :])
    if causal or query_offset is not None:
        query_positions = ops.arange(ops.shape(query)[1], dtype="int32")
        if query_offset is not None:
            query_positions = query_positions + ops.cast(query_offset, "int32")
        query_positions = query_positions[:, None]
        key_positions = ops.arange(key_length, dtype="int32")[None, :]
        if causal:
            positional = key_positions <= query_positions
            if sliding_window is not None:
                positional = ops.logical_and(
                    positional, query_positions - key_positions < sliding_window
                )
        else:
            # Non-causal decoding still must not read unwritten cache slots.
            last_written = query_positions[-1:] if query_offset is not None else None
            positional = ops.broadcast_to(
                key_positions <= last_written,
                (ops.shape(query)[1], key_length),
            )
        mask = merge(mask, positional[None, None])
    return mask, False


def visible_prefix(start, query_length, sliding_window, causal):
    """`(first, stop)`: the cache positions that queries at `start ..` may see.

    Example:
        >>> visible_prefix(10, 1, sliding_window=4, causal=True)
        (7, 11)
    """
    stop = start + query_length
    if sliding_window is None or not causal:
        return 0, stop
    return max(0, start - sliding_window + 1), stop
