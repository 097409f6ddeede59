"""Keras's quantization contract on the attention layers (layers/quantization.py).

The reference is Keras's own `keras.layers.GroupQueryAttention` / `MultiHeadAttention`,
whose projections are `EinsumDense` layers that Keras quantizes itself: with the same
float weights, both quantized the same way, the outputs agree to float round-off.
"""

import os
import warnings

import keras
import numpy as np
import pytest
from keras import ops

from keras_mha.errors import PruningError
from keras_mha.layers import GroupedQueryAttention, MultiHeadAttention, copy_weights_from_keras
from keras_mha.layers.quantization import PROJECTIONS

BACKEND = keras.backend.backend()
MODES = ("int8", "int4", "float8")


def _inputs(length=6, features=32):
    return np.random.default_rng(0).normal(size=(2, length, features)).astype("float32")


def _keras_pair(kind):
    """(Keras's built-in layer, ours), both built, with the same float weights."""
    x = _inputs()
    if kind == "gqa":
        reference = keras.layers.GroupQueryAttention(
            head_dim=8, num_query_heads=4, num_key_value_heads=2
        )
        ours = GroupedQueryAttention(4, 2, head_dim=8)
    else:
        reference = keras.layers.MultiHeadAttention(num_heads=4, key_dim=8)
        ours = MultiHeadAttention(4, head_dim=8)
    reference(x, x)
    ours(x)
    copy_weights_from_keras(reference, ours)
    return reference, ours, x


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("kind", ["gqa", "mha"])
def test_quantized_output_equals_keras_quantized_builtin(kind, mode):
    reference, ours, x = _keras_pair(kind)
    float_output = ops.convert_to_numpy(ours(x))
    for dense in ("_query_dense", "_key_dense", "_value_dense", "_output_dense"):
        getattr(reference, dense).quantize(mode)  # what Model.quantize reaches in Keras's layer
    ours.quantize(mode)
    assert ours.quantization_mode == mode
    expected = ops.convert_to_numpy(reference(x, x))
    actual = ops.convert_to_numpy(ours(x))
    np.testing.assert_allclose(actual, expected, atol=2e-5, rtol=1e-5)
    assert np.abs(actual - float_output).max() > 1e-6  # quantization did change something


def _functional_model():
    inputs = keras.Input((6, 32))
    hidden = GroupedQueryAttention(4, 2, head_dim=8, causal=True, use_rope=True, name="gqa")(inputs)
    hidden = MultiHeadAttention(4, head_dim=8, use_qk_norm=True, name="mha")(hidden)
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(hidden))


@pytest.mark.parametrize("mode", MODES)
def test_model_quantize_reaches_our_layers_and_saves(mode, tmp_path):
    model = _functional_model()
    x = _inputs()
    float_output = ops.convert_to_numpy(model(x))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.quantize(mode)
    ours = [str(w.message) for w in caught if "Attention" in str(w.message)]
    assert ours == []  # Keras warns only about layers it could not quantize
    for name in ("gqa", "mha", "head"):
        assert model.get_layer(name).quantization_mode == mode
    gqa = model.get_layer("gqa")
    assert not hasattr(gqa, "query_kernel")  # the float kernel is gone, not kept beside
    quantized = ops.convert_to_numpy(model(x))
    np.testing.assert_allclose(quantized, float_output, atol=0.2)
    path = os.path.join(tmp_path, "quantized.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.get_layer("gqa").quantization_mode == mode
    np.testing.assert_array_equal(ops.convert_to_numpy(loaded(x)), quantized)


def test_quantized_layer_decodes_like_its_full_pass():
    layer = GroupedQueryAttention(4, 2, head_dim=8, causal=True, use_rope=True)
    x = _inputs(length=7)
    layer(x)
    layer.quantize("int8")
    full = ops.convert_to_numpy(layer(x))
    decode = layer.make_decode_function()
    cache = layer.init_cache(2, 8, variables=BACKEND == "tensorflow")
    output, cache = decode(x[:, :4], cache, 0)
    steps = [ops.convert_to_numpy(output)]
    for index in range(4, 7):
        output, cache = decode(x[:, index : index + 1], cache, index)
        steps.append(ops.convert_to_numpy(output))
    # Keras quantizes each call's activations per token: the same tokens, the same values.
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=2e-5)


def test_quantized_layer_refuses_head_surgery_in_one_line():
    layer = GroupedQueryAttention(4, 2, head_dim=8)
    layer.build((None, None, 32))
    layer.quantize("int8")
    for action in (lambda: layer.prune_heads([0, 1]), lambda: layer.convert_kv_heads(1)):
        with pytest.raises(PruningError, match=r"is quantized \(int8\)") as error:
            action()
        assert "\n" not in str(error.value)


def test_a_second_quantize_is_refused():
    layer = GroupedQueryAttention(4, 2, head_dim=8)
    layer.build((None, None, 32))
    layer.quantize("int8")
    with pytest.raises(ValueError, match="already quantized"):
        layer.quantize("int4")


def test_quantize_frees_the_float_kernels():
    # `quantize` runs under `cheap_collections` (Keras's per-variable gc.collect made
    # cheap by gc.freeze); the float kernels must still go, on every backend.
    import weakref

    layer = GroupedQueryAttention(4, 2, head_dim=8)
    layer.build((None, None, 32))
    kernels = [weakref.ref(getattr(layer, f"{name}_kernel")) for name in PROJECTIONS]
    layer.quantize("int8")
    assert [kernel() for kernel in kernels] == [None] * 4
