"""`run_layer_test`: the checks every keras-mha layer passes, in one call.

Like Keras's `testing.TestCase.run_layer_test`, for a layer class and its constructor
arguments, on the current backend:

1. config: `from_config(get_config())` keeps the config, and the layer serializes
   under its registered name (`keras_mha>ClassName`) and deserializes to its class;
2. build from shapes: the numbers of trainable and non-trainable weights;
3. eager call on `input_data`: output shapes, the compute dtype, and values when given;
4. symbolic call on `keras.Input`s: the same output shapes, and a functional model
   of the layer returns the eager output;
5. round trip of the built layer: a layer deserialized from it, given its weights,
   returns the same output; with `saved_to`, so does the functional model saved to
   a `.keras` file there and loaded back.

Example:
    >>> layer = run_layer_test(
    ...     GroupedQueryAttention, {"num_heads": 4, "num_key_value_heads": 2},
    ...     input_data=np.ones((2, 5, 8), "float32"), expected_output_shape=(2, 5, 8),
    ...     expected_num_trainable_weights=8, expected_num_non_trainable_weights=1)
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops


def run_layer_test(
    layer_cls,
    init_kwargs,
    input_data,
    *,
    call_kwargs=None,
    expected_output_shape=None,
    expected_output=None,
    expected_num_trainable_weights=None,
    expected_num_non_trainable_weights=None,
    saved_to=None,
    atol=1e-6,
):
    """Run the checks above; return the built layer (its weights as built, seeded or not).

    Args:
        layer_cls: the layer class.
        init_kwargs: its constructor arguments.
        input_data: a NumPy array, or a tuple of them (the call's positional tensors).
        call_kwargs: keyword arguments of every call (`return_attention_scores`, ...).
        expected_output_shape: a shape, or a tuple of shapes when the call returns several.
        expected_output: the expected output values (NumPy), compared to `atol`.
        expected_num_trainable_weights, expected_num_non_trainable_weights: weight counts.
        saved_to: a folder: also save a functional model of the layer there and load it.
    """
    call_kwargs = call_kwargs or {}
    arrays = input_data if isinstance(input_data, tuple) else (input_data,)
    shapes = [tuple(array.shape) for array in arrays]
    _check_config(layer_cls, layer_cls(**init_kwargs))

    layer = layer_cls(**init_kwargs)
    layer.build(*shapes)
    if expected_num_trainable_weights is not None:
        assert len(layer.trainable_weights) == expected_num_trainable_weights
    if expected_num_non_trainable_weights is not None:
        assert len(layer.non_trainable_weights) == expected_num_non_trainable_weights

    tensors = [ops.convert_to_tensor(array) for array in arrays]
    outputs = keras.tree.flatten(layer(*tensors, **call_kwargs))
    assert keras.backend.standardize_dtype(outputs[0].dtype) == layer.compute_dtype
    eager = _numpy(outputs)
    if expected_output_shape is not None:
        assert [output.shape for output in eager] == _shapes(expected_output_shape)
    if expected_output is not None:
        np.testing.assert_allclose(eager[0], expected_output, atol=atol)

    inputs = [keras.Input(shape[1:], batch_size=shape[0]) for shape in shapes]
    symbolic = keras.tree.flatten(layer(*inputs, **call_kwargs))
    assert [tuple(output.shape) for output in symbolic] == [o.shape for o in eager]
    model = keras.Model(inputs, symbolic)
    _assert_close(model(tensors), eager, atol)

    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert restored.built  # from the serialized build config
    restored.set_weights(layer.get_weights())
    _assert_close(restored(*tensors, **call_kwargs), eager, atol)
    if saved_to is not None:
        path = saved_to / f"{layer_cls.__name__}.keras"
        model.save(path)
        _assert_close(keras.models.load_model(path)(tensors), eager, atol)
    return layer


def _check_config(layer_cls, layer):
    config = layer.get_config()
    assert layer_cls.from_config(config).get_config() == config
    serialized = keras.saving.serialize_keras_object(layer)
    assert serialized["registered_name"] == f"keras_mha>{layer_cls.__name__}"
    restored = keras.saving.deserialize_keras_object(serialized)
    assert type(restored) is layer_cls and restored.get_config() == config


def _shapes(expected):
    if expected and isinstance(expected[0], tuple):
        return [tuple(shape) for shape in expected]
    return [tuple(expected)]


def _numpy(outputs):
    return [np.asarray(ops.convert_to_numpy(output)) for output in keras.tree.flatten(outputs)]


def _assert_close(outputs, expected, atol):
    got = _numpy(outputs)
    assert len(got) == len(expected)
    for value, reference in zip(got, expected, strict=True):
        np.testing.assert_allclose(value, reference, atol=atol)
