"""Per-head statistics of attention probabilities, accumulated batch by batch (NumPy).

Each statistic is a mean over the real query tokens of the data (padding excluded),
every query weighing the same, of one number per query and head. A query takes part
only where its statistic means something: it must see at least two real keys (so a
causal model's first token, which can only see itself, is left out), and the
positional statistics need the key they look at (`previous` needs a previous token,
`next` a following one). The definitions, with the papers they come from, are in
`docs/concepts/head-statistics.md`; `STATISTICS` lists them as data.

Example:
    >>> stats = HeadStatistics(num_heads=2)
    >>> uniform = np.full((1, 2, 4, 4), 0.25)
    >>> stats.update(uniform)
    >>> stats.means()["normalized_entropy"].round(3).tolist()
    [1.0, 1.0]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Keys within this many positions of the query (either side) count as `local`.
LOCAL_WINDOW = 2
#: A query counts for `rare` only when its rarest visible content tokens are at most this
#: share of what it sees: when most tokens tie (little text, each word once), none stands out.
RARE_SHARE = 0.25
#: How far a map may stray from probabilities (values in [0, 1], rows summing to 1) and still
#: be read as them: bfloat16 rounds each probability by up to 0.4%.
PROBABILITY_TOLERANCE = 0.02


@dataclass(frozen=True)
class Statistic:
    """One per-head statistic: its JSON key, unit and meaning."""

    name: str
    unit: str
    meaning: str


STATISTICS = (
    Statistic("entropy", "nats", "entropy of the query's attention, -sum p log p"),
    Statistic(
        "normalized_entropy",
        "0..1",
        "entropy divided by log(visible keys): 1 for uniform attention over what the query sees",
    ),
    Statistic("distance", "tokens", "mean distance |query - key|, weighted by attention"),
    Statistic("previous", "fraction", "attention on the token just before the query"),
    Statistic("next", "fraction", "attention on the token just after (bidirectional only)"),
    Statistic("self", "fraction", "attention on the query's own token"),
    Statistic("first", "fraction", "attention on the first real token ([CLS], BOS), from others"),
    Statistic("special", "fraction", "attention on other special tokens ([SEP], EOS, ...)"),
    Statistic("delimiter", "fraction", "attention on punctuation tokens"),
    Statistic("rare", "fraction", "attention on the visible content token rarest in the data"),
    Statistic("local", "fraction", f"attention within {LOCAL_WINDOW} tokens of the query"),
)
STATISTIC_NAMES = tuple(statistic.name for statistic in STATISTICS)


def as_probabilities(attention):
    """`attention` (NumPy or a backend tensor) as a float32 array `(batch, heads, T, T)`.

    Raises:
        ValueError: not 4-D, not square (self-attention), or not finite.

    Example:
        >>> as_probabilities(np.ones((1, 1, 2, 2)) / 2).dtype
        dtype('float32')
    """
    if not isinstance(attention, np.ndarray):
        import keras

        attention = keras.ops.convert_to_numpy(attention)
    attention = np.asarray(attention, dtype="float32")
    if attention.ndim != 4 or attention.shape[2] != attention.shape[3]:
        raise ValueError(
            f"`attention` has shape {attention.shape}; expected self-attention probabilities "
            "(batch, heads, length, length)."
        )
    if not np.isfinite(attention).all():
        raise ValueError("`attention` holds NaN or infinite values; expected probabilities.")
    return attention


def check_probabilities(attention, real):
    """Refuse maps whose real queries' rows are not softmax rows: values in [0, 1], summing
    to 1 (or to 0, a query that sees no key), within `PROBABILITY_TOLERANCE`. Rows of padded
    queries are not read, so they are not checked.

    Example:
        >>> check_probabilities(np.full((1, 1, 2, 2), 5.0), np.ones((1, 2), bool))
        Traceback (most recent call last):
        ValueError: `attention` holds a value of 5 in the row of query 0 of batch 0, head 0; ...
    """
    rows = attention.transpose(0, 2, 1, 3)  # (batch, query, heads, key)
    sums = rows.sum(axis=-1, dtype="float64")
    tolerance = PROBABILITY_TOLERANCE
    out_of_range = ((rows < 0.0) | (rows > 1.0 + tolerance)).any(axis=-1)
    bad = real[:, :, None] & (
        out_of_range | ((np.abs(sums - 1.0) > tolerance) & (sums > tolerance))
    )
    if not bad.any():
        return
    batch, query, head = (int(i) for i in np.argwhere(bad)[0])
    row = rows[batch, query, head]
    if out_of_range[batch, query, head]:
        value = float(row.min() if row.min() < 0.0 else row.max())
        found = f"a value of {value:.4g}"
    else:
        found = f"a sum of {float(sums[batch, query, head]):.4g}"
    raise ValueError(
        f"`attention` holds {found} in the row of query {query} of batch {batch}, head {head}; "
        "expected probabilities (batch, heads, query, key): values in [0, 1], each real "
        "query's row summing to 1 (or 0 where it sees no key)."
    )


def _as_mask(padding_mask, shape, argument="padding_mask"):
    if padding_mask is None:
        return np.ones(shape, dtype=bool)
    mask = np.asarray(padding_mask)
    if mask.shape != shape:
        raise ValueError(f"`{argument}` has shape {mask.shape}; expected {shape} (batch, length).")
    return mask.astype(bool)


def visible_keys(padding_mask, *, causal=False, sliding_window=None):
    """Boolean `(batch, T, T)`: which keys each real query may attend to.

    Example:
        >>> visible_keys(np.ones((1, 3), bool), causal=True)[0].astype(int).tolist()
        [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    """
    length = padding_mask.shape[1]
    query = np.arange(length)[:, None]
    key = np.arange(length)[None, :]
    allowed = np.ones((length, length), dtype=bool)
    if causal:
        allowed &= key <= query
    if sliding_window is not None:
        allowed &= query - key < sliding_window
    return padding_mask[:, :, None] & padding_mask[:, None, :] & allowed[None]


def rarest_keys(token_ids, content, visible, token_counts):
    """Boolean `(batch, T, T)`: for each query, its visible content keys of lowest data count.

    Ties all count: a query whose rarest visible tokens each occur once sees all of them.
    """
    unique, inverse = np.unique(token_ids, return_inverse=True)
    counts = np.array([token_counts.get(int(token), 0) for token in unique], dtype="float64")
    counts = counts[inverse].reshape(token_ids.shape)
    candidates = visible & content[:, None, :]
    per_key = np.where(candidates, counts[:, None, :], np.inf)
    lowest = per_key.min(axis=-1, keepdims=True)
    return candidates & (per_key == lowest)


class HeadStatistics:
    """Sums of every statistic per head over the batches seen so far, for one layer.

    Args:
        num_heads: heads of the layer.
        causal: the layer's queries see only earlier keys (decoders).
        sliding_window: the layer's window, if any (keys closer than it are visible).

    Example:
        >>> stats = HeadStatistics(4, causal=True)
        >>> stats.update(probabilities, padding_mask=mask)  # doctest: +SKIP
        >>> stats.means()["previous"]  # doctest: +SKIP
        array([0.93, 0.02, 0.11, 0.40])
    """

    def __init__(self, num_heads, *, causal=False, sliding_window=None):
        self.num_heads = int(num_heads)
        self.causal = bool(causal)
        self.sliding_window = sliding_window
        self.sums = {name: np.zeros(self.num_heads) for name in STATISTIC_NAMES}
        self.counts = dict.fromkeys(STATISTIC_NAMES, 0)
        self.measured = dict.fromkeys(STATISTIC_NAMES, False)

    def update(
        self,
        attention,
        *,
        padding_mask=None,
        token_ids=None,
        special_ids=(),
        delimiter_ids=(),
        token_counts=None,
    ):
        """Add one batch of this layer's probabilities `(batch, heads, T, T)`.

        `token_ids` `(batch, T)` with `special_ids` / `delimiter_ids` (collections of
        ids) and `token_counts` (`{id: count in the data}`) enable the `special`,
        `delimiter` and `rare` statistics; without them those stay None.
        """
        attention = as_probabilities(attention)
        batch, heads, length, _ = attention.shape
        if heads != self.num_heads:
            raise ValueError(
                f"`attention` has {heads} heads; this layer's statistics were made for "
                f"{self.num_heads}."
            )
        real = _as_mask(padding_mask, (batch, length))
        if token_ids is not None and np.shape(token_ids) != (batch, length):
            raise ValueError(
                f"`token_ids` has shape {np.shape(token_ids)}; expected {(batch, length)} (batch, "
                "length)."
            )
        if not real.any():
            return  # no real token (an empty batch, all padding): nothing to measure
        check_probabilities(attention, real)
        visible = visible_keys(real, causal=self.causal, sliding_window=self.sliding_window)
        positions = np.arange(length)
        offset = positions[None, :] - positions[:, None]  # key - query
        queries = real & (visible.sum(axis=-1) >= 2)
        first = np.where(real.any(axis=1), real.argmax(axis=1), 0)
        is_first = positions[None, :] == first[:, None]

        # (selection of keys per query (batch, T, T) or None, queries counted (batch, T)).
        key_sets = {
            "previous": (offset == -1, queries & _shifted(visible, -1)),
            "next": (offset == 1, queries & _shifted(visible, 1)),
            "self": (offset == 0, queries),
            "first": (is_first[:, None, :], queries & ~is_first),
            "local": (np.abs(offset) <= LOCAL_WINDOW, queries),
        }
        if self.causal:
            del key_sets["next"]  # a causal query never sees the next token
        if token_ids is not None:
            ids = np.asarray(token_ids)
            special = np.isin(ids, list(special_ids)) & ~is_first
            delimiter = np.isin(ids, list(delimiter_ids)) & ~special & ~is_first
            if special_ids:
                key_sets["special"] = (special[:, None, :], queries)
            if delimiter_ids:
                key_sets["delimiter"] = (delimiter[:, None, :], queries)
            if token_counts:
                content = real & ~special & ~delimiter & ~is_first
                rare = rarest_keys(ids, content, visible, token_counts)
                stands_out = rare.sum(axis=-1) <= RARE_SHARE * visible.sum(axis=-1)
                key_sets["rare"] = (rare, queries & rare.any(axis=-1) & stands_out)

        log_visible = np.log(np.maximum(visible.sum(axis=-1), 2))
        distance = np.abs(offset).astype("float64")
        for head in range(heads):
            p = attention[:, head].astype("float64")
            entropy = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)
            self._add("entropy", head, entropy, queries)
            self._add("normalized_entropy", head, entropy / log_visible, queries)
            self._add("distance", head, (p * distance).sum(axis=-1), queries)
            for name, (keys, counted) in key_sets.items():
                self._add(name, head, np.where(keys, p, 0.0).sum(axis=-1), counted)
        for name in ("entropy", "normalized_entropy", "distance"):
            self.counts[name] += int(queries.sum())
        for name, (_, counted) in key_sets.items():
            self.counts[name] += int(counted.sum())

    def _add(self, name, head, per_query, counted):
        self.sums[name][head] += float(per_query[counted].sum())
        self.measured[name] = True

    def means(self):
        """`{statistic: per-head means}`; None where it was not measured or no query counted.

        Example:
            >>> HeadStatistics(1).means()["rare"] is None
            True
        """
        return {
            name: self.sums[name] / self.counts[name]
            if self.measured[name] and self.counts[name]
            else None
            for name in STATISTIC_NAMES
        }

    @property
    def queries(self):
        """Real queries that counted (those seeing at least two keys)."""
        return self.counts["entropy"]


def _shifted(visible, offset):
    """`(batch, T)`: whether the key at `query + offset` exists and is visible."""
    batch, length, _ = visible.shape
    result = np.zeros((batch, length), dtype=bool)
    queries = np.arange(length)
    keys = queries + offset
    inside = (keys >= 0) & (keys < length)
    result[:, queries[inside]] = visible[:, queries[inside], keys[inside]]
    return result


__all__ = [
    "LOCAL_WINDOW",
    "PROBABILITY_TOLERANCE",
    "RARE_SHARE",
    "STATISTICS",
    "STATISTIC_NAMES",
    "HeadStatistics",
    "as_probabilities",
    "check_probabilities",
    "rarest_keys",
    "visible_keys",
]
