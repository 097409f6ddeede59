"""Choosing heads: GQA policies, scopes, min_heads_per_layer, targets (pure NumPy)."""

import itertools

import numpy as np
import pytest

from keras_mha.layers.head_surgery import plan_head_removal
from keras_mha.pruning.policy import (
    LayerState,
    check_target,
    check_target_reachable,
    heads_for_target,
    removable_heads,
    removal_units,
    round_half_up,
    select_heads,
    target_heads,
)

pytestmark = pytest.mark.backend_independent


def test_group_policy_removes_whole_kv_groups_by_mean_importance():
    state = LayerState("gqa", num_heads=8, num_key_value_heads=4)
    scores = np.array([0.9, 0.8, 0.1, 0.2, 0.5, 0.4, 0.3, 0.35])
    units = removal_units(state, scores, "group")
    assert [heads for _, heads in units] == [[2, 3], [6, 7], [4, 5], [0, 1]]
    np.testing.assert_allclose([score for score, _ in units], [0.15, 0.325, 0.45, 0.85])


def test_query_policy_takes_the_least_important_head_of_every_group():
    state = LayerState("gqa", num_heads=8, num_key_value_heads=2)
    scores = np.array([0.9, 0.1, 0.5, 0.3, 0.2, 0.8, 0.7, 0.4])
    units = removal_units(state, scores, "query")
    # Group 0 ranks heads 1, 3, 2 (0 kept last); group 1 ranks 4, 7, 6 (5 kept last).
    assert [heads for _, heads in units] == [[1, 4], [3, 7], [2, 6]]


def test_query_policy_on_mha_and_mqa():
    mha = LayerState("mha", num_heads=4, num_key_value_heads=4)
    scores = np.array([0.4, 0.1, 0.3, 0.2])
    assert [h for _, h in removal_units(mha, scores, "query")] == [[1], [3], [2], [0]]
    mqa = LayerState("mqa", num_heads=4, num_key_value_heads=1)
    assert [h for _, h in removal_units(mqa, scores, "query")] == [[1], [3], [2]]
    assert [h for _, h in removal_units(mqa, scores, "group")] == [[0, 1, 2, 3]]


def test_units_skip_pruned_heads_and_refuse_unequal_groups():
    state = LayerState("gqa", 8, 2, pruned=frozenset({1, 4}))
    scores = np.arange(8.0)
    assert [h for _, h in removal_units(state, scores, "query")] == [[0, 5], [2, 6]]
    assert [h for _, h in removal_units(state, scores, "group")] == [[0, 2, 3], [5, 6, 7]]
    broken = LayerState("gqa", 8, 2, pruned=frozenset({1}))
    with pytest.raises(ValueError, match=r"Layer 'gqa' has gated-off heads \[1\] that leave"):
        removal_units(broken, scores, "query")


def test_every_selection_is_physically_removable():
    rng = np.random.default_rng(0)
    for trial in range(200):
        kv_heads = int(rng.choice([1, 2, 4]))
        groups = int(rng.choice([1, 2, 3]))
        states = [LayerState(f"l{i}", kv_heads * groups, kv_heads) for i in range(3)]
        scores = {s.path: rng.random(s.num_heads) for s in states}
        policy = ["group", "query"][trial % 2]
        total = sum(s.num_heads for s in states)
        wanted = int(rng.integers(1, total + 1))
        chosen = select_heads(states, scores, wanted, "global", policy, 1)
        assert sum(map(len, chosen.values())) <= wanted
        for state in states:
            plan_head_removal(state.num_heads, state.num_key_value_heads, chosen[state.path])
            if policy == "query" and groups > 1:
                kept = set(range(state.num_heads)) - set(chosen[state.path])
                assert {h // groups for h in kept} == set(range(kv_heads))  # No KV head lost.


def test_global_selection_is_the_cheapest_way_to_remove_the_most_heads():
    rng = np.random.default_rng(1)
    for _ in range(100):
        states = [
            LayerState("mha", 4, 4),
            LayerState("gqa", 6, 2),
            LayerState("mqa", 3, 1),
        ]
        scores = {s.path: rng.random(s.num_heads) for s in states}
        policy = str(rng.choice(["group", "query"]))
        wanted = int(rng.integers(1, 10))
        chosen = select_heads(states, scores, wanted, "global", policy, 1)
        # Brute force over how many units each layer gives up (its cheapest first).
        prefixes = []
        for state in states:
            units = removal_units(state, scores[state.path], policy)
            options, heads = [[]], []
            for _, unit in units:
                if state.num_heads - len(heads) - len(unit) < 1:
                    break
                heads = heads + unit
                options.append(heads)
            prefixes.append(options)
        best = None
        for combination in itertools.product(*prefixes):
            count = sum(map(len, combination))
            cost = sum(scores[s.path][h].sum() for s, h in zip(states, combination, strict=True))
            if count <= wanted and (best is None or (-count, cost) < (-best[0], best[1] - 1e-12)):
                best = (count, cost)
        count = sum(map(len, chosen.values()))
        cost = sum(scores[path][heads].sum() for path, heads in chosen.items())
        assert count == best[0]
        assert cost == pytest.approx(best[1])


def test_global_selection_does_not_stop_short_where_greedy_would():
    states = [LayerState("mha", 4, 4), LayerState("gqa", 4, 2)]
    scores = {"mha": np.array([0.1, 0.2, 0.3, 0.9]), "gqa": np.array([0.4, 0.5, 0.8, 0.9])}
    # Greedy by score takes MHA 0, 1, 2 and then has no room for a 2-head group: 3 heads.
    assert select_heads(states, scores, 4, "global", "group", 1) == {
        "mha": [0, 1],
        "gqa": [0, 1],
    }


def test_global_scope_ranks_across_layers():
    states = [LayerState("a", 4, 4), LayerState("b", 4, 4)]
    scores = {"a": np.array([0.9, 0.1, 0.5, 0.6]), "b": np.array([0.2, 0.8, 0.7, 0.3])}
    assert select_heads(states, scores, 3, "global", "group", 1) == {"a": [1], "b": [0, 3]}


def test_per_layer_scope_takes_the_same_share_everywhere():
    states = [LayerState("a", 4, 4), LayerState("b", 4, 4)]
    scores = {"a": np.array([0.9, 0.1, 0.5, 0.6]), "b": np.array([0.2, 0.8, 0.7, 0.3])}
    wanted = target_heads(0.5, states, "per_layer")
    assert wanted == {"a": 2, "b": 2}
    assert select_heads(states, scores, wanted, "per_layer", "group", 1) == {
        "a": [1, 2],
        "b": [0, 3],
    }


def test_min_heads_per_layer_is_respected():
    states = [LayerState("a", 4, 4), LayerState("b", 4, 4)]
    scores = {"a": np.array([0.1, 0.2, 0.3, 0.4]), "b": np.array([0.5, 0.6, 0.7, 0.8])}
    chosen = select_heads(states, scores, 5, "global", "group", 2)
    assert chosen == {"a": [0, 1], "b": [0, 1]}  # 5 wanted, but each layer keeps 2.
    assert removable_heads(LayerState("a", 4, 4), "group", 2) == 2
    assert removable_heads(LayerState("g", 8, 2), "group", 1) == 4
    assert removable_heads(LayerState("g", 8, 2), "query", 1) == 6
    assert removable_heads(LayerState("g", 8, 2), "query", 4) == 4


def test_already_pruned_heads_count_towards_the_target():
    states = [LayerState("a", 4, 4, pruned=frozenset({2})), LayerState("b", 4, 4)]
    scores = {"a": np.array([0.1, 0.9, 0.0, 0.8]), "b": np.array([0.5, 0.6, 0.7, 0.05])}
    assert select_heads(states, scores, 3, "global", "group", 1) == {"a": [0], "b": [3]}
    assert select_heads(states, scores, 1, "global", "group", 1) == {"a": [], "b": []}


def test_targets():
    assert round_half_up(2.5) == 3 and round_half_up(2.49) == 2
    assert heads_for_target(0.3, 72) == 22 and heads_for_target(0.5, 16) == 8
    assert heads_for_target(5, 72) == 5
    for bad in (1.0, 0.0, -2, True, "half", None):
        with pytest.raises(ValueError, match="`target`="):
            check_target(bad)


def test_unreachable_targets_name_the_target_and_the_limits():
    states = [LayerState("a", 4, 4), LayerState("g", 8, 2)]
    with pytest.raises(ValueError, match=r"`target`=12 asks to remove 12 of 12 heads.*at most 7"):
        check_target_reachable(12, states, "global", "group", 1)
    with pytest.raises(ValueError, match=r"`target`=4 with scope='per_layer'.*layer 'a'"):
        check_target_reachable(4, states, "per_layer", "group", 1)
    with pytest.raises(ValueError, match=r"`target`=0.9 .*at most 9"):
        check_target_reachable(0.9, states, "global", "query", 1)
    check_target_reachable(0.5, states, "global", "query", 1)
