"""Choosing heads to remove from a model in one go (outside `fit`)."""

from __future__ import annotations

import warnings

from keras_mha.pruning import policy
from keras_mha.pruning.discovery import require_attention_layers
from keras_mha.pruning.gates import get_head_gates, pruned_heads_from_gates


def layer_states(model):
    """A `policy.LayerState` per attention layer, with the heads gated off now.

    Example:
        >>> from keras_mha.layers import GroupedQueryAttention, MultiHeadAttention
        >>> inputs = keras.Input((8, 16))
        >>> hidden = MultiHeadAttention(4, name="mha")(inputs)
        >>> model = keras.Model(inputs, GroupedQueryAttention(4, 2, name="gqa")(hidden))
        >>> [state.path for state in layer_states(model)]
        ['mha', 'gqa']
    """
    layers = require_attention_layers(model)
    pruned = pruned_heads_from_gates(get_head_gates(model))
    return [
        policy.LayerState(path, layer.num_heads, layer.num_key_value_heads, frozenset(pruned[path]))
        for path, layer in layers.items()
    ]


def heads_to_prune(
    model,
    importance,
    target,
    scope="global",
    gqa_policy="group",
    min_heads_per_layer=1,
):
    """The least important heads to remove so that `target` heads are gone.

    Heads already gated off count towards the target and are not returned.
    When whole units cannot make up the target exactly (a 4-head KV group
    where 2 heads are asked), the most heads not above it are chosen and a
    warning says why.
    The choice follows `keras_mha.pruning.policy` (units that keep every
    layer a regular GQA layer, ascending importance). Nothing is changed:
    apply the result with `set_head_gates` (masking) or `prune_heads(model,
    heads=...)` (physical removal).

    Args:
        model: a model with keras-mha attention layers.
        importance: `{path: scores}` as from `head_importance`.
        target: a fraction in (0, 1) or a number of heads.
        scope: `"global"` or `"per_layer"`.
        gqa_policy: `"group"` or `"query"`.
        min_heads_per_layer: heads every layer keeps (at least 1).

    Returns:
        `{path: sorted head indices to remove}` for every attention layer.

    Raises:
        PruningError: a bad argument, a target that would empty a layer, or
            scores that are missing, of the wrong shape, NaN or infinite.

    Example:
        >>> from keras_mha.layers import MultiHeadAttention
        >>> inputs = keras.Input((8, 16))
        >>> model = keras.Model(inputs, MultiHeadAttention(4, name="attention")(inputs))
        >>> scores = {"attention": np.array([0.4, 0.1, 0.3, 0.2])}
        >>> heads_to_prune(model, scores, target=0.5)
        {'attention': [1, 3]}
    """
    policy.check_target(target)
    policy.check_scope(scope)
    policy.check_policy(gqa_policy)
    policy.check_min_heads(min_heads_per_layer)
    states = layer_states(model)
    policy.check_importance(states, importance)
    policy.check_target_reachable(target, states, scope, gqa_policy, min_heads_per_layer)
    _, _, reason = policy.shortfall(target, states, scope, gqa_policy, min_heads_per_layer)
    if reason is not None:
        warnings.warn(f"heads_to_prune: {reason}", stacklevel=2)
    wanted = policy.target_heads(target, states, scope)
    return policy.select_heads(states, importance, wanted, scope, gqa_policy, min_heads_per_layer)
