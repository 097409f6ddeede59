"""The tensors and padding masks one call of an attention layer works on.

Keras hands padding masks to a layer in two ways: attached to a tensor made by
`Embedding(mask_zero=True)` (its `_keras_mask`), and as `call` arguments (`mask`
when the layer was given a single tensor, `query_mask` / `value_mask` / `key_mask`
when it was given several). `gather` resolves both into one `AttentionInputs`:
`value` and `key` default to `query` (self-attention), and each tensor's mask to the
one Keras propagated, the value mask of self-attention being the query's.

Example:
    >>> x = keras.layers.Embedding(10, 4, mask_zero=True)(np.array([[3, 5, 0]]))
    >>> inputs = gather(x)
    >>> inputs.self_attention, inputs.value is x
    (True, True)
    >>> keras.ops.convert_to_numpy(inputs.value_mask).tolist()
    [[True, True, False]]
"""

from __future__ import annotations

from typing import Any, NamedTuple


class AttentionInputs(NamedTuple):
    """The query, value and key of a call, their padding masks (or None), and its kind."""

    query: Any
    value: Any
    key: Any
    query_mask: Any
    value_mask: Any
    key_mask: Any
    self_attention: bool


def propagated_mask(tensor):
    """The padding mask Keras attached to `tensor` (e.g. by `Embedding(mask_zero=True)`)."""
    return getattr(tensor, "_keras_mask", None)


def gather(
    query, value=None, key=None, *, query_mask=None, value_mask=None, key_mask=None, mask=None
):
    """The call's tensors with every padding mask that applies to them.

    Masks given as arguments win over propagated ones; `key_mask` is only looked
    for when `key` is a tensor of its own (Keras ignores it when `key is value`).

    Example:
        >>> q, v = np.ones((1, 2, 4)), np.ones((1, 3, 4))
        >>> gather(q, v).self_attention
        False
    """
    self_attention = value is None
    if query_mask is None:
        query_mask = mask if mask is not None else propagated_mask(query)
    if self_attention and value_mask is None:
        value_mask = query_mask
    value = query if value is None else value
    key = value if key is None else key
    if value_mask is None:
        value_mask = propagated_mask(value)
    if key_mask is None and key is not value:
        key_mask = propagated_mask(key)
    return AttentionInputs(query, value, key, query_mask, value_mask, key_mask, self_attention)
