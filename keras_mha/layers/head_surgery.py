"""Physical removal of attention heads from a built `GroupedQueryAttention`.

The layer's variables are re-created at their smaller shapes in the same order
`build()` creates them (`replace_head_variables`), so that a pruned layer saves to
`.keras` and loads back into a layer built from its (smaller) config. This is the
pattern Keras itself uses to swap variables when quantizing a layer
(`_untrack_variable`). KV-head conversion (`kv_conversion`) re-creates them the same way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np
from keras import ops

from keras_mha.errors import PruningError
from keras_mha.layers.quantization import refuse_quantized

# Variables indexed by query head on this axis.
QUERY_HEAD_AXIS = {
    "query_kernel": 1,
    "query_bias": 0,
    "output_kernel": 0,
    "head_gates": 0,
}
# Variables indexed by KV head on this axis.
KV_HEAD_AXIS = {"key_kernel": 1, "value_kernel": 1, "key_bias": 0, "value_bias": 0}
_UNCHANGED = ("output_bias", "query_norm_scale", "key_norm_scale")
HEAD_VARIABLES = (*QUERY_HEAD_AXIS, *KV_HEAD_AXIS, *_UNCHANGED)


def check_head_indices(heads, num_heads, argument="heads_to_remove"):
    """`heads` as a list of ints: integers (NumPy ones too) in `[0, num_heads)`, no repeats.

    Floats (`1.9`), strings (`"03"`), bools and anything not iterable are
    refused instead of being converted into some other head.

    Example:
        >>> check_head_indices(np.array([3, 1]), 4)
        [3, 1]
        >>> check_head_indices([1.9], 4)
        Traceback (most recent call last):
        ...
        keras_mha.errors.PruningError: `heads_to_remove` has 1.9, which is not a query-head ...
    """
    if isinstance(heads, (str, bytes, dict)) or not isinstance(heads, Iterable):
        raise PruningError(
            f"`{argument}` must be a list of query-head indices; received {heads!r}.",
            key=argument,
            value=heads,
        )
    indices = []
    for head in heads:
        if isinstance(head, (bool, np.bool_)) or not isinstance(head, (int, np.integer)):
            raise PruningError(
                f"`{argument}` has {head!r}, which is not a query-head index; expected integers "
                f"in [0, num_heads={num_heads}).",
                key=argument,
                value=head,
            )
        if not 0 <= head < num_heads:
            raise PruningError(
                f"`{argument}` has the index {int(head)} outside [0, num_heads={num_heads}).",
                key=argument,
                value=int(head),
            )
        if int(head) in indices:
            raise PruningError(
                f"`{argument}` has the index {int(head)} more than once; expected each head once.",
                key=argument,
                value=int(head),
            )
        indices.append(int(head))
    return indices


def plan_head_removal(num_heads, num_key_value_heads, heads_to_remove):
    """Check a removal and return `(kept_query_heads, kept_kv_heads)`.

    A KV head goes only when all of its query heads go; the surviving groups
    must all keep the same number of query heads.

    Example:
        >>> plan_head_removal(8, 2, [1, 5])
        ([0, 2, 3, 4, 6, 7], [0, 1])
    """
    removal = sorted(check_head_indices(heads_to_remove, num_heads))
    kept = [h for h in range(num_heads) if h not in set(removal)]
    if not kept:
        raise PruningError(
            f"`heads_to_remove`={removal} would remove all {num_heads} heads of the layer; "
            "keep at least one."
        )
    group_size = num_heads // num_key_value_heads
    kept_per_group = Counter(h // group_size for h in kept)
    if len(set(kept_per_group.values())) > 1:
        raise PruningError(
            f"`heads_to_remove`={removal} leaves KV groups with different numbers of query "
            f"heads ({dict(sorted(kept_per_group.items()))} per group of {group_size}); "
            "remove whole groups, or the same number of query heads from every kept group."
        )
    return kept, sorted(kept_per_group)


def prune_layer_heads(layer, heads_to_remove):
    """Remove query heads (and emptied KV heads) from `layer` in place.

    Returns the kept query-head indices. See `GroupedQueryAttention.prune_heads`.
    """
    if not layer.built:
        raise PruningError("`prune_heads` needs a built layer; call it on data first.")
    refuse_quantized(layer, "prune_heads", PruningError)
    kept_heads, kept_kv_heads = plan_head_removal(
        layer.num_heads, layer.num_key_value_heads, heads_to_remove
    )
    if len(kept_heads) == layer.num_heads:
        return kept_heads
    values = take_heads(head_variable_values(layer), kept_heads, kept_kv_heads)
    replace_head_variables(
        layer, values, num_heads=len(kept_heads), num_key_value_heads=len(kept_kv_heads)
    )
    return kept_heads


def take_heads(values, query_heads, kv_heads):
    """`values` (`head_variable_values`) with only these query and KV heads, in this order.

    Example:
        >>> take_heads({"key_bias": np.arange(3.0)[:, None]}, [0, 1], [2, 0])["key_bias"]
        array([[2.],
               [0.]])
    """
    taken = dict(values)
    for name, value in values.items():
        if name in QUERY_HEAD_AXIS:
            taken[name] = np.take(value, query_heads, axis=QUERY_HEAD_AXIS[name])
        elif name in KV_HEAD_AXIS:
            taken[name] = np.take(value, kv_heads, axis=KV_HEAD_AXIS[name])
    return taken


def head_variable_values(layer):
    """`{name: NumPy value}` of the layer's variables that `replace_head_variables` re-creates.

    Example:
        >>> layer = GroupedQueryAttention(4, 2, head_dim=8); layer.build((None, None, 16))
        >>> head_variable_values(layer)["key_kernel"].shape
        (16, 2, 8)
    """
    values = {}
    for name in HEAD_VARIABLES:
        variable = getattr(layer, name, None)
        if variable is not None:
            values[name] = ops.convert_to_numpy(variable)
    return values


def replace_head_variables(layer, values, *, num_heads, num_key_value_heads):
    """Re-create `layer`'s head variables for new head counts and assign `values`.

    The variables are created again by `build()` (same order, names, initializers
    and constraints) at the shapes of the new counts, so the layer saves to `.keras`
    and loads back into a layer built from its new config. Compiled functions that
    captured the old variables must be dropped by the caller.

    Args:
        layer: a built `GroupedQueryAttention`.
        values: `{name: array}` for every name of `head_variable_values(layer)`, at the
            new shapes.
        num_heads, num_key_value_heads: the layer's new head counts.

    Example:
        >>> values = head_variable_values(layer)  # doctest: +SKIP
        >>> values["key_kernel"] = values["key_kernel"][:, :1]  # doctest: +SKIP
        >>> ...  # the same for the other KV-head variables  # doctest: +SKIP
        >>> replace_head_variables(layer, values, num_heads=4, num_key_value_heads=1)
        ... # doctest: +SKIP
    """
    for name in values:
        variable = getattr(layer, name)
        layer._untrack_variable(variable)
        # Not `delattr`: Keras's `Layer.__delattr__` runs a full `gc.collect()` per
        # variable, about a second each in a large process (12 per layer); the old
        # buffers are freed by reference counting as soon as they are dropped.
        object.__delattr__(layer, name)

    layer.num_heads = num_heads
    layer.num_key_value_heads = num_key_value_heads
    layer.built = False
    layer._tracker.unlock()
    try:
        layer.build(
            (None, None, layer._query_features),
            (None, None, layer._value_features),
            (None, None, layer._key_features),
        )
    finally:
        layer._tracker.lock()
    for name, value in values.items():
        getattr(layer, name).assign(value)
