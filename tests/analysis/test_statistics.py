"""Planted heads: attention maps built by hand with known roles are classified exactly.

NumPy only (the statistics are backend-independent). Each planted head is checked
against values worked out by hand from the definitions in
`docs/concepts/head-statistics.md`, padding is shown not to matter, and batches
accumulate to the statistics of one big batch.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_mha.analysis import classify_heads
from keras_mha.analysis.roles import assign_roles
from keras_mha.analysis.statistics import STATISTIC_NAMES, HeadStatistics

pytestmark = pytest.mark.backend_independent

LENGTH = 8
CLS, SEP, COMMA, RARE = 101, 102, 7, 55
# [CLS] w w , w w w [SEP]: a comma at 3, [SEP] last; token 55 occurs once in the data.
TOKENS = np.array([[CLS, 20, 21, COMMA, RARE, 20, 21, SEP]])
COUNTS = {20: 5, 21: 5, COMMA: 3, RARE: 1}


def _rows(target):
    """A head whose query i puts all its attention on key target(i)."""
    attention = np.zeros((LENGTH, LENGTH))
    for query in range(LENGTH):
        attention[query, target(query)] = 1.0
    return attention


def planted_encoder_heads():
    uniform = np.full((LENGTH, LENGTH), 1.0 / LENGTH)
    delimiter = np.zeros((LENGTH, LENGTH))
    delimiter[:, [3, 7]] = 0.5  # half on the comma, half on [SEP]
    local = np.zeros((LENGTH, LENGTH))
    for query in range(LENGTH):
        window = [k for k in range(query - 2, query + 3) if 0 <= k < LENGTH]
        local[query, window] = 1.0 / len(window)
    heads = {
        "previous-token": _rows(lambda q: max(q - 1, 0)),
        "next-token": _rows(lambda q: min(q + 1, LENGTH - 1)),
        "self": _rows(lambda q: q),
        "first-token": _rows(lambda q: 0),
        "delimiter": delimiter,
        "rare-token": _rows(lambda q: 4),
        "broad": uniform,
        "local": local,
    }
    return list(heads), np.stack(list(heads.values()))[None]


def test_planted_encoder_heads_get_their_roles_and_hand_computed_statistics():
    roles, attention = planted_encoder_heads()
    result = classify_heads(
        attention,
        token_ids=TOKENS,
        special_ids={CLS, SEP},
        delimiter_ids={COMMA},
        token_counts=COUNTS,
    )
    assert result.roles == roles
    stats = {
        name: dict(zip(roles, values, strict=True)) for name, values in result.statistics.items()
    }
    # previous: 7 queries have a previous token, all of them put 1.0 on it.
    assert stats["previous"]["previous-token"] == pytest.approx(1.0)
    # self: the previous-token head's first query falls back on itself: 1 of 8.
    assert stats["self"]["previous-token"] == pytest.approx(1 / 8)
    # first: 7 queries other than [CLS]; the first-token head puts 1.0 there.
    assert stats["first"]["first-token"] == pytest.approx(1.0)
    # special = [SEP] (the first token is counted in `first`), delimiter = the comma.
    assert stats["special"]["delimiter"] == pytest.approx(0.5)
    assert stats["delimiter"]["delimiter"] == pytest.approx(0.5)
    # rare: the rarest content token in view of every query is 55.
    assert stats["rare"]["rare-token"] == pytest.approx(1.0)
    assert stats["entropy"]["broad"] == pytest.approx(np.log(LENGTH))
    assert stats["normalized_entropy"]["broad"] == pytest.approx(1.0)
    # mean |i - j| of uniform attention over 8 positions: sum over i, j of |i-j| / 64.
    assert stats["distance"]["broad"] == pytest.approx(
        np.abs(np.arange(8)[:, None] - np.arange(8)).mean()
    )
    assert stats["local"]["local"] == pytest.approx(1.0)
    assert stats["next"]["next-token"] == pytest.approx(1.0)
    assert result.queries == LENGTH


def test_a_causal_layer_has_no_next_statistic_and_its_first_query_is_left_out():
    previous = _rows(lambda q: max(q - 1, 0))
    uniform_causal = np.tril(np.ones((LENGTH, LENGTH))) / np.arange(1, LENGTH + 1)[:, None]
    sink = _rows(lambda q: 0)
    result = classify_heads(np.stack([previous, uniform_causal, sink])[None], causal=True)
    assert result.statistics["next"] is None
    assert result.roles == ["previous-token", "broad", "first-token"]
    assert result.queries == LENGTH - 1  # query 0 sees only itself
    # Uniform over what each query sees: normalized entropy exactly 1.
    assert result.statistics["normalized_entropy"][1] == pytest.approx(1.0)
    assert result.statistics["self"][0] == pytest.approx(0.0)  # query 0 left out


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    lengths=st.lists(st.integers(2, 6), min_size=1, max_size=3),
    causal=st.booleans(),
)
def test_padding_does_not_change_the_statistics(seed, lengths, causal):
    """Rows padded with garbage give the statistics of each sentence alone, weighted."""
    generator = np.random.default_rng(seed)
    width = max(lengths) + 2
    heads = 3
    attention = generator.random((len(lengths), heads, width, width))  # garbage everywhere
    mask = np.arange(width)[None] < np.array(lengths)[:, None]
    together = HeadStatistics(heads, causal=causal)
    alone = HeadStatistics(heads, causal=causal)
    for row, length in enumerate(lengths):
        logits = generator.normal(size=(heads, length, length))
        if causal:
            logits = np.where(np.tril(np.ones((length, length))) > 0, logits, -np.inf)
        real = np.exp(logits - logits.max(axis=-1, keepdims=True))
        real /= real.sum(axis=-1, keepdims=True)
        attention[row, :, :, :] = np.where(mask[row][None, None, :], attention[row], 0.0)
        attention[row, :, :length, :length] = real
        alone.update(real[None])
    together.update(attention, padding_mask=mask)
    for name in STATISTIC_NAMES:
        a, b = together.means()[name], alone.means()[name]
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_allclose(a, b, atol=1e-9)


def test_roles_take_the_documented_precedence():
    stats = dict.fromkeys(STATISTIC_NAMES)
    stats.update(
        previous=np.array([0.6, 0.2, 0.1, 0.1]),
        first=np.array([0.3, 0.7, 0.2, 0.1]),
        normalized_entropy=np.array([0.95, 0.95, 0.95, 0.5]),
        local=np.array([0.9, 0.1, 0.9, 0.9]),
    )
    # A focused role beats broad/local; broad beats local; a syntactic head beats all.
    assert assign_roles(stats) == ["previous-token", "first-token", "broad", "local"]
    assert assign_roles(stats, {1: "det"})[1] == "syntactic:det"


def test_refuses_maps_that_are_not_self_attention_probabilities():
    with pytest.raises(ValueError, match=r"shape \(1, 2, 3, 4\); expected self-attention"):
        classify_heads(np.zeros((1, 2, 3, 4)))
    with pytest.raises(ValueError, match="NaN or infinite"):
        classify_heads(np.full((1, 1, 2, 2), np.nan))
