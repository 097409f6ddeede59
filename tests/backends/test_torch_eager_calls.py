"""The eager PyTorch leaf-layer calls equal the Keras path bit for bit: each layer kind
alone, and a whole model's prefill and decode step on the cache."""

import dataclasses

import keras
import numpy as np
import pytest

from keras_mha.models.blocks import RMSNorm
from keras_mha.models.direct_calls import direct_calls, supports_direct_calls
from keras_mha.models.eager_calls import eager_calls
from keras_mha.models.supported import ACTIVATIONS
from tests.conftest import current_backend

pytestmark = pytest.mark.skipif(current_backend() != "torch", reason="eager PyTorch only")


def _numpy(tensor):
    return np.asarray(keras.ops.convert_to_numpy(tensor))


def _randomised(layer, seed):
    """`layer` with every weight random (zeros and ones hide offsets and biases)."""
    rng = np.random.default_rng(seed)
    for variable in layer.weights:
        variable.assign(rng.standard_normal(variable.shape).astype(variable.dtype))
    return layer


def _eager_calls():
    """The backend's kernels keyed by layer class, as `generate` runs them."""
    from keras_mha.backends.torch import model_calls

    return eager_calls(model_calls.eager_calls())


def _built(layer, shape):
    layer.build(shape)
    return layer


LAYERS = {
    "dense": lambda dtype: keras.layers.Dense(24, use_bias=False, dtype=dtype),
    "dense with bias": lambda dtype: keras.layers.Dense(24, dtype=dtype),
    "rms norm": lambda dtype: RMSNorm(1e-6, dtype=dtype),
    "rms norm (1 + w)": lambda dtype: RMSNorm(1e-6, scale_offset=1.0, dtype=dtype),
    "layer norm": lambda dtype: keras.layers.LayerNormalization(
        epsilon=1e-5, center=False, dtype=dtype
    ),
    "layer norm with bias": lambda dtype: keras.layers.LayerNormalization(
        epsilon=1e-5, dtype=dtype
    ),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_each_layer_call_equals_keras(kind, dtype):
    import torch

    layer = _randomised(_built(LAYERS[kind](dtype), (None, None, 16)), seed=1)
    inputs = keras.ops.convert_to_tensor(
        np.random.default_rng(2).standard_normal((2, 3, 16)).astype("float32"), dtype=dtype
    )
    with torch.no_grad():
        expected = layer(inputs)
        fast = _eager_calls().layers[type(layer)](layer, inputs)
    assert fast.dtype == expected.dtype
    np.testing.assert_array_equal(_numpy(keras.ops.cast(fast, "float32")),
                                  _numpy(keras.ops.cast(expected, "float32")))  # fmt: skip


def test_embedding_and_activations_equal_keras():
    import torch

    calls = _eager_calls()
    table = _randomised(_built(keras.layers.Embedding(50, 8), (None, None)), seed=3)
    ids = keras.ops.convert_to_tensor(np.array([[0, 49, 7]], dtype="int32"))
    x = keras.ops.convert_to_tensor(np.linspace(-6, 6, 97, dtype="float32"))
    with torch.no_grad():
        np.testing.assert_array_equal(
            _numpy(calls.layers[keras.layers.Embedding](table, ids)), _numpy(table(ids))
        )
        activations = calls.activations
        assert sorted(activations) == sorted(ACTIVATIONS)
        for name, (function_name, arguments) in ACTIVATIONS.items():
            expected = getattr(keras.activations, function_name)(x, **arguments)
            # The fast activations may write into their input: give each a copy.
            np.testing.assert_array_equal(_numpy(activations[name](x.clone())), _numpy(expected))


def test_layers_outside_what_the_fast_calls_cover_keep_their_keras_call():
    import torch

    from keras_mha.backends.torch.model_calls import dense

    layer = _randomised(_built(keras.layers.Dense(4, activation="tanh"), (None, 16)), seed=4)
    inputs = keras.ops.ones((2, 16))
    with torch.no_grad():
        np.testing.assert_array_equal(_numpy(dense(layer, inputs)), _numpy(layer(inputs)))


# The block traits the families' data select: RMS norms and a gated MLP (Llama); (1 + w)
# norms, sandwich norms and soft caps (Gemma 2); LayerNorms with biases, a plain MLP with
# biases, learned positions and fused q/k/v (GPT-2); a parallel residual (GPT-NeoX).
TRAITS = {
    "llama": {"Dense", "Embedding", "RMSNorm", "GroupedQueryAttention"},
    "gemma2": {"Dense", "Embedding", "RMSNorm", "GroupedQueryAttention"},
    "gpt2": {"Dense", "Embedding", "LayerNormalization", "MultiHeadAttention"},
    "gpt_neox": {"Dense", "Embedding", "LayerNormalization", "MultiHeadAttention"},
}


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("case", sorted(TRAITS))
def test_a_models_prefill_and_step_equal_the_keras_path(case, padded, tmp_path_factory):
    import torch

    from tests.models_checkpoints import loaded

    _, model = loaded(tmp_path_factory, case)
    used = []
    calls = _eager_calls()
    spied = {kind: _spy(function, kind, used) for kind, function in calls.layers.items()}
    calls = dataclasses.replace(calls, layers=spied)
    assert supports_direct_calls(model)
    rng = np.random.default_rng(5)
    prompt = keras.ops.convert_to_tensor(rng.integers(0, 100, (2, 5)).astype("int32"))
    token = keras.ops.convert_to_tensor(rng.integers(0, 100, (2, 1)).astype("int32"))
    key_mask = np.ones((2, 64), dtype=bool)
    key_mask[0, :2] = False
    # Unpadded, `generate` passes no key mask: plain causal attention.
    key_mask = keras.ops.convert_to_tensor(key_mask) if padded else None
    outputs = {}
    for fast in (False, True):
        caches = model.init_caches(2, 64)
        with torch.no_grad(), direct_calls(True, calls if fast else None):
            prefill, caches = model.call_with_cache(prompt, key_mask, caches, 0)
            step, caches = model.call_with_cache(token, key_mask, caches, 5)
        outputs[fast] = [_numpy(prefill), _numpy(step), *[_numpy(c) for c in _leaves(caches)]]
    for keras_path, fast_path in zip(outputs[False], outputs[True], strict=True):
        np.testing.assert_array_equal(fast_path, keras_path)
    assert {kind.__name__ for kind in used} == TRAITS[case]


def _spy(function, kind, used):
    def call(*args, **kwargs):
        used.append(kind)
        return function(*args, **kwargs)

    return call


def _leaves(caches):
    return [leaf for leaf in keras.tree.flatten(caches) if hasattr(leaf, "shape")]


def test_no_eager_calls_inside_a_keras_scope():
    from keras_mha.backends.torch import model_calls

    assert model_calls.eager_calls() is model_calls.EAGER_KERNELS
    with keras.StatelessScope():
        assert model_calls.eager_calls() is None
