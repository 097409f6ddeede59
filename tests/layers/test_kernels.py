"""The attention kernels against each other: blockwise causal, fused, generic."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_mha.backends.common import attention_kernels, decode_attention
from keras_mha.layers import GroupedQueryAttention
from tests.layers.test_reference import random_inputs, randomise
from tests.reference import attention_numpy


def tensor(*shape, seed=0):
    return ops.convert_to_tensor(random_inputs(*shape, seed=seed))


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2), (4, 1)])
@pytest.mark.parametrize("length", [600, 257])
def test_blockwise_causal_equals_generic_causal(num_heads, num_kv_heads, length):
    """Including a last block shorter than the others (600 = 4 * 128 + 88)."""
    query = tensor(2, length, num_heads, 8)
    key, value = (
        tensor(2, length, num_kv_heads, 8, seed=1),
        tensor(2, length, num_kv_heads, 8, seed=2),
    )
    mask = attention_kernels.causal_mask_for(query, key)
    expected = attention_kernels.grouped_attention(query, key, value, mask, scale=0.3)
    got = attention_kernels.blockwise_causal_attention(query, key, value, scale=0.3, block_size=128)
    np.testing.assert_allclose(ops.convert_to_numpy(got), ops.convert_to_numpy(expected), atol=1e-5)


def test_blockwise_block_size_keeps_query_rows_per_matmul_near_256():
    sizes = [attention_kernels.causal_block_size(groups) for groups in (1, 2, 4, 8, 16)]
    assert sizes == [128, 128, 64, 32, 32]


def test_blockwise_causal_in_bfloat16_matches_float32(dtype="bfloat16"):
    """Default blocks (4 groups: 64, 64, 22); 16-bit results equal float32 to their precision."""
    query, key, value = (
        tensor(1, 150, 4, 8),
        tensor(1, 150, 1, 8, seed=1),
        tensor(1, 150, 1, 8, seed=2),
    )
    mask = attention_kernels.causal_mask_for(query, key)
    expected = attention_kernels.grouped_attention(query, key, value, mask, scale=0.3)
    half = [ops.cast(t, dtype) for t in (query, key, value)]
    got = attention_kernels.blockwise_causal_attention(*half, scale=0.3)
    assert keras.backend.standardize_dtype(got.dtype) == dtype
    np.testing.assert_allclose(
        ops.convert_to_numpy(ops.cast(got, "float32")), ops.convert_to_numpy(expected), atol=3e-2
    )


def test_layer_uses_blockwise_path_where_preferred_and_matches_numpy():
    length = 4 * attention_kernels.CAUSAL_BLOCK_SIZE + 40
    x = random_inputs(1, length, 16)
    layer = GroupedQueryAttention(4, 2, head_dim=4, causal=True)
    layer(x)
    randomise(layer)
    query = ops.zeros((1, length, 4, 4))
    expected_choice = keras.backend.backend() == "tensorflow" or (
        keras.backend.backend() == "jax" and __import__("jax").default_backend() == "cpu"
    )
    assert attention_kernels.prefers_blockwise_causal(query, query) == expected_choice
    expected, _ = attention_numpy(layer, x, causal=True)
    np.testing.assert_allclose(ops.convert_to_numpy(layer(x)), expected, atol=1e-5)


def test_blockwise_is_not_used_for_short_or_cross_attention():
    short = ops.zeros((1, 100, 4, 8))
    long = ops.zeros((1, 1024, 4, 8))
    assert not attention_kernels.prefers_blockwise_causal(short, short)
    assert not attention_kernels.prefers_blockwise_causal(long, ops.zeros((1, 900, 4, 8)))


def test_fused_without_empty_row_guard_matches_for_causal_masks():
    query = tensor(1, 9, 4, 8)
    key = tensor(1, 9, 2, 8, seed=3)
    mask = attention_kernels.causal_mask_for(query, key)
    guarded = attention_kernels.fused_attention(query, key, key, mask, scale=0.2)
    unguarded = attention_kernels.fused_attention(
        query, key, key, mask, scale=0.2, rows_may_be_empty=False
    )
    np.testing.assert_allclose(
        ops.convert_to_numpy(unguarded), ops.convert_to_numpy(guarded), atol=1e-6
    )


@pytest.mark.parametrize("num_heads, num_kv_heads", [(8, 2), (4, 4)])
def test_single_query_attention_over_the_old_cache_equals_attention_over_the_written_one(
    num_heads, num_kv_heads
):
    """JAX's decode kernel (plain keras.ops, so checked on every backend): masks over the
    cache with a row left empty, one whose only key is the new token, and none."""
    rng = np.random.RandomState(6)
    batch, length, head_dim, position = 3, 9, 8, 5
    query = tensor(batch, 1, num_heads, head_dim)
    new_key, new_value = (tensor(batch, 1, num_kv_heads, head_dim, seed=s) for s in (1, 2))
    old_key, old_value = (tensor(batch, num_kv_heads, length, head_dim, seed=s) for s in (3, 4))
    written = [np.array(ops.convert_to_numpy(b)) for b in (old_key, old_value)]
    for buffer, new in zip(written, (new_key, new_value), strict=True):
        buffer[:, :, position] = ops.convert_to_numpy(new)[:, 0]
    mask = rng.rand(batch, num_heads, 1, length) > 0.3
    mask[..., position + 1 :] = False  # unwritten positions
    mask[0] = False  # nothing to attend: zeros
    mask[1, :, :, :] = False
    mask[1, :, :, position] = True  # only the new token
    written = [ops.convert_to_tensor(buffer) for buffer in written]
    for step_mask in (ops.convert_to_tensor(mask), None):  # None: every position counts
        expected = attention_kernels.grouped_attention(
            query, *written, step_mask, scale=0.3, key_heads_first=True
        )
        got = decode_attention.single_query_attention(
            query, new_key, new_value, old_key, old_value, step_mask, position=position, scale=0.3
        )
        np.testing.assert_allclose(
            ops.convert_to_numpy(got), ops.convert_to_numpy(expected), atol=1e-5
        )


@pytest.mark.parametrize("num_heads, num_kv_heads", [(8, 2), (4, 4)])
def test_two_fusion_attention_equals_grouped_attention_over_the_cache(num_heads, num_kv_heads):
    """JAX's decode kernel (plain keras.ops, so checked on every backend): masks over the
    cache with a row left empty, one with a single key, per-head masks, and none."""
    rng = np.random.RandomState(6)
    batch, length, head_dim, position = 3, 9, 8, 5
    query = tensor(batch, 1, num_heads, head_dim)
    key, value = (tensor(batch, num_kv_heads, length, head_dim, seed=s) for s in (3, 4))
    mask = rng.rand(batch, num_heads, 1, length) > 0.3
    mask[..., position + 1 :] = False  # unwritten positions
    mask[0] = False  # nothing to attend: zeros
    mask[1, :, :, :] = False
    mask[1, :, :, position] = True  # only the newest token
    shared = np.arange(length)[None, None, None, :] <= position  # (1, 1, 1, S), as the layer's
    masks = (mask, shared, None)  # None: every position counts
    assert_matches_grouped_attention(
        decode_attention.two_fusion_attention, query, key, value, masks
    )


def assert_matches_grouped_attention(kernel, query, key, value, masks):
    """`kernel(query, key, value, mask, scale=0.3)` equals grouped attention over the
    heads-first cache `key`, `value` under each of `masks` (NumPy or None)."""
    for mask in masks:
        mask = None if mask is None else ops.convert_to_tensor(mask)
        expected = attention_kernels.grouped_attention(
            query, key, value, mask, scale=0.3, key_heads_first=True
        )
        got = kernel(query, key, value, mask, scale=0.3)
        np.testing.assert_allclose(
            ops.convert_to_numpy(got), ops.convert_to_numpy(expected), atol=1e-5
        )


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="PyTorch's decode kernel")
@pytest.mark.parametrize("native_gqa", [False, True], ids=["grouped-layout", "enable-gqa"])
def test_torch_one_query_attention_equals_grouped_attention_in_both_layouts(
    monkeypatch, native_gqa
):
    """Both of PyTorch's decode layouts (the CPU's grouped queries, CUDA's enable_gqa
    without a mask; the second forced onto the CPU here) under per-head, shared and no
    masks."""
    devices = ("cpu", "cuda") if native_gqa else ()
    from keras_mha.backends.torch import attention

    monkeypatch.setattr(attention, "NATIVE_GQA_DEVICES", devices)
    rng = np.random.RandomState(7)
    batch, num_heads, num_kv_heads, length, head_dim = 2, 8, 2, 9, 8
    query = tensor(batch, 1, num_heads, head_dim)
    key, value = (tensor(batch, num_kv_heads, length, head_dim, seed=s) for s in (3, 4))
    per_head = rng.rand(batch, num_heads, 1, length) > 0.3
    per_head[..., 0] = True  # no empty row, as the function asks
    shared = np.arange(length)[None, None, None, :] <= 5
    assert_matches_grouped_attention(
        attention.one_query_attention, query, key, value, (per_head, shared, None)
    )
