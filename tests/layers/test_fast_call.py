"""The eager PyTorch step of `GroupedQueryAttention.make_decode_function`, which skips
Keras's `Layer.__call__` (keras_mha/backends/torch/eager_decode.py), and head gates on the
eager paths.

The direct call must be taken only where `__call__` would add nothing (elsewhere:
autograd on, a Keras mask, mixed precision, inputs to convert, hooks, not built,
dropout) and give the very same numbers. The compiled decode functions of JAX and
TensorFlow are tested in tests/layers/test_cache.py.
"""

import contextlib
import gc
import weakref

import keras
import numpy as np
import pytest
from keras import ops

from keras_mha import backends
from keras_mha.layers import GroupedQueryAttention, MultiQueryAttention
from tests.layers.test_reference import random_inputs, randomise

BACKEND = keras.backend.backend()
FEATURES, PREFILL, MAX_LENGTH = 16, 3, 8
TORCH_ONLY = pytest.mark.skipif(BACKEND != "torch", reason="the direct call is PyTorch-only")


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


def new_cache(layer, batch):
    # TensorFlow serves from a cache of variables (what the decode function is for).
    return layer.init_cache(batch, MAX_LENGTH, variables=BACKEND == "tensorflow")


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


def decode(call, x, cache, **kwargs):
    """Prefill `PREFILL` tokens, then one step per token: outputs and the final cache."""
    outputs = []
    with no_grad():
        output, cache = call(x[:, :PREFILL], cache, 0, **kwargs)
        outputs.append(ops.convert_to_numpy(output))
        for position in range(PREFILL, x.shape[1]):
            output, cache = call(x[:, position : position + 1], cache, position, **kwargs)
            outputs.append(ops.convert_to_numpy(output))
    return np.concatenate(outputs, axis=1), [ops.convert_to_numpy(b) for b in cache]


def layer_call(layer):
    """Keras's own `Layer.__call__` (not the layer's decode shortcut in `__call__`)."""

    def call(query, cache, cache_index, attention_mask=None):
        return keras.layers.Layer.__call__(
            layer, query, cache=cache, cache_index=cache_index, attention_mask=attention_mask
        )

    return call


def plain_call(layer):
    """What a user writes: `layer(query, cache=..., cache_index=...)`."""

    def call(query, cache, cache_index, attention_mask=None):
        return layer(query, cache=cache, cache_index=cache_index, attention_mask=attention_mask)

    return call


@TORCH_ONLY
@pytest.mark.parametrize(
    "factory, options",
    [
        pytest.param(None, {}, id="gqa"),
        pytest.param(None, {"use_rope": True, "use_qk_norm": True, "sliding_window": 3}, id="all"),
        pytest.param(lambda **kw: MultiQueryAttention(4, head_dim=4, **kw), {}, id="mqa"),
    ],
)
def test_direct_call_equals_keras_call_bit_for_bit(monkeypatch, factory, options):
    x = ops.convert_to_tensor(random_inputs(2, 6, FEATURES, seed=3))
    layer = built_layer(factory, **options)
    expected, expected_cache = decode(layer_call(layer), x, new_cache(layer, 2))
    function = layer.make_decode_function()
    counter = KerasCallCounter(monkeypatch, layer)
    got, got_cache = decode(function, x, new_cache(layer, 2))
    np.testing.assert_array_equal(got, expected)
    for buffer, expected_buffer in zip(got_cache, expected_cache, strict=True):
        np.testing.assert_array_equal(buffer, expected_buffer)
    assert counter.count == 0  # every call, prefill included, skipped Keras's __call__


@TORCH_ONLY
def test_the_plain_decode_call_skips_keras_call_only_where_it_adds_nothing(monkeypatch):
    """`layer(x, cache=..., cache_index=...)` under no_grad runs as the decode function does
    (after one direct step, the warm step), bit for bit as Keras's call; with autograd on,
    or an argument Keras acts on, it is Keras's call."""
    x = ops.convert_to_tensor(random_inputs(1, 6, FEATURES, seed=12))
    layer = built_layer(use_rope=True)
    expected, expected_cache = decode(layer_call(layer), x, new_cache(layer, 1))
    counter = KerasCallCounter(monkeypatch, layer)
    got, got_cache = decode(plain_call(layer), x, new_cache(layer, 1))
    np.testing.assert_array_equal(got, expected)
    for buffer, expected_buffer in zip(got_cache, expected_cache, strict=True):
        np.testing.assert_array_equal(buffer, expected_buffer)
    assert counter.count == 0
    assert _eager_decode()._WARM.get(layer) is not None  # the steps ran warm
    cache = new_cache(layer, 1)
    layer(x[:, :PREFILL], cache=cache, cache_index=0)  # autograd on
    assert counter.count == 1
    with no_grad():
        layer(x[:, :PREFILL], cache=cache, cache_index=0, training=False)
        layer(x[:, :PREFILL])  # no cache
    assert counter.count == 3


def _mixed_precision_layer():
    layer = GroupedQueryAttention(4, 2, head_dim=4, causal=True, dtype="mixed_bfloat16")
    layer(ops.convert_to_tensor(random_inputs(1, 2, FEATURES)))
    randomise(layer)
    return layer


def _quantized_layer():
    layer = built_layer()
    layer.quantize("int8")
    return layer


def _with_keras_mask(query):
    import torch

    masked = query.clone()
    keras.src.backend.set_keras_mask(masked, torch.ones(query.shape[:2], dtype=torch.bool))
    return masked


# Plain decode calls that Keras's `__call__` acts on (or that the direct step does not
# serve): `(layer factory, query transform, extra call arguments, autograd on)`.
_FALLBACKS = {
    "training": (built_layer, None, {"training": True}, False),
    "mixed precision": (_mixed_precision_layer, None, {}, False),
    "quantized": (_quantized_layer, None, {}, False),
    "Keras mask": (built_layer, _with_keras_mask, {}, False),
    "autograd on": (built_layer, None, {}, True),
}


@TORCH_ONLY
@pytest.mark.parametrize("case", list(_FALLBACKS))
def test_the_plain_decode_call_falls_back_to_keras_call(monkeypatch, case):
    """Where Keras's `__call__` would act (a training flag, a dtype policy that autocasts,
    a quantized layer, a propagated mask, autograd), the plain call is Keras's call:
    counted by the counter, with Keras's numbers and cache."""
    import torch

    factory, transform, extra, grad = _FALLBACKS[case]
    layer = factory()
    x = ops.convert_to_tensor(random_inputs(1, 5, FEATURES, seed=13))
    transform = transform or (lambda query: query)

    def run(call):
        cache = new_cache(layer, 1)
        outputs = []
        with torch.set_grad_enabled(grad):
            for start, stop in ((0, PREFILL), (PREFILL, PREFILL + 1), (PREFILL + 1, 5)):
                query = transform(x[:, start:stop])
                output, cache = call(query, cache=cache, cache_index=start, **extra)
                outputs.append(ops.convert_to_numpy(ops.cast(output, "float32")))
        return outputs, [ops.convert_to_numpy(ops.cast(b, "float32")) for b in cache]

    expected, expected_cache = run(lambda *a, **kw: keras.layers.Layer.__call__(layer, *a, **kw))
    counter = KerasCallCounter(monkeypatch, layer)
    got, got_cache = run(layer)
    assert counter.count == 3  # every call, the steps included, went through Keras
    for output, expected_output in zip(got, expected, strict=True):
        np.testing.assert_array_equal(output, expected_output)
    for buffer, expected_buffer in zip(got_cache, expected_cache, strict=True):
        np.testing.assert_array_equal(buffer, expected_buffer)


@TORCH_ONLY
def test_the_plain_decode_call_with_an_attention_mask_skips_keras_call(monkeypatch):
    """A boolean mask over the cache is handed on as Keras would hand it on: direct."""
    import torch

    layer = built_layer()
    x = ops.convert_to_tensor(random_inputs(1, 6, FEATURES, seed=14))
    keep = torch.tensor([[False, True, True, True, True, True, True, True]])
    expected, expected_cache = decode(
        layer_call(layer), x, new_cache(layer, 1), attention_mask=keep
    )
    counter = KerasCallCounter(monkeypatch, layer)
    got, got_cache = decode(plain_call(layer), x, new_cache(layer, 1), attention_mask=keep)
    assert counter.count == 0
    np.testing.assert_array_equal(got, expected)
    for buffer, expected_buffer in zip(got_cache, expected_cache, strict=True):
        np.testing.assert_array_equal(buffer, expected_buffer)


@pytest.mark.slow
@TORCH_ONLY
def test_the_plain_decode_call_under_torch_compile_traces_the_step(monkeypatch):
    """Inside the user's `torch.compile` step, a one-token plain call at an int position
    traces `eager_decode.step` (plain torch calls, few guards): no graph break, Keras's
    numbers and cache, pruned gates applied."""
    import logging

    import torch

    # Formatting torch's structured trace log for pytest's capture costs minutes.
    monkeypatch.setattr(logging.getLogger("torch.__trace"), "disabled", True)
    layer = built_layer(use_rope=True, use_qk_norm=True)
    layer.head_gates.assign(np.array([1.0, 0.5, 0.0, 1.0], "float32"))
    x = ops.convert_to_tensor(random_inputs(2, PREFILL + 1, FEATURES, seed=16))
    traced = []
    step = _eager_decode().step
    monkeypatch.setattr(_eager_decode(), "step", lambda *a: traced.append(1) or step(*a))

    def decode_step(query, cache, index):
        return layer(query, cache=cache, cache_index=index)

    def counting_backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    expected, expected_cache = decode(layer_call(layer), x, new_cache(layer, 2))
    torch._dynamo.reset()
    graphs = []
    with torch.no_grad():
        cache = new_cache(layer, 2)
        _, cache = layer(x[:, :PREFILL], cache=cache, cache_index=0)
        compiled = torch.compile(decode_step, backend=counting_backend, dynamic=False)
        output, cache = compiled(x[:, PREFILL:], cache, PREFILL)
    assert len(graphs) == 1 and traced  # one graph (no break), traced through `step`
    np.testing.assert_allclose(ops.convert_to_numpy(output), expected[:, PREFILL:], atol=1e-6)
    for buffer, expected_buffer in zip(cache, expected_cache, strict=True):
        np.testing.assert_allclose(ops.convert_to_numpy(buffer), expected_buffer, atol=1e-6)


@TORCH_ONLY
def test_direct_call_with_an_attention_mask_and_pruned_gates():
    """A padding mask over the whole cache, and gates changed between steps (re-read)."""
    import torch

    x = ops.convert_to_tensor(random_inputs(1, 6, FEATURES, seed=4))
    keep = torch.tensor([[False, True, True, True, True, True, True, True]])
    layer = built_layer()
    function = layer.make_decode_function()
    results = []
    for call in (layer_call(layer), function):
        layer.head_gates.assign(np.ones(4, "float32"))
        cache = new_cache(layer, 1)  # written in place by `decode`
        first, _ = decode(call, x[:, :5], cache, attention_mask=keep)
        layer.head_gates.assign(np.array([1.0, 0.0, 1.0, 0.5], "float32"))
        with no_grad():
            second, _ = call(x[:, 5:6], cache, 5, attention_mask=keep)
        results.append((first, ops.convert_to_numpy(second)))
    (general_first, general_second), (direct_first, direct_second) = results
    np.testing.assert_array_equal(direct_first, general_first)
    np.testing.assert_array_equal(direct_second, general_second)
    # The new gates took effect: the output differs from the same step with gates at 1.
    layer.head_gates.assign(np.ones(4, "float32"))
    cache = new_cache(layer, 1)
    decode(function, x[:, :5], cache, attention_mask=keep)
    with no_grad():
        ungated, _ = function(x[:, 5:6], cache, 5, attention_mask=keep)
    assert not np.allclose(ops.convert_to_numpy(ungated), direct_second)


def test_gates_changed_after_a_forward_call_are_used():
    """The general path skips the product with gates at 1; a later change must count."""
    x = random_inputs(2, 5, FEATURES, seed=5)
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
    assert backends.current().gates_are_ones(layer) == (BACKEND == "torch")


@TORCH_ONLY
def test_direct_call_only_where_keras_call_adds_nothing():
    import torch

    layer = built_layer()
    token = ops.convert_to_tensor(random_inputs(1, 1, FEATURES, seed=6))
    cache = new_cache(layer, 1)

    def skips(query=token, layer=layer, cache=cache, cache_index=PREFILL, mask=None):
        return _eager_decode().can_skip_keras_call(layer, query, cache, cache_index, mask)

    with torch.no_grad():
        assert skips()
        assert skips(cache_index=torch.tensor(PREFILL))
        assert skips(mask=torch.ones(1, MAX_LENGTH, dtype=torch.bool))
        assert not skips(cache_index=None)
        assert not skips(cache_index=2.0)  # the general path refuses it
        assert not skips(query=token.double())  # Keras would convert it
        assert not skips(cache=tuple(b.double() for b in cache))
        assert not skips(mask=torch.ones(1, MAX_LENGTH))  # a float mask
        masked = token.clone()
        keras.src.backend.set_keras_mask(masked, torch.ones(1, 1, dtype=torch.bool))
        assert not skips(query=masked)  # a mask to propagate
        assert not skips(layer=GroupedQueryAttention(4, 2, head_dim=4))  # not built
        mixed = GroupedQueryAttention(4, 2, head_dim=4, causal=True, dtype="mixed_float16")
        mixed(ops.convert_to_tensor(random_inputs(1, 2, FEATURES)))
        assert not skips(query=token.half(), layer=mixed)  # variables autocast in a scope
        with keras.src.backend.AutocastScope("float16"):
            assert not skips()
        assert not skips(layer=built_layer(dropout=0.5))  # training from an enclosing call
        calls = []
        handle = layer.register_forward_hook(lambda *args: calls.append(args))
        try:
            assert not skips()
            layer.make_decode_function()(token, cache, PREFILL)  # through Module.__call__
            assert len(calls) == 1
        finally:
            handle.remove()
    assert not skips()  # autograd on


@TORCH_ONLY
def test_warm_step_only_while_nothing_changed():
    """After one direct step, `warm_step` serves the next ones; anything that can change
    between steps sends the call back through the full checks."""
    import torch

    from keras_mha.backends.common import attention_probe

    layer = built_layer()
    x = ops.convert_to_tensor(random_inputs(1, 6, FEATURES, seed=8))
    token = x[:, PREFILL : PREFILL + 1]
    cache = new_cache(layer, 1)
    function = layer.make_decode_function()
    function(x[:, :PREFILL], cache, 0)  # the layer checks the cache
    assert _eager_decode().warm_step(layer, token, cache, PREFILL) is None  # no direct step yet
    expected, _ = function(token, cache, PREFILL)  # a direct step: the layer is warm now

    def warm(query=token, cache=cache, index=PREFILL):
        with torch.no_grad():
            return _eager_decode().warm_step(layer, query, cache, index)

    output, returned = warm()
    np.testing.assert_array_equal(ops.convert_to_numpy(output), ops.convert_to_numpy(expected))
    assert returned is cache
    masked = token.clone()
    keras.src.backend.set_keras_mask(masked, torch.ones(1, 1, dtype=torch.bool))
    other_cache = new_cache(layer, 1)
    refused = {
        "another cache": lambda: warm(cache=other_cache),
        "a tuple cache": lambda: warm(cache=tuple(cache)),
        "a tensor index": lambda: warm(index=torch.tensor(PREFILL)),
        "an overrun": lambda: warm(index=MAX_LENGTH),
        "a negative index": lambda: warm(index=-1),
        "another query length": lambda: warm(query=x[:, :2]),
        "another dtype": lambda: warm(query=token.double()),
        "a Keras mask": lambda: warm(query=masked),
        "autograd on": lambda: _eager_decode().warm_step(layer, token, cache, PREFILL),
    }
    scopes = {
        "a stateless scope": keras.StatelessScope,
        "an autocast scope": lambda: keras.src.backend.AutocastScope("float16"),
        "a symbolic scope": keras.src.backend.common.symbolic_scope.SymbolicScope,
        "a meta device": lambda: keras.device("meta"),
        "attention recording": lambda: attention_probe.recording({"a": layer}, print),
    }
    for name, scope in scopes.items():
        refused[name] = lambda scope=scope: _inside(scope(), warm)
    hook = layer.register_forward_hook(lambda *args: None)
    try:
        assert warm() is None, "a forward hook"
    finally:
        hook.remove()
    for name, call in refused.items():
        assert call() is None, name
    assert warm() is not None  # all of it undone: warm again


@TORCH_ONLY
def test_warm_step_keeps_no_dropped_cache_alive():
    import torch

    layer = built_layer()
    x = ops.convert_to_tensor(random_inputs(1, 6, FEATURES, seed=9))
    function = layer.make_decode_function()
    cache = new_cache(layer, 1)
    function(x[:, :PREFILL], cache, 0)
    function(x[:, PREFILL : PREFILL + 1], cache, PREFILL)  # a direct step: warm
    with torch.no_grad():
        assert _eager_decode().warm_step(layer, x[:, 4:5], cache, 4) is not None
    freed = weakref.ref(cache.key)
    del cache
    gc.collect()
    assert freed() is None


def _inside(context, function):
    with context:
        return function()


@TORCH_ONLY
def test_direct_call_still_checks_its_arguments():
    import torch

    layer = built_layer()
    function = layer.make_decode_function()
    x = ops.convert_to_tensor(random_inputs(1, 5, FEATURES, seed=7))
    cache = new_cache(layer, 1)
    for warm in (False, True):  # warm: the layer checked this cache at an earlier step
        if warm:
            with torch.no_grad():
                function(x[:, :PREFILL], cache, 0)
        with pytest.raises(ValueError, match="overruns the cache"):
            function(x[:, :1], cache, MAX_LENGTH)
        with pytest.raises(ValueError, match="overruns the cache"):
            function(x[:, :1], cache, torch.tensor(MAX_LENGTH))
        with pytest.raises(ValueError, match="features"):
            function(torch.zeros(1, 1, FEATURES + 1), cache, PREFILL)
        with pytest.raises(ValueError, match="cache"):
            function(torch.zeros(2, 1, FEATURES), cache, PREFILL)  # another batch
        with pytest.raises(ValueError, match="cache"):
            function(x[:, :1], (cache.key[:1, :1], cache.value[:1, :1]), PREFILL)
        with pytest.raises(ValueError, match="cache_index"):
            function(x[:, :1], cache, True)
    # The layer changed under the cache it checked: fewer KV heads than the cache holds.
    layer.convert_kv_heads(1)
    with pytest.raises(ValueError, match="cache"):
        function(x[:, :1], cache, PREFILL)


@TORCH_ONLY
def test_a_checked_cache_with_autograd_on_takes_the_general_path():
    """The checked-cache shortcut still asks `applies`: with autograd on and weights that
    need a gradient the step is not written in place (the general path copies)."""
    import torch

    layer = built_layer()
    function = layer.make_decode_function()
    x = ops.convert_to_tensor(random_inputs(1, PREFILL + 1, FEATURES, seed=8))
    cache = new_cache(layer, 1)
    with torch.no_grad():
        _, cache = function(x[:, :PREFILL], cache, 0)  # the layer checked this cache
    output, written = _eager_decode().call_directly(layer, x[:, PREFILL:], cache, PREFILL, None)
    assert output.requires_grad
    assert written.key is not cache.key and not cache.key.requires_grad


def _eager_decode():
    """PyTorch's eager decode module (imported by the tests that run on PyTorch only)."""
    from keras_mha.backends.torch import eager_decode

    return eager_decode
