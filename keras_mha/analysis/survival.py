"""Which head roles survive pruning: Voita et al.'s question, asked of the user's model.

Voita et al. (2019) found that the heads pruning removes last are the specialised
ones (positional, syntactic, rare-word). Here the heads are ranked by the importance
the user chose (`keras_mha.pruning.head_importance`: taylor, ablation or magnitude),
the least important 25% and 50% of all heads are taken out as `heads_to_prune` would
(global ranking, `gqa_policy="query"`, every layer keeps a head), and each role counts
how many of its heads remain.

Example:
    >>> survival = roles_surviving(model, result.roles, scores)  # doctest: +SKIP
    >>> survival["50%"]["previous-token"]  # doctest: +SKIP
    {'heads': 4, 'kept': 4}
"""

from __future__ import annotations

import warnings
from collections import Counter

#: Fractions of all heads removed, with their JSON keys.
PRUNED_FRACTIONS = {"25%": 0.25, "50%": 0.5}


def roles_surviving(model, roles, importance):
    """`{"25%": {role: {"heads", "kept"}}, "50%": ..., "removed": {"25%": {path: [heads]},
    "50%": ...}, "limited": {"50%": {"asked", "removable"}}}` for the roles
    `{path: [role per head]}` and scores `{path: scores}`.

    A fraction that would take a layer's last head (a model of one head per layer) removes
    the most heads that can go instead, and `limited` says so for that fraction.

    Raises:
        PruningError: scores that are missing, of the wrong shape or not finite.
    """
    from keras_mha.pruning import heads_to_prune
    from keras_mha.pruning.policy import LayerState, heads_for_target, removable_heads
    from keras_mha.pruning.selection import layer_states

    totals = Counter(role for layer_roles in roles.values() for role in layer_roles)
    # Counted from the full head counts, as heads_to_prune counts its target.
    states = [
        LayerState(state.path, state.num_heads, state.num_key_value_heads)
        for state in layer_states(model)
    ]
    # Every layer keeps a head: a small model (one layer of one head) cannot lose a quarter.
    most = sum(removable_heads(state, "query", 1) for state in states)
    all_heads = sum(state.num_heads for state in states)
    result = {"removed": {}, "limited": {}}
    for key, fraction in PRUNED_FRACTIONS.items():
        wanted = heads_for_target(fraction, all_heads)
        count = min(wanted, most)
        if count < wanted:
            result["limited"][key] = {"asked": wanted, "removable": most}
        removed = {state.path: [] for state in states}
        if count:
            with warnings.catch_warnings():
                # Units bigger than a head may stop short of the count; the counts say so.
                warnings.simplefilter("ignore")
                removed = heads_to_prune(
                    model, importance, count, scope="global", gqa_policy="query"
                )
        lost = Counter(roles[path][head] for path, heads in removed.items() for head in heads)
        result[key] = {
            role: {"heads": totals[role], "kept": totals[role] - lost[role]} for role in totals
        }
        result["removed"][key] = {path: [int(h) for h in heads] for path, heads in removed.items()}
    return result


__all__ = ["PRUNED_FRACTIONS", "roles_surviving"]
