"""Head roles from the per-head statistics, by documented thresholds (`ROLE_RULES`).

A head gets one dominant role, in this order of precedence:

1. `syntactic:<relation>` when a treebank was given and the head is the best at
   pointing from a word to its syntactic head for that relation, beating the best
   fixed-offset baseline by `SYNTAX_MARGIN` (`keras_mha.analysis.syntax`);
2. the *focused* role whose statistic is largest among those at or above their
   threshold: `previous-token`, `next-token`, `self`, `first-token`, `delimiter`,
   `rare-token` (each a share of attention on one kind of key, so at most one
   can hold a majority);
3. `broad` (near-uniform attention), then `local` (attention within a small window);
4. `mixed` otherwise.

The thresholds and their sources are in `docs/concepts/head-statistics.md`.

Example:
    >>> stats = {name: None for name in STATISTIC_NAMES}
    >>> stats.update(previous=np.array([0.9, 0.1]), normalized_entropy=np.array([0.2, 0.95]))
    >>> assign_roles(stats)
    ['previous-token', 'broad']
"""

from __future__ import annotations

from dataclasses import dataclass

from keras_mha.analysis.statistics import STATISTIC_NAMES, HeadStatistics, as_probabilities


@dataclass(frozen=True)
class RoleRule:
    """A role given when the sum of `statistics` reaches `threshold`."""

    role: str
    statistics: tuple
    threshold: float
    meaning: str


#: A majority of the attention on one kind of key (Clark et al. 2019 count heads that
#: put over half their attention on the previous / next token, [SEP] or punctuation).
FOCUSED_ROLES = (
    RoleRule("previous-token", ("previous",), 0.5, "the token just before"),
    RoleRule("next-token", ("next",), 0.5, "the token just after"),
    RoleRule("self", ("self",), 0.5, "its own token"),
    RoleRule("first-token", ("first",), 0.5, "the first token ([CLS], BOS): an attention sink"),
    RoleRule("delimiter", ("special", "delimiter"), 0.5, "[SEP]/EOS and punctuation"),
    RoleRule("rare-token", ("rare",), 0.5, "the rarest token in view (Voita et al. 2019)"),
)
#: Spread-out heads, tested in this order after the focused roles.
SPREAD_ROLES = (
    RoleRule("broad", ("normalized_entropy",), 0.9, "near-uniform over the visible keys"),
    RoleRule("local", ("local",), 0.7, "most attention within 2 tokens, not on one of them"),
)
ROLE_RULES = FOCUSED_ROLES + SPREAD_ROLES
MIXED = "mixed"
SYNTACTIC_PREFIX = "syntactic:"
#: Every role a head can have besides `syntactic:<relation>`, in precedence order.
ROLES = tuple(rule.role for rule in ROLE_RULES) + (MIXED,)


def _value(statistics, rule, head):
    parts = [statistics.get(name) for name in rule.statistics]
    parts = [part for part in parts if part is not None]
    return float(sum(part[head] for part in parts)) if parts else None


def assign_roles(statistics, syntactic=None):
    """One role per head from `{statistic: per-head values or None}`.

    Args:
        statistics: as `HeadStatistics.means()` returns.
        syntactic: `{head: relation}` of heads that won a relation (`syntax`).

    Example:
        >>> stats = {name: None for name in STATISTIC_NAMES}
        >>> stats["self"] = np.array([0.2]); stats["local"] = np.array([0.8])
        >>> assign_roles(stats)
        ['local']
    """
    syntactic = syntactic or {}
    measured = [value for value in statistics.values() if value is not None]
    if not measured:
        raise ValueError(
            "`statistics` holds no measured statistic (every value is None): no real query "
            "saw two or more keys; expected statistics of sequences of at least 2 real tokens."
        )
    num_heads = len(measured[0])
    roles = []
    for head in range(num_heads):
        if head in syntactic:
            roles.append(SYNTACTIC_PREFIX + syntactic[head])
            continue
        focused = [
            (value, rule.role)
            for rule in FOCUSED_ROLES
            if (value := _value(statistics, rule, head)) is not None and value >= rule.threshold
        ]
        if focused:
            roles.append(max(focused)[1])
            continue
        spread = [
            rule.role
            for rule in SPREAD_ROLES
            if (value := _value(statistics, rule, head)) is not None and value >= rule.threshold
        ]
        roles.append(spread[0] if spread else MIXED)
    return roles


@dataclass
class LayerRoles:
    """Statistics and roles of the heads of one attention layer.

    Attributes:
        statistics: `{statistic: np.ndarray (num_heads,) or None}` (None: not measured).
        roles: one role per head.
        queries: real query tokens the statistics average over.
    """

    statistics: dict
    roles: list
    queries: int

    @property
    def num_heads(self):
        return len(self.roles)


def classify_heads(
    attention,
    *,
    token_ids=None,
    special_ids=(),
    delimiter_ids=(),
    token_counts=None,
    padding_mask=None,
    causal=False,
    sliding_window=None,
):
    """Per-head statistics and roles from one layer's attention probabilities.

    Pure and deterministic: the same maps give the same answer on every backend.

    Args:
        attention: probabilities `(batch, heads, length, length)`, NumPy or a backend
            tensor (rows of padded queries are ignored).
        token_ids: `(batch, length)` ids, for the `special`, `delimiter` and `rare`
            statistics.
        special_ids: ids of special tokens ([CLS], [SEP], BOS, EOS, ...).
        delimiter_ids: ids of punctuation tokens.
        token_counts: `{token id: count}` over the data, for `rare`.
        padding_mask: boolean `(batch, length)`, True at real tokens (default: all).
        causal: the maps come from a causal layer (no `next` statistic).
        sliding_window: the layer's attention window, if any.

    Returns:
        A `LayerRoles`.

    Raises:
        ValueError: maps that are not probabilities (`statistics.as_probabilities`), or
            no real query that sees two or more keys (nothing to measure).

    Example:
        >>> length = 6
        >>> previous = np.eye(length, k=-1); previous[0, 0] = 1.0
        >>> uniform = np.full((length, length), 1 / length)
        >>> result = classify_heads(np.stack([previous, uniform])[None])
        >>> result.roles
        ['previous-token', 'broad']
    """
    attention = as_probabilities(attention)
    stats = HeadStatistics(attention.shape[1], causal=causal, sliding_window=sliding_window)
    stats.update(
        attention,
        padding_mask=padding_mask,
        token_ids=token_ids,
        special_ids=special_ids,
        delimiter_ids=delimiter_ids,
        token_counts=token_counts,
    )
    if not stats.queries:
        raise ValueError(
            f"`attention` of shape {attention.shape}: no real query sees two or more keys "
            "(with this padding_mask, causal and sliding_window), so no head statistic can be "
            "measured; expected sequences of at least 2 real tokens."
        )
    means = stats.means()
    return LayerRoles(means, assign_roles(means), stats.queries)


__all__ = [
    "FOCUSED_ROLES",
    "MIXED",
    "ROLES",
    "ROLE_RULES",
    "SPREAD_ROLES",
    "SYNTACTIC_PREFIX",
    "STATISTIC_NAMES",
    "LayerRoles",
    "RoleRule",
    "assign_roles",
    "classify_heads",
]
