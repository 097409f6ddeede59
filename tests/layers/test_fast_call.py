"""The eager PyTorch decode step that skips Keras's `Layer.__call__` (layers/eager_decode.py).

It must return exactly what the general `__call__` returns, and be taken only where
`__call__` would add nothing: elsewhere (autograd on, a Keras mask, mixed precision,
inputs to convert, hooks, not built, dropout in an unknown training phase) and on
JAX / TensorFlow every call goes through Keras as before.
"""

import contextlib

import keras
import numpy as np
import pytest
from keras import ops

from keras_mha.layers import GroupedQueryAttention, MultiQueryAttention, eager_decode
from tests.layers.test_reference import random_inputs, randomise

BACKEND = keras.backend.backend()
FEATURES, PREFILL, MAX_LENGTH = 16, 3, 8
# The fast call exists on PyTorch only (elsewhere `skips_keras_call` is always False;
# running decode steps there to show it would cost JAX seconds of op compilations).
TORCH_ONLY = pytest.mark.skipif(BACKEND != "torch", reason="the fast call is PyTorch-only")


def no_grad():
    if BACKEND != "torch":
        return contextlib.nullcontext()
    import torch

    return torch.no_grad()


def built_layer(factory=None, **options):
    layer = (factory or (lambda **kw: GroupedQueryAttention(4, 2, head_dim=4, **kw)))(
        causal=True, **options
    )
    layer(ops.convert_to_tensor(random_inputs(1, 2, FEATURES)))
    randomise(layer)
    return layer


def prefilled(layer, x):
    with no_grad():
        cache = layer.init_cache(batch_size=x.shape[0], max_length=MAX_LENGTH)
        _, cache = layer(x[:, :PREFILL], cache=cache, cache_index=0)
    return cache


class KerasCallCounter:
    """Counts `keras.layers.Layer.__call__` calls on one layer (the general path)."""

    def __init__(self, monkeypatch, layer):
        self.count = 0
        original = keras.layers.Layer.__call__

        def counting(instance, *args, **kwargs):
            if instance is layer:
                self.count += 1
            return original(instance, *args, **kwargs)

        monkeypatch.setattr(keras.layers.Layer, "__call__", counting)


def steps(call, layer, x, cache, **kwargs):
    outputs = []
    with no_grad():
        for position in range(PREFILL, x.shape[1]):
            output, cache = call(
                layer, x[:, position : position + 1], cache=cache, cache_index=position, **kwargs
            )
            outputs.append(ops.convert_to_numpy(output))
    return np.concatenate(outputs, axis=1), [ops.convert_to_numpy(b) for b in cache]


def test_other_backends_keep_keras_call():
    layer = built_layer()
    token = ops.convert_to_tensor(random_inputs(1, 1, FEATURES))
    with no_grad():
        cache = layer.init_cache(batch_size=1, max_length=MAX_LENGTH)
        skips = eager_decode.skips_keras_call(layer, (token,), {"cache": cache, "cache_index": 0})
    assert skips == (BACKEND == "torch")
    assert eager_decode.gates_are_ones(layer) == (BACKEND == "torch")


@TORCH_ONLY
@pytest.mark.parametrize(
    "factory, options, step_kwargs",
    [
        pytest.param(None, {}, {}, id="gqa"),
        pytest.param(
            None,
            {"use_rope": True, "use_qk_norm": True, "sliding_window": 3, "use_bias": False},
            {"use_causal_mask": True, "training": False},
            id="gqa-rope-qknorm-window",
        ),
        pytest.param(
            lambda **kw: MultiQueryAttention(4, head_dim=4, **kw),
            {},
            {},
            id="mqa",
        ),
    ],
)
def test_fast_call_returns_what_keras_call_returns(monkeypatch, factory, options, step_kwargs):
    x = ops.convert_to_tensor(random_inputs(2, 6, FEATURES, seed=3))
    layer = built_layer(factory, **options)
    general_cache, fast_cache = prefilled(layer, x), prefilled(layer, x)

    def general(layer, *args, **kwargs):
        return keras.layers.Layer.__call__(layer, *args, **kwargs)

    expected, expected_cache = steps(general, layer, x, general_cache, **step_kwargs)
    counter = KerasCallCounter(monkeypatch, layer)
    got, got_cache = steps(
        lambda layer, *a, **kw: layer(*a, **kw), layer, x, fast_cache, **step_kwargs
    )
    np.testing.assert_array_equal(got, expected)
    for buffer, expected_buffer in zip(got_cache, expected_cache, strict=True):
        np.testing.assert_array_equal(buffer, expected_buffer)
    assert counter.count == 0  # every step skipped Keras's __call__


@TORCH_ONLY
def test_fast_call_with_an_attention_mask_and_pruned_gates():
    """A padding mask over the whole cache, and gates changed between steps (re-read)."""
    x = ops.convert_to_tensor(random_inputs(1, 6, FEATURES, seed=4))
    keep = ops.convert_to_tensor(np.array([[False, True, True, True, True, True, True, True]]))
    layer = built_layer()
    results = []
    for call in (keras.layers.Layer.__call__, type(layer).__call__):
        layer.head_gates.assign(np.ones(4, "float32"))
        cache = prefilled(layer, x)
        first, cache = steps(call, layer, x[:, :5], cache, attention_mask=keep)
        layer.head_gates.assign(np.array([1.0, 0.0, 1.0, 0.5], "float32"))
        with no_grad():
            second, _ = call(layer, x[:, 5:6], cache=cache, cache_index=5, attention_mask=keep)
        results.append((first, ops.convert_to_numpy(second)))
    (general_first, general_second), (fast_first, fast_second) = results
    np.testing.assert_array_equal(fast_first, general_first)
    np.testing.assert_array_equal(fast_second, general_second)
    # The new gates took effect: the output differs from the same step with gates at 1.
    layer.head_gates.assign(np.ones(4, "float32"))
    cache = prefilled(layer, x)
    _, cache = steps(keras.layers.Layer.__call__, layer, x[:, :5], cache, attention_mask=keep)
    with no_grad():
        ungated, _ = layer(x[:, 5:6], cache=cache, cache_index=5, attention_mask=keep)
    assert not np.allclose(ops.convert_to_numpy(ungated), fast_second)


def test_gates_changed_after_a_forward_call_are_used():
    """The general path skips the product with gates at 1; a later change must count."""
    x = ops.convert_to_tensor(random_inputs(2, 5, FEATURES, seed=5))
    layer = built_layer()
    before = ops.convert_to_numpy(layer(x))
    gates = np.array([1.0, 0.0, 0.0, 1.0], "float32")
    layer.head_gates.assign(gates)
    after = ops.convert_to_numpy(layer(x))
    layer.head_gates.assign(np.ones(4, "float32"))
    np.testing.assert_array_equal(ops.convert_to_numpy(layer(x)), before)
    # Heads 1 and 2 (KV group 0 and 1 each lose one) silenced = their output kernel rows zeroed.
    kernel = ops.convert_to_numpy(layer.output_kernel)
    layer.output_kernel.assign(kernel * gates[:, None, None])
    np.testing.assert_allclose(after, ops.convert_to_numpy(layer(x)), atol=1e-6)
    assert not np.allclose(after, before)


@TORCH_ONLY
def test_fast_call_only_where_keras_call_adds_nothing():
    import torch

    layer = built_layer()
    x = ops.convert_to_tensor(random_inputs(1, 5, FEATURES, seed=6))
    cache = prefilled(layer, x)
    token = x[:, PREFILL : PREFILL + 1]
    kwargs = {"cache": cache, "cache_index": PREFILL}

    def skips(query=token, layer=layer, **extra):
        return eager_decode.skips_keras_call(layer, (query,), {**kwargs, **extra})

    with torch.no_grad():
        assert skips()
        assert skips(cache_index=torch.tensor(PREFILL))
        assert not skips(return_attention_scores=True)  # an argument it does not handle
        assert not skips(cache_index=None)
        assert not skips(query=token.double())  # Keras would convert it
        assert not skips(cache=tuple(b.double() for b in cache))
        assert not skips(attention_mask=torch.ones(1, MAX_LENGTH))  # a float mask
        masked = token.clone()
        keras.src.backend.set_keras_mask(masked, torch.ones(1, 1, dtype=torch.bool))
        assert not skips(query=masked)  # a mask to propagate
        assert not skips(layer=GroupedQueryAttention(4, 2, head_dim=4))  # not built
        mixed = GroupedQueryAttention(4, 2, head_dim=4, causal=True, dtype="mixed_float16")
        mixed(ops.convert_to_tensor(random_inputs(1, 2, FEATURES)))
        assert not skips(query=token.half(), layer=mixed)  # variables autocast in a scope
        with keras.src.backend.AutocastScope("float16"):
            assert not skips()
        dropout = built_layer(dropout=0.5)
        assert not skips(layer=dropout)  # training would come from an enclosing call
        assert skips(layer=dropout, training=False)
        calls = []
        handle = layer.register_forward_hook(lambda *args: calls.append(args))
        try:
            assert not skips()
            layer(token, **kwargs)  # through Keras and torch's Module.__call__: the hook runs
            assert len(calls) == 1
        finally:
            handle.remove()
    assert not skips()  # autograd on


@TORCH_ONLY
def test_fast_call_still_checks_its_arguments():
    import torch

    layer = built_layer()
    x = ops.convert_to_tensor(random_inputs(1, 5, FEATURES, seed=7))
    cache = prefilled(layer, x)
    with torch.no_grad():
        with pytest.raises(ValueError, match="overruns the cache"):
            layer(x[:, :1], cache=cache, cache_index=MAX_LENGTH)
        with pytest.raises(ValueError, match="features"):
            layer(torch.zeros(1, 1, FEATURES + 1), cache=cache, cache_index=PREFILL)
        with pytest.raises(ValueError, match="cache"):
            layer(x[:, :1], cache=(cache.key[:1, :1], cache.value[:1, :1]), cache_index=PREFILL)
