"""KV cache: prefill + single-token steps equal the full causal pass; fixed shape
so a decode step compiles once under jax.jit / tf.function(jit_compile=True) /
torch.compile."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_mha.layers import GroupedQueryAttention, MultiHeadAttention, MultiQueryAttention
from tests.test_layers_reference import random_inputs, randomise

BACKEND = keras.backend.backend()


def decode_incrementally(layer, x, prefill, max_length):
    cache = layer.init_cache(batch_size=x.shape[0], max_length=max_length)
    output, cache = layer(x[:, :prefill], cache=cache, cache_index=0)
    outputs = [ops.convert_to_numpy(output)]
    for position in range(prefill, x.shape[1]):
        output, cache = layer(x[:, position : position + 1], cache=cache, cache_index=position)
        outputs.append(ops.convert_to_numpy(output))
    return np.concatenate(outputs, axis=1), cache


@pytest.mark.parametrize(
    "layer_factory",
    [
        pytest.param(lambda **kw: MultiHeadAttention(4, head_dim=8, **kw), id="mha"),
        pytest.param(lambda **kw: GroupedQueryAttention(8, 2, head_dim=8, **kw), id="gqa"),
        pytest.param(lambda **kw: MultiQueryAttention(4, head_dim=8, **kw), id="mqa"),
    ],
)
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"use_rope": True, "rope_theta": 500.0},
        {"use_rope": True, "sliding_window": 4, "use_qk_norm": True},
        {"use_rope": True, "partial_rotary_factor": 0.5, "logit_soft_cap": 3.0},
    ],
    ids=["plain", "rope", "rope+window+qknorm", "partial-rope+softcap"],
)
def test_prefill_plus_steps_equal_full_causal_pass(layer_factory, options):
    x = random_inputs(2, 11, 32)
    layer = layer_factory(causal=True, **options)
    layer(x)
    randomise(layer)
    full = ops.convert_to_numpy(layer(x))
    incremental, cache = decode_incrementally(layer, x, prefill=5, max_length=16)
    np.testing.assert_allclose(incremental, full, atol=1e-5)
    # Only KV heads are stored.
    for buffer in cache:
        assert tuple(buffer.shape) == (2, layer.num_key_value_heads, 16, 8)


def test_cache_with_left_padding_mask():
    """Padded prompt tokens stay masked during decoding via attention_mask over the cache."""
    x = random_inputs(1, 6, 16)
    layer = GroupedQueryAttention(4, 2, head_dim=4, causal=True)
    layer(x)
    randomise(layer)
    keep = np.array([[False, False, True, True, True, True]])
    full = ops.convert_to_numpy(
        layer(x, attention_mask=keep[:, None, :] & np.ones((1, 6, 1), bool))
    )
    max_length = 8
    key_valid = np.zeros((1, max_length), bool)
    key_valid[0, :6] = keep[0]
    cache = layer.init_cache(1, max_length)
    out, cache = layer(
        x[:, :4],
        cache=cache,
        cache_index=0,
        attention_mask=np.repeat(key_valid[:, None], 4, axis=1),
    )
    steps = [ops.convert_to_numpy(out)]
    for t in (4, 5):
        out, cache = layer(
            x[:, t : t + 1], cache=cache, cache_index=t, attention_mask=key_valid[:, None]
        )
        steps.append(ops.convert_to_numpy(out))
    got = np.concatenate(steps, axis=1)
    np.testing.assert_allclose(got[:, 2:], full[:, 2:], atol=1e-5)


def test_cross_attention_cache_is_read_only_and_matches():
    encoder, decoder = random_inputs(2, 9, 12), random_inputs(2, 3, 16)
    layer = GroupedQueryAttention(4, 1, head_dim=6)
    expected = ops.convert_to_numpy(layer(decoder, encoder))
    cache = layer.compute_cross_attention_cache(encoder)
    got, same_cache = layer(decoder, cache=cache)
    np.testing.assert_allclose(ops.convert_to_numpy(got), expected, atol=1e-5)
    for got_buffer, buffer in zip(same_cache, cache, strict=True):
        np.testing.assert_array_equal(
            ops.convert_to_numpy(got_buffer), ops.convert_to_numpy(buffer)
        )


def test_cache_errors():
    x = random_inputs(1, 4, 16)
    layer = GroupedQueryAttention(4, 2, head_dim=4, causal=True)
    with pytest.raises(ValueError, match="init_cache"):
        layer.init_cache(1, 8)
    layer(x)
    cache = layer.init_cache(1, 5)
    with pytest.raises(ValueError, match=r"cache_index`=3.*max_length is 5"):
        layer(x, cache=cache, cache_index=3)
    with pytest.raises(ValueError, match="num_key_value_heads=2"):
        layer(x, cache=(ops.zeros((1, 4, 8, 4)),) * 2, cache_index=0)
    with pytest.raises(ValueError, match="max_length"):
        layer.init_cache(1, 0)


def _compile_counting(step):
    """Compile `step(x, cache, index)` the backend's way; return (fn, compile_count)."""
    if BACKEND == "jax":
        import jax

        traces = []

        def traced(*args):
            traces.append(1)
            return step(*args)

        return jax.jit(traced), lambda: len(traces)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        fn = tf.function(step, jit_compile=True, reduce_retracing=True)
        return fn, fn.experimental_get_tracing_count
    import torch

    torch._dynamo.reset()
    traces = []

    def counting_backend(graph_module, example_inputs):
        traces.append(1)
        return graph_module.forward

    return torch.compile(step, backend=counting_backend, dynamic=False), lambda: len(traces)


@pytest.mark.slow
def test_decode_step_compiles_once():
    x = random_inputs(2, 10, 32)
    layer = GroupedQueryAttention(8, 2, head_dim=8, causal=True, use_rope=True)
    layer(x)
    full = ops.convert_to_numpy(layer(x))
    cache = layer.init_cache(2, 16)
    _, cache = layer(x[:, :4], cache=cache, cache_index=0)

    def step(token, cache, index):
        return layer(token, cache=cache, cache_index=index)

    compiled, compile_count = _compile_counting(step)
    outputs = []
    for position in range(4, 10):
        index = ops.convert_to_tensor(position, dtype="int32")
        output, cache = compiled(ops.convert_to_tensor(x[:, position : position + 1]), cache, index)
        outputs.append(ops.convert_to_numpy(output))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full[:, 4:], atol=1e-5)
    assert compile_count() == 1
