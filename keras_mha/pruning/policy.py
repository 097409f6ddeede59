"""Which heads to remove: targets, GQA policies and `min_heads_per_layer`.

Heads are removed in *units* that keep every layer a regular GQA layer (all
surviving KV groups with the same number of query heads), so that whatever is
gated off can later be removed physically:

- `"group"` policy: a unit is a whole KV group, its KV head and all its query
  heads (for MHA, a group is one head).
- `"query"` policy: a unit is one query head from *every* surviving group (the
  least important one left in each), so groups shrink together and every KV
  head stays. Each group keeps at least one query head. For MHA
  (one query head per group) this is the same as `"group"`.

Within a layer, units are taken in ascending order of their heads' mean
importance, and only while the layer keeps at least `min_heads_per_layer`
heads. Targets count query heads; when units are bigger than one head, the
number removed is the largest reachable one not above the target. With
`scope="per_layer"` each layer takes as many units as fit its own target.
With `scope="global"` the number of units per layer is chosen so that the
most heads (up to the target) go at the least summed importance, a small
knapsack over layers: for one-head units (MHA) this is exactly the global
ranking of Michel et al.; with bigger units it does not get stuck short of
the target the way a greedy pass can (for example, three cheap MHA heads
taken first leaving no room for a two-head GQA group when two MHA heads and
the group would make exactly four).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

POLICIES = ("group", "query")
SCOPES = ("global", "per_layer")


@dataclass(frozen=True)
class LayerState:
    """What the policy needs to know about one attention layer.

    Example:
        >>> LayerState("attention", num_heads=8, num_key_value_heads=2, pruned=frozenset({0}))
    """

    path: str
    num_heads: int
    num_key_value_heads: int
    pruned: frozenset = frozenset()

    @property
    def group_size(self):
        return self.num_heads // self.num_key_value_heads

    def kept_by_group(self):
        """`{kv_group: [kept query heads]}` over groups that still have heads."""
        groups = {}
        for head in range(self.num_heads):
            if head not in self.pruned:
                groups.setdefault(head // self.group_size, []).append(head)
        return groups


def check_policy(gqa_policy):
    """Raise a ValueError naming `gqa_policy` unless it is a known policy.

    Example:
        >>> check_policy("group")
    """
    if gqa_policy not in POLICIES:
        raise ValueError(f"`gqa_policy`={gqa_policy!r} is unknown; expected one of {POLICIES}.")


def check_scope(scope):
    """Raise a ValueError naming `scope` unless it is `"global"` or `"per_layer"`.

    Example:
        >>> check_scope("global")
    """
    if scope not in SCOPES:
        raise ValueError(f"`scope`={scope!r} is unknown; expected one of {SCOPES}.")


def check_target(target):
    """Validate a target: a fraction in (0, 1) or a positive number of heads.

    Example:
        >>> check_target(0.5); check_target(6)
    """
    if isinstance(target, bool) or not isinstance(target, (int, float, np.integer, np.floating)):
        raise ValueError(
            f"`target`={target!r} must be a fraction of heads in (0, 1) or a positive integer "
            "number of heads."
        )
    if isinstance(target, (float, np.floating)):
        if not 0.0 < target < 1.0:
            raise ValueError(
                f"`target`={target!r} as a fraction must be in (0, 1): 1.0 would remove every "
                "head; pass an integer to give a number of heads."
            )
    elif target <= 0:
        raise ValueError(f"`target`={target!r} must be a positive number of heads.")


def check_min_heads(min_heads_per_layer):
    """`min_heads_per_layer` must be a positive integer: a layer never loses every head.

    Example:
        >>> check_min_heads(1)
    """
    if (
        isinstance(min_heads_per_layer, bool)
        or not isinstance(min_heads_per_layer, (int, np.integer))
        or min_heads_per_layer < 1
    ):
        raise ValueError(
            f"`min_heads_per_layer`={min_heads_per_layer!r} must be an integer >= 1 (a layer "
            "never loses every head)."
        )


def round_half_up(value):
    """Round to the nearest integer, halves up (not to even as `round` does).

    Example:
        >>> round_half_up(2.5)
        3
    """
    return int(math.floor(value + 0.5))


def heads_for_target(target, num_heads):
    """Number of heads a target stands for out of `num_heads` (fraction rounded half up).

    Example:
        >>> heads_for_target(0.3, 72), heads_for_target(5, 72)
        (22, 5)
    """
    if isinstance(target, (float, np.floating)):
        return round_half_up(target * num_heads)
    return int(target)


def removal_units(state, importance, gqa_policy):
    """The next units of `state` that could be removed, in removal order.

    Args:
        state: a `LayerState`.
        importance: its scores, one per query head.
        gqa_policy: `"group"` or `"query"`.

    Returns:
        A list of `(score, heads)`; heads are query-head indices.

    Example:
        >>> state = LayerState("a", num_heads=4, num_key_value_heads=2)
        >>> removal_units(state, np.array([0.1, 0.4, 0.3, 0.2]), "query")
        [(0.15, [0, 3])]
    """
    check_policy(gqa_policy)
    groups = state.kept_by_group()
    sizes = {len(heads) for heads in groups.values()}
    if len(sizes) > 1:
        raise ValueError(
            f"Layer {state.path!r} has gated-off heads {sorted(state.pruned)} that leave its KV "
            f"groups unequal ({ {k: len(v) for k, v in groups.items()} } kept query heads); its "
            "gates cannot be removed physically. Reset its gates to ones."
        )
    importance = np.asarray(importance, dtype="float64")
    if gqa_policy == "group" or state.group_size == 1:
        units = [(float(np.mean(importance[heads])), heads) for heads in groups.values()]
        order = sorted(range(len(units)), key=lambda i: (units[i][0], i))
        return [units[i] for i in order]
    ranked = [sorted(heads, key=lambda h: (importance[h], h)) for heads in groups.values()]
    kept_per_group = len(ranked[0])
    units = []
    for rank in range(kept_per_group - 1):  # Every group keeps at least one query head.
        heads = sorted(group[rank] for group in ranked)
        units.append((float(np.mean(importance[heads])), heads))
    return units


def _kept(state):
    return state.num_heads - len(state.pruned)


def removable_heads(state, gqa_policy, min_heads_per_layer):
    """The most heads this layer can still lose under the policy and the minimum.

    Example:
        >>> removable_heads(LayerState("a", 8, 2), "query", 1)
        6
    """
    kept, removed = _kept(state), 0
    for _, heads in removal_units(state, np.zeros(state.num_heads), gqa_policy):
        if kept - removed - len(heads) < min_heads_per_layer:
            break
        removed += len(heads)
    return removed


def target_heads(target, states, scope):
    """Total heads to have removed for `target`: an int (global) or `{path: int}`.

    Example:
        >>> target_heads(0.5, [LayerState("a", 8, 8), LayerState("b", 4, 4)], "per_layer")
        {'a': 4, 'b': 2}
    """
    check_scope(scope)
    if scope == "global":
        return heads_for_target(target, sum(state.num_heads for state in states))
    return {state.path: heads_for_target(target, state.num_heads) for state in states}


def check_target_reachable(target, states, scope, gqa_policy, min_heads_per_layer):
    """Raise a ValueError when `target` needs more heads than the layers may lose.

    Counts from the layers' full head counts (nothing pruned yet).

    Example:
        >>> check_target_reachable(8, [LayerState("a", 8, 8)], "global", "group", 1)
        Traceback (most recent call last):
        ValueError: `target`=8 asks to remove 8 of 8 heads, ...
    """
    fresh = [LayerState(s.path, s.num_heads, s.num_key_value_heads) for s in states]
    wanted = target_heads(target, fresh, scope)
    if scope == "global":
        total = sum(state.num_heads for state in fresh)
        most = sum(removable_heads(state, gqa_policy, min_heads_per_layer) for state in fresh)
        if wanted > most:
            raise ValueError(
                f"`target`={target!r} asks to remove {wanted} of {total} heads, but with "
                f"`min_heads_per_layer`={min_heads_per_layer} and `gqa_policy`={gqa_policy!r} "
                f"at most {most} can go (a layer never loses every head)."
            )
        return
    for state in fresh:
        most = removable_heads(state, gqa_policy, min_heads_per_layer)
        if wanted[state.path] > most:
            raise ValueError(
                f"`target`={target!r} with scope='per_layer' asks to remove {wanted[state.path]} "
                f"of the {state.num_heads} heads of layer {state.path!r}, but with "
                f"`min_heads_per_layer`={min_heads_per_layer} and `gqa_policy`={gqa_policy!r} "
                f"at most {most} can go (a layer never loses every head)."
            )


def select_heads(states, importance, wanted, scope, gqa_policy, min_heads_per_layer):
    """New heads to gate off so that `wanted` heads are removed in total.

    Args:
        states: `LayerState`s, with the heads already gated off in `pruned`.
        importance: `{path: scores}`.
        wanted: total heads to have removed (already pruned ones included):
            an int for `scope="global"`, `{path: int}` for `"per_layer"`.
        scope: `"global"` or `"per_layer"`.
        gqa_policy: `"group"` or `"query"`.
        min_heads_per_layer: heads each layer keeps at least.

    Returns:
        `{path: sorted list of newly removed heads}` (empty lists included).

    Example:
        >>> states = [LayerState("a", 4, 4), LayerState("b", 4, 4)]
        >>> scores = {"a": np.array([.9, .1, .5, .6]), "b": np.array([.2, .8, .7, .3])}
        >>> select_heads(states, scores, 3, "global", "group", 1)
        {'a': [1], 'b': [0, 3]}
    """
    check_scope(scope)
    options = {
        state.path: _prefix_options(state, importance[state.path], gqa_policy, min_heads_per_layer)
        for state in states
    }
    if scope == "per_layer":
        chosen = {}
        for state in states:
            need = wanted[state.path] - len(state.pruned)
            fitting = [option for option in options[state.path] if option[0] <= need]
            chosen[state.path] = sorted(fitting[-1][2])
        return chosen
    budget = wanted - sum(len(state.pruned) for state in states)
    # Knapsack over layers, each taking a prefix of its units: cheapest way to
    # remove exactly `total` heads, for every reachable total up to the budget.
    cost = {0: 0.0}
    back = []  # per layer: {total: (total before this layer, prefix length taken)}
    for state in states:
        new_cost, pointers = {}, {}
        for before, spent in cost.items():
            for length, (count, option_cost, _) in enumerate(options[state.path]):
                total = before + count
                if total > budget:
                    break
                if total not in new_cost or spent + option_cost < new_cost[total]:
                    new_cost[total] = spent + option_cost
                    pointers[total] = (before, length)
        cost = new_cost
        back.append(pointers)
    total = max(cost)
    chosen = {}
    for state, pointers in zip(reversed(states), reversed(back), strict=True):
        total, length = pointers[total]
        chosen[state.path] = sorted(options[state.path][length][2])
    return {state.path: chosen[state.path] for state in states}


def _prefix_options(state, importance, gqa_policy, min_heads_per_layer):
    """`[(heads removed, summed importance, heads)]` for taking the first k units."""
    importance = np.asarray(importance, dtype="float64")
    options = [(0, 0.0, [])]
    for _, heads in removal_units(state, importance, gqa_policy):
        count, cost, taken = options[-1]
        if _kept(state) - count - len(heads) < min_heads_per_layer:
            break
        options.append((count + len(heads), cost + float(np.sum(importance[heads])), taken + heads))
    return options
