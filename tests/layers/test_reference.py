"""Our layers against references nobody here wrote: Keras's built-ins, torch SDPA,
plus a plain NumPy reference. Every test runs on every backend."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_mha.layers import (
    GroupedQueryAttention,
    MultiHeadAttention,
    MultiQueryAttention,
    copy_weights_from_keras,
    copy_weights_to_keras,
)
from tests.reference import attention_numpy

ATOL = 1e-5


def random_inputs(*shape, seed=0):
    return np.random.RandomState(seed).standard_normal(shape).astype("float32")


def as_numpy(x):
    return ops.convert_to_numpy(x)


def randomise(layer, seed=1):
    """Non-trivial biases too (they are initialised to zeros)."""
    rng = np.random.RandomState(seed)
    for variable in layer.trainable_variables:
        variable.assign(rng.standard_normal(variable.shape).astype("float32") * 0.3)


PATHS = [pytest.param(None, id="fused"), pytest.param(False, id="generic")]


@pytest.mark.parametrize("flash_attention", PATHS)
@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_keras_multi_head_attention(flash_attention, use_bias, causal):
    query, value = random_inputs(2, 6, 12), random_inputs(2, 9, 10, seed=1)
    if causal:
        value = random_inputs(2, 6, 10, seed=1)
    reference = keras.layers.MultiHeadAttention(num_heads=3, key_dim=5, use_bias=use_bias)
    reference(query, value)
    randomise(reference)
    ours = MultiHeadAttention(
        num_heads=3, head_dim=5, use_bias=use_bias, flash_attention=flash_attention
    )
    ours(query, value)
    copy_weights_from_keras(reference, ours)
    expected = as_numpy(reference(query, value, use_causal_mask=causal))
    got = as_numpy(ours(query, value, use_causal_mask=causal))
    np.testing.assert_allclose(got, expected, atol=ATOL)


@pytest.mark.parametrize("flash_attention", PATHS)
@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 2), (8, 1), (4, 4)])
def test_matches_keras_group_query_attention(flash_attention, num_heads, num_kv_heads):
    query, value = random_inputs(2, 7, 16), random_inputs(2, 5, 16, seed=2)
    mask = np.random.RandomState(3).rand(2, 7, 5) > 0.3
    mask[..., 0] = True  # Keras averages fully masked rows; we return zeros.
    reference = keras.layers.GroupQueryAttention(
        head_dim=6, num_query_heads=num_heads, num_key_value_heads=num_kv_heads
    )
    reference(query, value)
    randomise(reference)
    ours = GroupedQueryAttention(
        num_heads, num_kv_heads, head_dim=6, flash_attention=flash_attention
    )
    ours(query, value)
    copy_weights_from_keras(reference, ours)
    expected, expected_scores = reference(
        query, value, attention_mask=mask, return_attention_scores=True
    )
    got = ours(query, value, attention_mask=mask)
    np.testing.assert_allclose(as_numpy(got), as_numpy(expected), atol=ATOL)
    _, scores = ours(query, value, attention_mask=mask, return_attention_scores=True)
    np.testing.assert_allclose(as_numpy(scores), as_numpy(expected_scores), atol=ATOL)


def test_weight_mapping_both_ways():
    x = random_inputs(1, 4, 8)
    ours = GroupedQueryAttention(4, 2, head_dim=3)
    ours(x)
    randomise(ours)
    reference = keras.layers.GroupQueryAttention(
        head_dim=3, num_query_heads=4, num_key_value_heads=2
    )
    reference(x, x)
    copy_weights_to_keras(ours, reference)
    np.testing.assert_allclose(as_numpy(reference(x, x)), as_numpy(ours(x)), atol=ATOL)
    back = GroupedQueryAttention(4, 2, head_dim=3)
    back(x)
    copy_weights_from_keras(reference, back)
    for a, b in zip(ours.weights, back.weights, strict=True):
        np.testing.assert_array_equal(as_numpy(a), as_numpy(b))


def test_weight_mapping_errors():
    x = random_inputs(1, 4, 8)
    reference = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    reference(x, x)
    wrong_heads = MultiHeadAttention(4, head_dim=4)
    wrong_heads(x)
    with pytest.raises(ValueError, match="query_kernel"):
        copy_weights_from_keras(reference, wrong_heads)
    no_bias = MultiHeadAttention(2, head_dim=4, use_bias=False)
    no_bias(x)
    with pytest.raises(ValueError, match="bias"):
        copy_weights_from_keras(reference, no_bias)
    gated = MultiHeadAttention(2, head_dim=4)
    gated(x)
    gated.head_gates.assign([1.0, 0.0])
    with pytest.raises(ValueError, match="head gates"):
        copy_weights_to_keras(gated, reference)


@pytest.mark.parametrize("flash_attention", PATHS)
@pytest.mark.parametrize(
    "layer_factory",
    [
        pytest.param(lambda **kw: MultiHeadAttention(4, head_dim=5, **kw), id="mha"),
        pytest.param(lambda **kw: GroupedQueryAttention(6, 2, head_dim=5, **kw), id="gqa"),
        pytest.param(lambda **kw: MultiQueryAttention(4, head_dim=5, **kw), id="mqa"),
    ],
)
def test_matches_numpy(layer_factory, flash_attention):
    query, value = random_inputs(2, 5, 12), random_inputs(2, 8, 7, seed=4)
    mask = np.random.RandomState(5).rand(2, 5, 8) > 0.4
    mask[1, 2] = False  # A row with nothing to attend: zeros, not NaN.
    layer = layer_factory(output_dim=9, use_output_bias=True, flash_attention=flash_attention)
    layer(query, value)
    randomise(layer)
    expected, expected_weights = attention_numpy(layer, query, value, mask=mask)
    got, weights = layer(query, value, attention_mask=mask, return_attention_scores=True)
    np.testing.assert_allclose(as_numpy(got), expected, atol=ATOL)
    np.testing.assert_allclose(as_numpy(weights), expected_weights, atol=ATOL)
    fast = as_numpy(layer(query, value, attention_mask=mask))
    np.testing.assert_allclose(fast, expected, atol=ATOL)
    assert np.isfinite(fast).all()


def test_features_and_head_dim_are_independent():
    """Gemma-style head_dim != hidden / heads; cross-attention with other feature sizes."""
    query, value, key = random_inputs(2, 3, 10), random_inputs(2, 6, 7), random_inputs(2, 6, 5)
    layer = GroupedQueryAttention(4, 2, head_dim=16, output_dim=11)
    out = layer(query, value, key)
    assert tuple(out.shape) == (2, 3, 11)
    assert tuple(layer.query_kernel.shape) == (10, 4, 16)
    assert tuple(layer.key_kernel.shape) == (5, 2, 16)
    assert tuple(layer.value_kernel.shape) == (7, 2, 16)
    assert tuple(layer.output_kernel.shape) == (4, 16, 11)


@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="torch.nn.functional.scaled_dot_product_attention is a torch reference",
)
@pytest.mark.parametrize("flash_attention", PATHS)
@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 2), (4, 1), (4, 4)])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_torch_sdpa(flash_attention, num_heads, num_kv_heads, causal):
    import torch
    import torch.nn.functional as F

    x = random_inputs(2, 6, 16)
    layer = GroupedQueryAttention(
        num_heads, num_kv_heads, head_dim=4, causal=causal, flash_attention=flash_attention
    )
    layer(x)
    randomise(layer)
    # The reference runs where the layer's weights live (cuda on a GPU machine).
    tx = torch.from_numpy(x).to(layer.query_kernel.value.device)
    q = (
        torch.einsum("btf,fhd->bhtd", tx, layer.query_kernel.value)
        + layer.query_bias.value[None, :, None]
    )
    k = (
        torch.einsum("btf,fhd->bhtd", tx, layer.key_kernel.value)
        + layer.key_bias.value[None, :, None]
    )
    v = (
        torch.einsum("btf,fhd->bhtd", tx, layer.value_kernel.value)
        + layer.value_bias.value[None, :, None]
    )
    # Reference without enable_gqa: repeat K/V explicitly per query head.
    groups = num_heads // num_kv_heads
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    heads = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    expected = torch.einsum("bhtd,hdo->bto", heads, layer.output_kernel.value)
    expected = expected + layer.output_bias.value
    np.testing.assert_allclose(as_numpy(layer(x)), expected.detach().cpu().numpy(), atol=ATOL)
