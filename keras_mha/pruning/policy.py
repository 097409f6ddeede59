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
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from keras_mha.errors import PruningError

POLICIES = ("group", "query")
SCOPES = ("global", "per_layer")


@dataclass(frozen=True)
class LayerState:
    """What the policy needs to know about one attention layer.

    Example:
        >>> LayerState("attention", num_heads=8, num_key_value_heads=2, pruned=frozenset({0}))
        LayerState(path='attention', num_heads=8, num_key_value_heads=2, pruned=frozenset({0}))
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
        raise PruningError(f"`gqa_policy`={gqa_policy!r} is unknown; expected one of {POLICIES}.")


def check_scope(scope):
    """Raise a ValueError naming `scope` unless it is `"global"` or `"per_layer"`.

    Example:
        >>> check_scope("global")
    """
    if scope not in SCOPES:
        raise PruningError(f"`scope`={scope!r} is unknown; expected one of {SCOPES}.")


def check_target(target):
    """Validate a target: a fraction in (0, 1) or a positive number of heads.

    Example:
        >>> check_target(0.5); check_target(6)
    """
    if isinstance(target, bool) or not isinstance(target, (int, float, np.integer, np.floating)):
        raise PruningError(
            f"`target`={target!r} must be a fraction of heads in (0, 1) or a positive integer "
            "number of heads."
        )
    if isinstance(target, (float, np.floating)):
        if not math.isfinite(target):
            raise PruningError(
                f"`target`={target!r} must be a finite fraction of heads in (0, 1) or a positive "
                "integer number of heads."
            )
        if not 0.0 < target < 1.0:
            raise PruningError(
                f"`target`={target!r} as a fraction must be in (0, 1): 1.0 would remove every "
                "head; pass an integer to give a number of heads."
            )
    elif target <= 0:
        raise PruningError(f"`target`={target!r} must be a positive number of heads.")


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
        raise PruningError(
            f"`min_heads_per_layer`={min_heads_per_layer!r} must be an integer >= 1 (a layer "
            "never loses every head)."
        )


def check_importance(states, importance):
    """Every layer has one finite real score per query head, or a `PruningError` says which not.

    NaN or infinite scores (a loss that overflowed, a NaN in the data) would
    rank heads arbitrarily, so they are refused rather than pruned on.

    Example:
        >>> check_importance([LayerState("a", 2, 2)], {"a": np.array([0.5, np.nan])})
        Traceback (most recent call last):
        ...
        keras_mha.errors.PruningError: `importance['a']` has non-finite scores [nan] for heads ...
    """
    if not isinstance(importance, Mapping):
        raise PruningError(
            f"`importance` must be a dict {{layer path: scores}} as from head_importance; "
            f"received a {type(importance).__name__}."
        )
    for state in states:
        scores = importance.get(state.path)
        values = None if scores is None else np.asarray(scores)
        if values is None or values.shape != (state.num_heads,) or values.dtype.kind not in "iuf":
            received = "nothing" if values is None else f"shape {values.shape} of {values.dtype}"
            raise PruningError(
                f"`importance` must map every attention layer to {state.num_heads} real scores "
                f"for layer {state.path!r}; received {received}.",
                key=state.path,
            )
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise PruningError(
                f"`importance[{state.path!r}]` has non-finite scores {values[bad].tolist()} for "
                f"heads {bad.tolist()}; expected finite numbers (NaN or infinite scores would "
                "prune arbitrary heads).",
                key=state.path,
                value=values[bad].tolist(),
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
        >>> removal_units(state, np.array([0.125, 0.5, 0.375, 0.25]), "query")
        [(0.1875, [0, 3])]
    """
    check_policy(gqa_policy)
    groups = state.kept_by_group()
    sizes = {len(heads) for heads in groups.values()}
    if len(sizes) > 1:
        raise PruningError(
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
        ...
        keras_mha.errors.PruningError: `target`=8 asks to remove 8 of 8 heads, ...
    """
    fresh = [LayerState(s.path, s.num_heads, s.num_key_value_heads) for s in states]
    wanted = target_heads(target, fresh, scope)
    if scope == "global":
        total = sum(state.num_heads for state in fresh)
        most = sum(removable_heads(state, gqa_policy, min_heads_per_layer) for state in fresh)
        if wanted > most:
            raise PruningError(
                f"`target`={target!r} asks to remove {wanted} of {total} heads, but with "
                f"`min_heads_per_layer`={min_heads_per_layer} and `gqa_policy`={gqa_policy!r} "
                f"at most {most} can go (a layer never loses every head)."
            )
        return
    for state in fresh:
        most = removable_heads(state, gqa_policy, min_heads_per_layer)
        if wanted[state.path] > most:
            raise PruningError(
                f"`target`={target!r} with scope='per_layer' asks to remove {wanted[state.path]} "
                f"of the {state.num_heads} heads of layer {state.path!r}, but with "
                f"`min_heads_per_layer`={min_heads_per_layer} and `gqa_policy`={gqa_policy!r} "
                f"at most {most} can go (a layer never loses every head)."
            )


def unit_size(state, gqa_policy):
    """Query heads in the next removal unit of `state` (0 when it has none left).

    Example:
        >>> unit_size(LayerState("gqa", 8, 2), "group"), unit_size(LayerState("gqa", 8, 2), "query")
        (4, 2)
    """
    units = removal_units(state, np.zeros(state.num_heads), gqa_policy)
    return len(units[0][1]) if units else 0


def reachable_heads(states, wanted, scope, gqa_policy, min_heads_per_layer):
    """The most heads the layers can have removed without going over `wanted`.

    Heads go in whole units (see the module docstring) and every layer keeps
    `min_heads_per_layer`, so a target is not always reachable exactly.

    Returns:
        An int (`scope="global"`) or `{path: int}`, already gated heads included.

    Example:
        >>> reachable_heads([LayerState("gqa", 8, 2)], 6, "global", "group", 1)
        4
    """
    zeros = {state.path: np.zeros(state.num_heads) for state in states}
    chosen = select_heads(states, zeros, wanted, scope, gqa_policy, min_heads_per_layer)
    if scope == "global":
        return _pruned_total(states) + sum(map(len, chosen.values()))
    return {state.path: len(state.pruned) + len(chosen[state.path]) for state in states}


def shortfall(target, states, scope, gqa_policy, min_heads_per_layer):
    """`(heads asked, heads reachable, why not)`; the reason is None when both agree.

    Counts are totals over layers (for `scope="per_layer"`, sums of each layer's).

    Example:
        >>> shortfall(6, [LayerState("gqa", 8, 2)], "global", "group", 1)[:2]
        (6, 4)
    """
    wanted = target_heads(target, states, scope)
    reachable = reachable_heads(states, wanted, scope, gqa_policy, min_heads_per_layer)
    units = ", ".join(f"{state.path!r}: {unit_size(state, gqa_policy)}" for state in states)
    rule = (
        f"heads go in whole units (heads per unit: {units}; gqa_policy={gqa_policy!r}) and every "
        f"layer keeps `min_heads_per_layer`={min_heads_per_layer}"
    )
    if scope == "global":
        if reachable >= wanted:
            return wanted, reachable, None
        return (
            wanted,
            reachable,
            (
                f"`target`={target!r} asks for {wanted} heads, but {rule}: the most that can go "
                f"without exceeding the target is {reachable}."
            ),
        )
    short = {
        path: (wanted[path], count) for path, count in reachable.items() if count < wanted[path]
    }
    asked, got = sum(wanted.values()), sum(reachable.values())
    if not short:
        return asked, got, None
    layers = ", ".join(
        f"{path!r} {got_here} of {asked_here}" for path, (asked_here, got_here) in short.items()
    )
    return (
        asked,
        got,
        (
            f"`target`={target!r} with scope='per_layer' asks for {asked} heads, but {rule}: "
            f"only {layers} can go without exceeding the target ({got} in all)."
        ),
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
    check_importance(states, importance)
    options = _all_prefix_options(states, importance, gqa_policy, min_heads_per_layer)
    if scope == "per_layer":
        chosen = {}
        for state in states:
            need = max(0, wanted[state.path] - len(state.pruned))
            fitting = [option for option in options[state.path] if option[0] <= need]
            chosen[state.path] = sorted(fitting[-1][2])
        return chosen
    return _cheapest_prefixes(states, options, wanted - _pruned_total(states))


def select_step_heads(
    states, importance, wanted_now, wanted_final, gqa_policy, min_heads_per_layer
):
    """One step of a global schedule: heads to gate off now, within a plan for the end.

    A schedule that only aims at each step's own count can get stuck when units
    differ in size: on MHA (1-head units) + GQA (4-head groups) with a target of
    6 in two steps, taking 3 cheap MHA heads first leaves 3 to go, which only a
    4-head group could bring, and the schedule would stop at 3. So each step
    first plans the cheapest way to remove `wanted_final` heads from where the
    model is now, then takes, from that plan only, the most heads up to
    `wanted_now` at the least importance. What a step takes is part of a plan
    that reaches the final count, so the last step always can.

    Args:
        states: `LayerState`s, with the heads already gated off in `pruned`.
        importance: `{path: scores}`.
        wanted_now: heads to have removed after this step (already pruned included).
        wanted_final: heads to have removed after the last step.
        gqa_policy: `"group"` or `"query"`.
        min_heads_per_layer: heads each layer keeps at least.

    Returns:
        `{path: sorted list of newly removed heads}` (empty lists included).

    Example:
        >>> states = [LayerState("mha", 4, 4), LayerState("gqa", 8, 2)]
        >>> scores = {"mha": np.array([.1, .2, .3, .9]), "gqa": np.array([.5] * 8)}
        >>> select_step_heads(states, scores, 3, 6, "group", 1)  # not [0, 1, 2]: 6 needs a group
        {'mha': [0, 1], 'gqa': []}
    """
    check_importance(states, importance)
    options = _all_prefix_options(states, importance, gqa_policy, min_heads_per_layer)
    pruned = _pruned_total(states)
    plan = _cheapest_prefixes(states, options, wanted_final - pruned)
    within_plan = {
        path: [option for option in path_options if option[0] <= len(plan[path])]
        for path, path_options in options.items()
    }
    return _cheapest_prefixes(states, within_plan, wanted_now - pruned)


def _pruned_total(states):
    return sum(len(state.pruned) for state in states)


def _all_prefix_options(states, importance, gqa_policy, min_heads_per_layer):
    return {
        state.path: _prefix_options(state, importance[state.path], gqa_policy, min_heads_per_layer)
        for state in states
    }


def _cheapest_prefixes(states, options, budget):
    """Each layer takes a prefix of its units: the most heads up to `budget`, least summed
    importance first (a knapsack over layers)."""
    budget = max(0, budget)
    # Cheapest way to remove exactly `total` heads, for every reachable total up to the budget.
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
