"""Fewer KV heads for a built `GroupedQueryAttention`: pool its key/value heads in groups.

Converting `num_key_value_heads` from `Hkv` to `N` (a divisor of `Hkv`) makes new KV
head `j` out of the old KV heads `j * r ... (j + 1) * r - 1`, with `r = Hkv / N`: those
whose query heads become new KV head `j`'s query heads under the layer's layout (query
head `h` uses KV head `h // (num_heads / num_key_value_heads)`). Methods:

- `"mean"`: the mean of the group's key and value kernels and biases (Ainslie et al.
  2023, "GQA: Training Generalized Multi-Query Transformer Models from Multi-Head
  Checkpoints", section 2.1);
- `"first"`: the group's first KV head (the paper's baseline);
- `"regroup"`: first reorder the heads (`regroup_order`, `permute_kv_heads`) so that KV
  heads whose weights are most alike fall in one group, then take the mean. Each KV head
  moves with its query heads, their rows and biases, their gates and their rows of the
  output projection, so the reordering alone leaves the layer's outputs unchanged; the
  mean then loses less.

The variables are re-created at their new shapes in `build()` order
(`head_surgery.replace_head_variables`), so the converted layer saves to `.keras` and
loads back. A `MultiHeadAttention` (whose config cannot state fewer KV heads) becomes a
`GroupedQueryAttention`, or a `MultiQueryAttention` for one KV head. Formulas and
measurements: `docs/concepts/kv-head-conversion.md`.

Example:
    >>> layer = MultiHeadAttention(num_heads=8, head_dim=16)
    >>> layer.build((None, None, 64))
    >>> convert_layer_kv_heads(layer, 2, method="mean")
    [0, 1, 2, 3, 4, 5, 6, 7]
    >>> type(layer).__name__, layer.num_key_value_heads, tuple(layer.key_kernel.shape)
    ('GroupedQueryAttention', 2, (64, 2, 16))
"""

from __future__ import annotations

import numpy as np

from keras_mha.errors import PruningError
from keras_mha.layers.head_surgery import (
    KV_HEAD_AXIS,
    head_variable_values,
    replace_head_variables,
    take_heads,
)
from keras_mha.layers.quantization import refuse_quantized

METHODS = ("mean", "first", "regroup")
# Key and value variables whose distance `regroup` compares, kernels and biases alike.
_COMPARED = (("key_kernel", "key_bias"), ("value_kernel", "value_bias"))
# Swaps tried by `regroup_order` before it settles: far more than layers of up to 128 KV
# heads need (each swap lowers the objective, which is bounded below).
_MAX_SWAPS = 10_000


def check_kv_conversion(layer, num_key_value_heads, method="mean", *, where=None):
    """Refuse a conversion `layer` cannot take; returns the class the layer will have.

    Args:
        layer: a built `GroupedQueryAttention` (or subclass).
        num_key_value_heads: the new KV-head count: a positive int dividing the layer's
            current `num_key_value_heads`.
        method: one of `METHODS`.
        where: the layer's path, named in messages.

    Raises:
        PruningError: a count that is not a positive integer, larger than today's or not
            a divisor of it; an unknown method; an unbuilt layer; a subclass whose config
            cannot state the new count.

    Example:
        >>> layer = GroupedQueryAttention(8, 4); layer.build((None, None, 32))
        >>> check_kv_conversion(layer, 3)
        Traceback (most recent call last):
        keras_mha.errors.PruningError: `num_key_value_heads`=3 does not divide the 4 KV heads ...
    """
    GroupedQueryAttention, MultiHeadAttention, MultiQueryAttention = map(
        _attention_class, ("GroupedQueryAttention", "MultiHeadAttention", "MultiQueryAttention")
    )
    name = f"layer {where!r}" if where else f"layer {getattr(layer, 'name', '')!r}"
    if method not in METHODS:
        raise PruningError(
            f"`method`={method!r} is not a KV-head conversion method; expected one of "
            f"{', '.join(METHODS)}.",
            key="method",
            value=method,
        )
    target = num_key_value_heads
    if isinstance(target, (bool, np.bool_)) or not isinstance(target, (int, np.integer)):
        raise PruningError(
            f"`num_key_value_heads`={target!r} is not a number of KV heads; expected a "
            "positive integer.",
            key="num_key_value_heads",
            value=target,
        )
    if GroupedQueryAttention is None or not isinstance(layer, GroupedQueryAttention):
        raise PruningError(
            f"{name} is a {type(layer).__name__}; expected a keras_mha GroupedQueryAttention "
            "(or MultiHeadAttention / MultiQueryAttention).",
            key="layer",
        )
    if not layer.built:
        raise PruningError(
            f"{name} is not built; call the model on data (or build it) before converting.",
            key="layer",
        )
    current = layer.num_key_value_heads
    if target < 1 or target > current:
        raise PruningError(
            f"`num_key_value_heads`={int(target)} for {name}, which has {current} KV heads "
            f"for {layer.num_heads} query heads; expected 1 to {current}: conversion pools "
            "KV heads, it cannot add any.",
            key="num_key_value_heads",
            value=int(target),
        )
    if current % target:
        divisors = [d for d in range(1, current + 1) if current % d == 0]
        raise PruningError(
            f"`num_key_value_heads`={int(target)} does not divide the {current} KV heads of "
            f"{name}; each new KV head pools the same number of old ones: expected one of "
            f"{divisors}.",
            key="num_key_value_heads",
            value=int(target),
        )
    # MHA and MQA fix the KV-head count, so their configs do not state it.
    fixed_count = (MultiHeadAttention, MultiQueryAttention)
    if target == current or not isinstance(layer, fixed_count):
        return type(layer)
    if type(layer) in fixed_count:
        return MultiQueryAttention if target == 1 else GroupedQueryAttention
    raise PruningError(
        f"{name} is a {type(layer).__name__}, a subclass of {type(layer).__mro__[1].__name__}, "
        "whose config does not state `num_key_value_heads`, so a converted layer would not "
        "load back from .keras; expected a GroupedQueryAttention (or a subclass of it).",
        key="layer",
    )


def _attention_class(name):
    """A keras_mha attention class by the name it is registered under for `.keras` files
    (None before `keras_mha.layers` is imported): the layer classes call this module, so
    importing them here would be an import cycle."""
    import keras

    return keras.saving.get_registered_object(f"keras_mha>{name}")


def kv_groups(num_key_value_heads, target):
    """The old KV heads each new KV head pools, in the layer's layout.

    Example:
        >>> kv_groups(6, 2)
        [[0, 1, 2], [3, 4, 5]]
    """
    size = num_key_value_heads // target
    return [list(range(j * size, (j + 1) * size)) for j in range(target)]


def query_order(kv_order, num_heads, num_key_value_heads):
    """The query heads, in the order that moves each with its KV head to `kv_order`.

    Example:
        >>> query_order([1, 0], num_heads=4, num_key_value_heads=2)
        [2, 3, 0, 1]
    """
    group = num_heads // num_key_value_heads
    return [kv * group + member for kv in kv_order for member in range(group)]


def _kv_features(values):
    """One row per KV head: its key and value weights, each side scaled to unit RMS.

    The scaling keeps keys and values on an equal footing in the distance even when
    their kernels differ in scale.
    """
    parts = []
    for names in _COMPARED:
        side = [
            np.moveaxis(np.asarray(values[name], dtype=np.float64), KV_HEAD_AXIS[name], 0)
            for name in names
            if name in values
        ]
        side = np.concatenate([part.reshape(part.shape[0], -1) for part in side], axis=1)
        parts.append(side / max(float(np.sqrt(np.mean(side**2))), 1e-12))
    return np.concatenate(parts, axis=1)


def regroup_order(layer, num_key_value_heads):
    """An order of the layer's KV heads whose consecutive groups hold the most alike heads.

    Groups of `r = num_key_value_heads_now / num_key_value_heads` heads are chosen to
    make the mean pooling lose least: the sum over groups of each head's squared
    distance to its group's mean (keys and values, kernels and biases, each side scaled
    to unit RMS). Starting from the layer's own grouping, the best swap of two heads
    between groups is made while one lowers that sum, so the result never loses more
    than plain `mean` by this measure. Groups are listed by their first head.

    Example:
        >>> layer = MultiHeadAttention(num_heads=4, head_dim=8)
        >>> layer.build((None, None, 32))
        >>> sorted(regroup_order(layer, 2))
        [0, 1, 2, 3]
    """
    values = head_variable_values(layer)
    features = _kv_features(values)
    squared = np.sum(features**2, axis=1)
    distances = np.maximum(squared[:, None] + squared[None, :] - 2 * features @ features.T, 0.0)
    groups = kv_groups(layer.num_key_value_heads, num_key_value_heads)
    size = len(groups[0])
    if size == 1 or len(groups) == 1:
        return list(range(layer.num_key_value_heads))
    membership = np.empty(layer.num_key_value_heads, dtype=np.int64)
    for index, group in enumerate(groups):
        membership[group] = index
    for _ in range(_MAX_SWAPS):
        # to_group[i, g]: summed distance of head i to the heads of group g.
        to_group = np.stack(
            [distances[:, membership == g].sum(axis=1) for g in range(len(groups))], axis=1
        )
        own = to_group[np.arange(len(membership)), membership]
        # Moving i into j's group and j into i's: i leaves its own group (own[i]) and
        # joins j's minus j; likewise for j. The group cost is sum of pairs / size.
        gain_i = to_group[:, membership] - own[:, None] - distances
        change = gain_i + gain_i.T
        change[membership[:, None] == membership[None, :]] = np.inf
        i, j = np.unravel_index(np.argmin(change), change.shape)
        if change[i, j] >= -1e-9 * max(float(distances.max()), 1e-30):
            break
        membership[i], membership[j] = membership[j], membership[i]
    chosen = [sorted(np.flatnonzero(membership == g).tolist()) for g in range(len(groups))]
    return [head for group in sorted(chosen) for head in group]


def _permuted(values, kv_order, num_heads, num_key_value_heads):
    queries = query_order(kv_order, num_heads, num_key_value_heads)
    return take_heads(values, queries, kv_order), queries


def permute_kv_heads(layer, kv_order):
    """Reorder the layer's KV heads, each with its query heads; outputs stay the same.

    Moves the key/value kernels and biases of each KV head to its new place, and with
    it its query heads' kernel columns, biases, gates and output-projection rows.

    Args:
        layer: a built `GroupedQueryAttention`.
        kv_order: a permutation of `range(num_key_value_heads)`: new KV head `i` is old
            KV head `kv_order[i]`.

    Returns:
        The query-head order: new query head `i` is old query head `order[i]`.

    Example:
        >>> layer = GroupedQueryAttention(4, 2, head_dim=8); layer.build((None, None, 16))
        >>> permute_kv_heads(layer, [1, 0])
        [2, 3, 0, 1]
    """
    kv_order = [int(head) for head in kv_order]
    if sorted(kv_order) != list(range(layer.num_key_value_heads)):
        raise PruningError(
            f"`kv_order`={kv_order} is not a permutation of the layer's "
            f"{layer.num_key_value_heads} KV heads.",
            key="kv_order",
            value=kv_order,
        )
    values, queries = _permuted(
        head_variable_values(layer), kv_order, layer.num_heads, layer.num_key_value_heads
    )
    for name, value in values.items():
        getattr(layer, name).assign(value)
    return queries


def pooled_kv_values(values, num_key_value_heads, method):
    """`values` with the KV-head variables pooled to `num_key_value_heads` heads.

    `"mean"` averages each group of consecutive KV heads (in float64, then the
    variable's dtype); `"first"` keeps each group's first head. Other variables are
    returned as they are.

    Example:
        >>> kernel = np.arange(8.0).reshape(1, 4, 2)
        >>> pooled_kv_values({"key_kernel": kernel}, 2, "mean")["key_kernel"].tolist()
        [[[1.0, 2.0], [5.0, 6.0]]]
    """
    pooled = dict(values)
    for name, axis in KV_HEAD_AXIS.items():
        if name not in values:
            continue
        value = np.asarray(values[name])
        shape = list(value.shape)
        grouped = value.reshape(
            shape[:axis]
            + [num_key_value_heads, shape[axis] // num_key_value_heads]
            + shape[axis + 1 :]
        )
        if method == "first":
            pooled[name] = np.take(grouped, 0, axis=axis + 1)
        else:
            pooled[name] = grouped.astype(np.float64).mean(axis=axis + 1).astype(value.dtype)
    return pooled


def convert_layer_kv_heads(layer, num_key_value_heads, method="mean"):
    """Convert `layer` in place to `num_key_value_heads` KV heads (see the module docstring).

    Returns:
        The query-head order: new query head `i` is old query head `order[i]`
        (`list(range(num_heads))` except for `"regroup"`).
    """
    new_class = check_kv_conversion(layer, num_key_value_heads, method)
    refuse_quantized(layer, "convert_kv_heads", PruningError)
    num_heads, current = layer.num_heads, layer.num_key_value_heads
    target = int(num_key_value_heads)
    queries = list(range(num_heads))
    if target == current:
        return queries
    values = head_variable_values(layer)
    if method == "regroup":
        values, queries = _permuted(values, regroup_order(layer, target), num_heads, current)
    values = pooled_kv_values(values, target, "first" if method == "first" else "mean")
    replace_head_variables(layer, values, num_heads=num_heads, num_key_value_heads=target)
    if new_class is not type(layer):
        # MHA's config drops `num_key_value_heads`: the layer is now a GQA (or MQA) one.
        layer.__class__ = new_class
    return queries
