"""KV cache: prefill + single-token steps equal the full causal pass; fixed shape
so a decode step compiles once under jax.jit / tf.function(jit_compile=True) /
torch.compile."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_mha import backends
from keras_mha.layers import GroupedQueryAttention, MultiHeadAttention, MultiQueryAttention
from tests.layers.test_reference import random_inputs, randomise
from tests.reference import attention_numpy

BACKEND = keras.backend.backend()


def grad_modes():
    """Autograd on and, on PyTorch, off: off, eager steps run in plain torch ops
    (backends/torch/eager_decode.py); on, they take the general path."""
    import contextlib

    if BACKEND != "torch":
        return [contextlib.nullcontext]
    import torch

    return [contextlib.nullcontext, torch.no_grad]


def decode_incrementally(layer, x, prefill, max_length, grad_mode=None):
    if grad_mode is not None:
        with grad_mode():
            return decode_incrementally(layer, x, prefill, max_length)
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
    for grad_mode in grad_modes():
        incremental, cache = decode_incrementally(layer, x, 5, 16, grad_mode)
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
    with pytest.raises(ValueError, match=r"`cache_index`=2 was given without a `cache`"):
        layer(x, cache_index=2)
    with pytest.raises(ValueError, match=r"either `value` or a read-only `cache`"):
        layer(x, x, cache=cache)
    with pytest.raises(ValueError, match=r"`cache_index` is for self-attention decoding"):
        layer(x, x, cache=cache, cache_index=0)


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
def test_decode_function_compiles_one_step_for_every_position(monkeypatch):
    """`make_decode_function`: on JAX and TensorFlow one trace for the prefill and one
    for every step, the cache donated (JAX) or written in place (TensorFlow variables);
    on PyTorch, `torch.compile` of the layer's step traces once."""
    x = random_inputs(2, 10, 32)
    layer = GroupedQueryAttention(8, 2, head_dim=8, causal=True, use_rope=True)
    layer(x)
    full = ops.convert_to_numpy(layer(x))
    if BACKEND == "torch":
        cache = layer.init_cache(2, 16)
        _, cache = layer(x[:, :4], cache=cache, cache_index=0)
        step, compile_count = _compile_counting(
            lambda token, cache, index: layer(token, cache=cache, cache_index=index)
        )
    else:
        traces = []
        call = layer.call
        monkeypatch.setattr(layer, "call", lambda *a, **kw: traces.append(1) or call(*a, **kw))
        decode = layer.make_decode_function()
        cache = layer.init_cache(2, 16, variables=BACKEND == "tensorflow")
        output, cache = decode(x[:, :4], cache, 0)
        np.testing.assert_allclose(ops.convert_to_numpy(output), full[:, :4], atol=1e-5)

        def step(token, cache, index):
            return decode(token, cache, index)

        def compile_count():
            return len(traces)

    outputs = []
    for position in range(4, 10):
        index = ops.convert_to_tensor(position, dtype="int32") if BACKEND == "torch" else position
        token = ops.convert_to_tensor(x[:, position : position + 1])
        output, new_cache = step(token, cache, index)
        if BACKEND == "jax":  # donated: XLA wrote the new cache over it
            assert cache.key.is_deleted()
        if BACKEND == "tensorflow":  # the same variables
            assert all(new is old for new, old in zip(new_cache, cache, strict=True))
        cache = new_cache
        outputs.append(ops.convert_to_numpy(output))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full[:, 4:], atol=1e-5)
    assert compile_count() == (1 if BACKEND == "torch" else 2)


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "torch", reason="torch.compile")
def test_compiled_torch_decode_from_a_one_token_prompt():
    """`make_decode_function(compile_torch=True)` decoding from a one-token prefill: the
    prefill's graph and the step's take tensors of the same shapes, and a second layer
    of those shapes (with a window) has graphs of its own; none may serve another. The
    second decodes NumPy tokens, converted as Keras's `__call__` would."""
    x = ops.convert_to_tensor(random_inputs(1, 6, 16))
    for window, tokens in ((None, x), (2, random_inputs(1, 6, 16))):
        layer = GroupedQueryAttention(4, 2, head_dim=4, causal=True, sliding_window=window)
        layer(x)
        randomise(layer)
        expected = ops.convert_to_numpy(layer(x))
        decode = layer.make_decode_function(compile_torch=True)
        cache, outputs = layer.init_cache(1, 8), []
        for position in range(6):
            output, cache = decode(tokens[:, position : position + 1], cache, position)
            outputs.append(ops.convert_to_numpy(output))
        np.testing.assert_allclose(np.concatenate(outputs, axis=1), expected, atol=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(BACKEND != "torch", reason="torch.compile")
def test_compiled_torch_decode_alternates_caches_and_refuses_an_overrun_after_warm_steps():
    """Two caches of different lengths decoded in turns by one compiled decode function
    (its step over `layer.call` is kept per tensor signature, and the last one is reused
    only for the same cache): both equal the full pass; a warm step's overrun is refused."""
    x = ops.convert_to_tensor(random_inputs(1, 6, 16))
    layer = GroupedQueryAttention(4, 2, head_dim=4, causal=True)
    layer(x)
    randomise(layer)
    expected = ops.convert_to_numpy(layer(x))
    decode = layer.make_decode_function(compile_torch=True)
    caches = {8: layer.init_cache(1, 8), 6: layer.init_cache(1, 6)}
    outputs = {length: [] for length in caches}
    for position in range(6):
        for length, cache in caches.items():
            output, caches[length] = decode(x[:, position : position + 1], cache, position)
            outputs[length].append(ops.convert_to_numpy(output))
    for got in outputs.values():
        np.testing.assert_allclose(np.concatenate(got, axis=1), expected, atol=1e-5)
    with pytest.raises(ValueError, match=r"`cache_index`=6 overruns.*max_length is 6"):
        decode(x[:, :1], caches[6], 6)


# ----------------------------------------------------------- single-token path
@pytest.mark.parametrize("num_heads, num_kv_heads, window", [(8, 2, 3), (4, 1, None)])
def test_single_token_steps_match_generic_path_and_numpy(num_heads, num_kv_heads, window):
    """The fused one-token step equals the generic keras.ops path and NumPy."""
    x = random_inputs(2, 6, 16)
    fused = GroupedQueryAttention(
        num_heads, num_kv_heads, head_dim=4, causal=True, sliding_window=window
    )
    fused(x)
    randomise(fused)
    generic = GroupedQueryAttention.from_config({**fused.get_config(), "flash_attention": False})
    generic(x)
    generic.set_weights(fused.get_weights())
    expected, _ = attention_numpy(fused, x, causal=True, sliding_window=window)
    for layer in (fused, generic):
        for grad_mode in grad_modes():
            got, _ = decode_incrementally(layer, x, 3, 8, grad_mode)
            np.testing.assert_allclose(got, expected, atol=1e-5)


def test_left_padded_batch_decodes_like_the_full_pass():
    """Rows padded on the left by different amounts, masked over the whole cache."""
    x = random_inputs(2, 7, 16)
    layer = GroupedQueryAttention(4, 2, head_dim=4, causal=True, use_rope=True)
    layer(x)
    randomise(layer)
    keep = np.ones((2, 7), bool)
    keep[0, :3] = False
    keep[1, :1] = False
    expected, _ = attention_numpy(
        layer, x, mask=np.repeat(keep[:, None], 7, axis=1), causal=True, rope_theta=10000.0
    )
    max_length = 9
    key_valid = np.zeros((2, max_length), bool)
    key_valid[:, :7] = keep
    for grad_mode in grad_modes():
        with grad_mode():
            cache = layer.init_cache(2, max_length)
            out, cache = layer(
                x[:, :5],
                cache=cache,
                cache_index=0,
                attention_mask=np.repeat(key_valid[:, None], 5, 1),
            )
            steps = [ops.convert_to_numpy(out)]
            for t in (5, 6):
                out, cache = layer(
                    x[:, t : t + 1], cache=cache, cache_index=t, attention_mask=key_valid[:, None]
                )
                steps.append(ops.convert_to_numpy(out))
        got = np.concatenate(steps, axis=1)
        # Padded query rows attend to nothing valid before them; compare real tokens.
        np.testing.assert_allclose(got[0, 3:], expected[0, 3:], atol=1e-5)
        np.testing.assert_allclose(got[1, 1:], expected[1, 1:], atol=1e-5)


# --------------------------------------------------------------- cache checks
def test_cache_must_match_the_layer():
    x = random_inputs(2, 3, 16)
    layer = GroupedQueryAttention(4, 2, head_dim=4, causal=True)
    layer(x)
    good = layer.init_cache(2, 8)
    with pytest.raises(ValueError, match=r"dtype int32.*computes in float32"):
        layer(x, cache=(ops.zeros((2, 2, 8, 4), "int32"),) * 2, cache_index=0)
    with pytest.raises(ValueError, match=r"batch=2.*shape \(1, 2, 8, 4\)"):
        layer(x, cache=layer.init_cache(1, 8), cache_index=0)
    with pytest.raises(ValueError, match=r"num_key_value_heads=2.*shape \(2, 4, 8, 4\)"):
        layer(x, cache=(ops.zeros((2, 4, 8, 4)),) * 2, cache_index=0)
    with pytest.raises(ValueError, match=r"head_dim=4.*shape \(2, 2, 8, 8\)"):
        layer(x, cache=(ops.zeros((2, 2, 8, 8)),) * 2, cache_index=0)
    with pytest.raises(ValueError, match=r"\(key, value\) pair.*\(2, 2, 8, 2, 4\)"):
        layer(x, cache=ops.zeros((2, 2, 8, 2, 4)), cache_index=0)  # keras-mha 0.1 layout
    with pytest.raises(ValueError, match="same shape"):
        layer(x, cache=(good.key, ops.zeros((2, 2, 9, 4))), cache_index=0)
    for dtype in ("int32", "bfloat16"):
        expected = rf"'{dtype}' of a KV cache: expected None or the layer's compute dtype 'float32'"
        with pytest.raises(ValueError, match=expected):
            layer.init_cache(2, 8, dtype=dtype)
    with pytest.raises(ValueError, match=r"query has 3 tokens.*max_length=2"):
        layer(x, cache=layer.init_cache(2, 2), cache_index=0)


# ------------------------------------------------------------------- overflow
@pytest.mark.parametrize("index", [-1, 7])
def test_static_overrun_is_refused_even_when_compiled(index):
    x = random_inputs(1, 2, 16)
    layer = GroupedQueryAttention(4, 2, head_dim=4, causal=True)
    layer(x)
    cache = layer.init_cache(1, 8)
    with pytest.raises(ValueError, match=rf"`cache_index`={index} overruns.*max_length is 8"):
        layer(x, cache=cache, cache_index=index)
    if BACKEND == "jax":
        import jax

        # A Python int index inside jit is known at trace time: refused there.
        with pytest.raises(ValueError, match="overruns"):
            jax.jit(lambda c: layer(x, cache=c, cache_index=index))(cache)


@pytest.mark.skipif(BACKEND != "torch", reason="torch.compile")
def test_compiled_torch_decode_refuses_an_int_index_that_overruns():
    """The compiled step's wrapper checks an int index (its graph then has no guard)."""
    x = ops.convert_to_tensor(random_inputs(1, 2, 16))
    layer = GroupedQueryAttention(4, 2, head_dim=4, causal=True)
    layer(x)
    decode = layer.make_decode_function(compile_torch=True)
    cache = layer.init_cache(1, 8)
    for index in (7, -1, np.int64(9)):
        with pytest.raises(ValueError, match=rf"`cache_index`={index} overruns.*max_length is 8"):
            decode(x, cache, index)


def test_traced_overrun_gives_nan_and_leaves_the_cache_unchanged():
    x = ops.convert_to_tensor(random_inputs(1, 6, 16))
    layer = GroupedQueryAttention(4, 2, head_dim=4, causal=True)
    layer(x)
    cache = layer.init_cache(1, 6)
    _, cache = layer(x[:, :4], cache=cache, cache_index=0)
    before = [ops.convert_to_numpy(buffer).copy() for buffer in cache]

    def step(tokens, cache, index):
        return layer(tokens, cache=cache, cache_index=index)

    if BACKEND == "torch":
        import torch

        # Eager PyTorch reads a CPU index (made there: the default device may be a GPU's,
        # whose index it does not wait for): refused like a Python int.
        with pytest.raises(ValueError, match="overruns"):
            step(x[:, :2], cache, torch.tensor(5, dtype=torch.int32, device="cpu"))
        torch._dynamo.reset()
        compiled = torch.compile(step, backend="eager", fullgraph=True)
    elif BACKEND == "jax":
        import jax

        compiled = jax.jit(step)
    else:
        import tensorflow as tf

        compiled = tf.function(step, jit_compile=True)
    good, cache_after_good = compiled(x[:, 4:5], cache, ops.convert_to_tensor(4, "int32"))
    assert np.all(np.isfinite(ops.convert_to_numpy(good)))
    # Reset: the good step wrote slot 4 (in place on torch).
    cache = layer.init_cache(1, 6)
    _, cache = layer(x[:, :4], cache=cache, cache_index=0)
    for index in (5, -1):  # 2 tokens at 5 overrun a 6-slot cache; -1 is before it
        output, new_cache = compiled(x[:, 4:6], cache, ops.convert_to_tensor(index, "int32"))
        assert np.all(np.isnan(ops.convert_to_numpy(output)))
        for buffer, old in zip(new_cache, before, strict=True):
            np.testing.assert_array_equal(ops.convert_to_numpy(buffer), old)


# ---------------------------------------------------------- in-place (torch)
@pytest.mark.skipif(BACKEND != "torch", reason="in-place buffers are a PyTorch property")
def test_torch_step_writes_the_cache_in_place():
    import torch

    x = random_inputs(1, 6, 16)
    layer = GroupedQueryAttention(4, 2, head_dim=4, causal=True, use_rope=True)
    full = ops.convert_to_numpy(layer(x))
    cache = layer.init_cache(1, 8)
    pointers = [buffer.data_ptr() for buffer in cache]
    with torch.no_grad():
        _, cache = layer(x[:, :5], cache=cache, cache_index=0)
        for index in (5, ops.convert_to_tensor(5, "int32")):  # int and tensor indices
            step, returned = layer(x[:, 5:6], cache=cache, cache_index=index)
            assert [buffer.data_ptr() for buffer in returned] == pointers
            assert all(new is old for new, old in zip(returned, cache, strict=True))
            np.testing.assert_allclose(ops.convert_to_numpy(step), full[:, 5:], atol=1e-5)
    # With autograd recording, the update is functional so gradients stay right.
    cache = layer.init_cache(1, 8)
    output, new_cache = layer(x[:, :5], cache=cache, cache_index=0)
    assert new_cache.key.data_ptr() != cache.key.data_ptr()
    assert not np.any(ops.convert_to_numpy(cache.key))
    output.sum().backward()
    assert layer.key_kernel.value.grad is not None


@pytest.mark.skipif(BACKEND != "torch", reason="the eager torch step's chunk masks (cheap here)")
@pytest.mark.parametrize("window, rotary_factor", [(None, 0.5), (3, 1.0)])
def test_chunked_steps_equal_full_causal_pass(window, rotary_factor):
    """Several tokens per step after the prefill (speculative / chunked decoding), with
    autograd on (the general path) and off (backends/torch/eager_decode.py builds its own masks)."""
    x = random_inputs(2, 9, 16)
    layer = GroupedQueryAttention(
        4,
        2,
        head_dim=4,
        causal=True,
        use_rope=True,
        partial_rotary_factor=rotary_factor,
        sliding_window=window,
    )
    full = ops.convert_to_numpy(layer(x))
    for grad_mode in grad_modes():
        with grad_mode():
            cache = layer.init_cache(2, 12)
            outputs = []
            for start, stop in ((0, 4), (4, 7), (7, 8), (8, 9)):
                out, cache = layer(x[:, start:stop], cache=cache, cache_index=start)
                outputs.append(ops.convert_to_numpy(out))
        np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, atol=1e-5)


# ------------------------------------------------- variable cache (TensorFlow)
def _step_function(layer, cache):
    """A `tf.function(jit_compile=True)` step on a variable cache that it does not return."""
    import tensorflow as tf

    @tf.function(jit_compile=True)
    def step(tokens, index):
        output, returned = layer(tokens, cache=cache, cache_index=index)
        # The same variables, written in place.
        assert all(new is old for new, old in zip(returned, cache, strict=True))
        return output

    return step


@pytest.mark.skipif(BACKEND == "tensorflow", reason="TensorFlow builds variable caches")
def test_variable_cache_is_refused_where_the_default_is_already_in_place():
    layer = GroupedQueryAttention(4, 2, head_dim=4, causal=True)
    layer(random_inputs(1, 2, 16))
    expected = "donate_argnums" if BACKEND == "jax" else "already written in place"
    with pytest.raises(
        ValueError, match=rf"`variables=True`.*TensorFlow.*on {BACKEND}.*{expected}"
    ):
        layer.init_cache(1, 8, variables=True)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="variable caches are TensorFlow's")
def test_variable_cache_equals_functional_cache_and_full_pass():
    import tensorflow as tf

    x = random_inputs(2, 9, 16)
    layer = GroupedQueryAttention(4, 2, head_dim=4, causal=True, use_rope=True, sliding_window=5)
    layer(x)
    randomise(layer)
    full = ops.convert_to_numpy(layer(x))
    expected, functional = decode_incrementally(layer, x, 4, 12)
    cache = layer.init_cache(2, 12, variables=True)
    assert cache.in_place and all(isinstance(b, tf.Variable) for b in cache)
    assert not any(b.trainable for b in cache) and not layer.non_trainable_weights[1:]
    output, returned = layer(x[:, :4], cache=cache, cache_index=0)  # eager prefill
    assert all(new is old for new, old in zip(returned, cache, strict=True))
    step = _step_function(layer, cache)
    outputs = [ops.convert_to_numpy(output)]
    for position in range(4, 9):
        index = ops.convert_to_tensor(position, "int32")
        outputs.append(ops.convert_to_numpy(step(x[:, position : position + 1], index)))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), full, atol=1e-5)
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), expected, atol=1e-6)
    for variable, buffer in zip(cache, functional, strict=True):
        np.testing.assert_allclose(variable.numpy(), ops.convert_to_numpy(buffer), atol=1e-6)
    assert step.experimental_get_tracing_count() == 1
    # A keras.Variable holding the buffers is written in place too (eager call).
    wrapped = [keras.Variable(np.zeros((2, 2, 12, 4), "float32"), trainable=False) for _ in "kv"]
    layer(x[:, :4], cache=tuple(wrapped), cache_index=0)
    np.testing.assert_allclose(wrapped[0].numpy()[:, :, :4], cache.key.numpy()[:, :, :4])
    with pytest.raises(ValueError, match="must all be variables"):
        layer(x[:, :1], cache=(cache.key, functional.value), cache_index=4)
    with pytest.raises(ValueError, match="outside the traced function"):
        tf.function(lambda: layer.init_cache(2, 12, variables=True).key)()
    with pytest.raises(ValueError, match="`variables` must be True or False"):
        layer.init_cache(2, 12, variables="yes")


@pytest.mark.skipif(BACKEND != "tensorflow", reason="variable caches are TensorFlow's")
def test_variable_cache_overruns():
    x = ops.convert_to_tensor(random_inputs(1, 6, 16))
    layer = GroupedQueryAttention(4, 2, head_dim=4, causal=True)
    layer(x)
    cache = layer.init_cache(1, 6, variables=True)
    layer(x[:, :4], cache=cache, cache_index=0)
    before = [buffer.numpy().copy() for buffer in cache]
    for index in (5, -1):  # refused when known, NaN and untouched when traced
        with pytest.raises(ValueError, match=rf"`cache_index`={index} overruns.*max_length is 6"):
            layer(x[:, 4:6], cache=cache, cache_index=index)
        output = _step_function(layer, cache)(x[:, 4:6], ops.convert_to_tensor(index, "int32"))
        assert np.all(np.isnan(ops.convert_to_numpy(output)))
        for buffer, old in zip(cache, before, strict=True):
            np.testing.assert_array_equal(buffer.numpy(), old)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="variable caches are TensorFlow's")
def test_compiled_variable_step_never_copies_the_cache():
    """In XLA's optimised HLO, the cache is only ever a parameter aliased to an output,
    updated by a scatter and read through free reshapes: no copy of it per step."""
    import re

    x = random_inputs(1, 3, 16)
    layer = GroupedQueryAttention(4, 2, head_dim=8, causal=True)
    layer(x)
    cache = layer.init_cache(1, 96, variables=True)
    step = _step_function(layer, cache)
    hlo = step.experimental_get_compiler_ir(x[:, :1], ops.convert_to_tensor(3, "int32"))(
        stage="optimized_hlo"
    )
    assert "input_output_alias" in hlo.splitlines()[0]
    entry = hlo[hlo.index("\nENTRY") :]
    # Every instruction making a buffer the size of the cache, (1, 2, 96, 8) or a
    # reshape / transpose of it: `%name = f32[dims]{layout} opcode(operands)`.
    instruction = re.compile(r"^\s*(?:ROOT )?%\S+ = f32\[([\d,]+)\]\{[\d,]*\} ([\w-]+)\(")
    producers = []
    for line in entry.splitlines():
        match = instruction.match(line)
        if match and np.prod([int(d) for d in match.group(1).split(",")]) == 2 * 96 * 8:
            producers.append(match.group(2))
    kinds = {p for p in producers if p not in ("parameter", "bitcast")}
    assert kinds == {"fusion"}, producers
    scatters = [line for line in entry.splitlines() if "scatter" in line and "fusion(" in line]
    assert len(scatters) == 2 and producers.count("fusion") == 2, producers


@pytest.mark.skipif(BACKEND != "jax", reason="the donated cache of a jax.jit step")
def test_jax_decode_step_updates_the_donated_cache_without_copying_it():
    """In XLA's optimised HLO of the decode function's step, each cache buffer is a
    donated parameter aliased to an output, updated in place and read as it lies: no
    instruction copies it (grouped queries over a cache that `prefers_two_fusions`). A
    bitcast (XLA's GPU compiler adds one per output) reinterprets a buffer, copying nothing."""
    import re

    x = random_inputs(1, 3, 16)
    layer = GroupedQueryAttention(8, 2, head_dim=16, causal=True)
    layer(x)
    cache = layer.init_cache(1, 2048)
    step = backends.compile_decode_step(
        layer, lambda x, mask, cache, index: layer(x, cache=cache, cache_index=index)
    )
    hlo = step.lower(x[:, :1], None, cache, 3).compile().as_text()
    assert "input_output_alias" in hlo.splitlines()[0]
    entry = hlo[hlo.index("\nENTRY") :]
    # Instructions making a buffer the size of the cache, (1, 2, 2048, 16) or a view of it.
    instruction = re.compile(r"^\s*(?:ROOT )?%\S+ = f32\[([\d,]+)\]\{[\d,]*\} ([\w-]+)\(")
    producers = [
        match.group(2)
        for match in map(instruction.match, entry.splitlines())
        if match and np.prod([int(d) for d in match.group(1).split(",")]) == 2 * 2048 * 16
    ]
    copies = sorted(p for p in producers if p != "bitcast")
    assert copies == ["fusion", "fusion", "parameter", "parameter"], producers
