"""Masks: propagated padding, explicit, causal, sliding window, and their combinations."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_mha.layers import GroupedQueryAttention, MultiHeadAttention, copy_weights_from_keras
from tests.layers.test_reference import PATHS, random_inputs, randomise
from tests.reference import attention_numpy

ATOL = 1e-5


@pytest.mark.parametrize("flash_attention", PATHS)
@pytest.mark.parametrize("sliding_window", [None, 1, 3])
def test_causal_and_sliding_window_match_numpy(flash_attention, sliding_window):
    x = random_inputs(2, 9, 12)
    layer = GroupedQueryAttention(
        4,
        2,
        head_dim=4,
        causal=True,
        sliding_window=sliding_window,
        flash_attention=flash_attention,
    )
    layer(x)
    randomise(layer)
    expected, weights = attention_numpy(layer, x, causal=True, sliding_window=sliding_window)
    np.testing.assert_allclose(ops.convert_to_numpy(layer(x)), expected, atol=ATOL)
    if sliding_window:
        # Query 8 sees exactly the `sliding_window` most recent tokens, itself included.
        assert (weights[0, 0, 8] > 0).sum() == sliding_window


def test_sliding_window_implies_causal():
    x = random_inputs(1, 6, 8)
    layer = GroupedQueryAttention(2, 1, head_dim=4, sliding_window=2)
    layer(x)
    _, scores = layer(x, return_attention_scores=True)
    scores = ops.convert_to_numpy(scores)
    assert np.all(np.triu(scores[0, 0], k=1) == 0)
    assert np.all(np.tril(scores[0, 0], k=-2) == 0)


@pytest.mark.parametrize("flash_attention", PATHS)
def test_masks_combine(flash_attention):
    """Explicit mask AND causal AND key padding, all at once."""
    x = random_inputs(2, 7, 8)
    explicit = np.random.RandomState(0).rand(2, 7, 7) > 0.3
    padding = np.ones((2, 7), bool)
    padding[1, 5:] = False
    layer = GroupedQueryAttention(4, 2, head_dim=3, causal=True, flash_attention=flash_attention)
    layer(x)
    randomise(layer)
    combined = explicit & padding[:, None, :]
    expected, _ = attention_numpy(layer, x, mask=combined, causal=True)
    got = layer(x, attention_mask=explicit, value_mask=padding)
    got = ops.convert_to_numpy(got)
    np.testing.assert_allclose(got, expected, atol=ATOL)
    assert np.isfinite(got).all()


@pytest.mark.parametrize("flash_attention", PATHS)
def test_fully_masked_rows_are_zero_not_nan(flash_attention):
    x = random_inputs(2, 4, 8)
    layer = MultiHeadAttention(2, head_dim=4, use_bias=False, flash_attention=flash_attention)
    layer(x)
    mask = np.ones((2, 4, 4), bool)
    mask[0, 1] = False
    mask[1] = False
    out = ops.convert_to_numpy(layer(x, attention_mask=mask))
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out[0, 1], 0.0)
    np.testing.assert_array_equal(out[1], 0.0)
    assert np.abs(out[0, 0]).sum() > 0


def test_padding_mask_propagates_from_embedding():
    """Embedding(mask_zero=True) masks padded keys, exactly as keras.layers.MultiHeadAttention."""
    tokens = np.array([[3, 5, 7, 0, 0], [2, 4, 6, 8, 1]])
    inputs = keras.Input((5,), dtype="int32")
    embedded = keras.layers.Embedding(10, 8, mask_zero=True)(inputs)
    ours = MultiHeadAttention(2, head_dim=4, name="ours")(embedded)
    ref = keras.layers.MultiHeadAttention(2, key_dim=4, name="ref")(embedded, embedded)
    model = keras.Model(inputs, [ours, ref])
    copy_weights_from_keras(model.get_layer("ref"), model.get_layer("ours"))
    got, expected = (ops.convert_to_numpy(t) for t in model(tokens))
    # Padded query rows have nothing to attend: Keras averages, we give zeros.
    np.testing.assert_allclose(got[0, :3], expected[0, :3], atol=ATOL)
    np.testing.assert_allclose(got[1], expected[1], atol=ATOL)
    # The padded keys really are ignored: changing them does not move real rows.
    other = tokens.copy()
    other[0, 3:] = 0
    assert np.allclose(ops.convert_to_numpy(model(other)[0])[0, :3], got[0, :3])


def test_output_keeps_query_padding_mask():
    inputs = keras.Input((5,), dtype="int32")
    embedded = keras.layers.Embedding(10, 8, mask_zero=True)(inputs)
    attended = MultiHeadAttention(2, head_dim=4)(embedded)
    pooled = keras.layers.GlobalAveragePooling1D()(attended)  # Uses the mask.
    model = keras.Model(inputs, pooled)
    a = ops.convert_to_numpy(model(np.array([[1, 2, 0, 0, 0]])))
    b = ops.convert_to_numpy(model(np.array([[1, 2, 0, 0, 0]])))
    np.testing.assert_allclose(a, b)
    assert np.isfinite(a).all()


@pytest.mark.parametrize(
    "shape,message",
    [
        ((3, 4, 4), "batch"),
        ((2, 5, 4), "query_length"),
        ((2, 4, 3), "key_length"),
        ((2, 3, 4, 4), "num_heads"),
        ((4,), "rank"),
    ],
)
def test_mask_shape_errors_name_the_shapes(shape, message):
    x = random_inputs(2, 4, 8)
    layer = GroupedQueryAttention(4, 2, head_dim=2)
    layer(x)
    with pytest.raises(ValueError, match=message):
        layer(x, attention_mask=np.ones(shape, bool))


def test_mask_broadcast_shapes_accepted():
    x = random_inputs(2, 4, 8)
    layer = GroupedQueryAttention(4, 2, head_dim=2)
    layer(x)
    full = ops.convert_to_numpy(layer(x, attention_mask=np.tril(np.ones((2, 4, 4), bool))))
    for mask in (np.tril(np.ones((4, 4), bool)), np.tril(np.ones((1, 1, 4, 4), bool))):
        np.testing.assert_allclose(
            ops.convert_to_numpy(layer(x, attention_mask=mask)), full, atol=ATOL
        )
    per_head = np.broadcast_to(np.tril(np.ones((4, 4), bool)), (2, 4, 4, 4))
    np.testing.assert_allclose(
        ops.convert_to_numpy(layer(x, attention_mask=per_head)), full, atol=ATOL
    )
