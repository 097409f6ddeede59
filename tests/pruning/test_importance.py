"""Head importance: Taylor, ablation and magnitude scores, data forms, bad input."""

import keras
import numpy as np
import pytest

from keras_mha.layers import GroupedQueryAttention
from keras_mha.pruning import find_attention_layers, head_importance
from keras_mha.pruning.batches import Batches, resolve_loss
from keras_mha.pruning.gate_gradients import gate_gradients
from keras_mha.pruning.importance import magnitude_scores
from tests.pruning.test_models import (
    all_variables,
    assert_untouched,
    classification_data,
    compiled,
    functional_model,
)


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(1)
    return compiled(functional_model())


@pytest.fixture(scope="module")
def data():
    return classification_data(num_examples=20, seed=5)


def _loss(model, x, y):
    loss_fn = resolve_loss(model, None)
    return float(keras.ops.convert_to_numpy(loss_fn(y, model(x, training=False), None)))


def test_taylor_is_the_size_weighted_mean_of_per_batch_absolute_gradients(model, data):
    x, y = data
    before = all_variables(model)
    scores = head_importance(model, (x, y), method="taylor", batch_size=8)
    assert_untouched(model, before)
    layers = find_attention_layers(model)
    gates = [layer.head_gates for layer in layers.values()]
    loss_fn = resolve_loss(model, None)
    absolute = [np.zeros(layer.num_heads) for layer in layers.values()]
    signed = [np.zeros(layer.num_heads) for layer in layers.values()]
    for start in range(0, 20, 8):  # batches of 8, 8, 4
        batch = slice(start, start + 8)
        _, gradients = gate_gradients(model, gates, x[batch], y[batch], loss_fn=loss_fn)
        size = len(x[batch])
        for total, gradient in zip(absolute, gradients, strict=True):
            total += size * np.abs(gradient)
        for total, gradient in zip(signed, gradients, strict=True):
            total += size * gradient
    for path, total, signed_total in zip(layers, absolute, signed, strict=True):
        expected = total / np.linalg.norm(total)  # The 1/20 cancels in the normalisation.
        np.testing.assert_allclose(scores[path], expected, rtol=1e-5)
        np.testing.assert_allclose(np.linalg.norm(scores[path]), 1.0, rtol=1e-6)
        # Absolute value per batch is not the absolute value of the sum.
        assert not np.allclose(expected, np.abs(signed_total) / np.linalg.norm(signed_total))


def test_ablation_is_the_loss_rise_when_one_head_is_masked(model, data):
    x, y = data
    before = all_variables(model)
    scores = head_importance(model, (x, y), method="ablation", batch_size=32)
    assert_untouched(model, before)
    base = _loss(model, x, y)
    for path, layer in find_attention_layers(model).items():
        expected = []
        for head in range(layer.num_heads):
            gates = np.ones(layer.num_heads, "float32")
            gates[head] = 0.0
            layer.head_gates.assign(gates)
            expected.append(_loss(model, x, y) - base)
            layer.head_gates.assign(np.ones(layer.num_heads, "float32"))
        np.testing.assert_allclose(scores[path], expected, rtol=1e-4, atol=1e-6)


def test_ablation_scores_already_masked_heads_zero(model, data):
    layer = find_attention_layers(model)["mha"]
    layer.head_gates.assign([1.0, 0.0, 1.0, 1.0])
    try:
        scores = head_importance(model, data, method="ablation")
    finally:
        layer.head_gates.assign(np.ones(4, "float32"))
    assert scores["mha"][1] == 0.0
    assert np.all(scores["mha"][[0, 2, 3]] != 0.0)


def test_magnitude_splits_shared_key_value_heads_among_their_query_heads():
    layer = GroupedQueryAttention(6, 2, head_dim=3, bias_initializer="random_normal")
    layer.build((None, None, 5))
    w = {
        name: keras.ops.convert_to_numpy(getattr(layer, name)).astype("float64")
        for name in (
            "query_kernel",
            "key_kernel",
            "value_kernel",
            "output_kernel",
            "query_bias",
            "key_bias",
            "value_bias",
        )
    }
    expected = []
    for head in range(6):
        group = head // 3
        squared = (
            np.sum(w["query_kernel"][:, head] ** 2)
            + np.sum(w["query_bias"][head] ** 2)
            + np.sum(w["output_kernel"][head] ** 2)
            + (
                np.sum(w["key_kernel"][:, group] ** 2)
                + np.sum(w["key_bias"][group] ** 2)
                + np.sum(w["value_kernel"][:, group] ** 2)
                + np.sum(w["value_bias"][group] ** 2)
            )
            / 3
        )
        expected.append(np.sqrt(squared))
    scores = magnitude_scores(layer)
    np.testing.assert_allclose(scores, expected, rtol=1e-12)
    head_indexed = sum(np.sum(value**2) for value in w.values())
    np.testing.assert_allclose(np.sum(scores**2), head_indexed, rtol=1e-12)


def test_magnitude_needs_no_data(model):
    scores = head_importance(model, method="magnitude")
    assert list(scores) == ["mha", "gqa"]
    assert all(value.shape == (4,) and np.all(value > 0) for value in scores.values())


def test_every_data_form_gives_the_same_scores(model, data):
    x, y = data
    batches = [(x[:8], y[:8]), (x[8:16], y[8:16]), (x[16:], y[16:])]

    class Dataset(keras.utils.PyDataset):
        def __len__(self):
            return 3

        def __getitem__(self, index):
            return batches[index]

    reference = head_importance(model, (x, y), batch_size=8)
    forms = {
        "list": batches,
        "generator": (batch for batch in batches),
        "pydataset": Dataset(),
    }
    try:
        import tensorflow as tf

        forms["tf.data"] = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    except ImportError:
        pass
    for name, form in forms.items():
        scores = head_importance(model, form)
        for path in reference:
            np.testing.assert_allclose(scores[path], reference[path], rtol=1e-5, err_msg=name)


def test_max_batches_limits_the_data(model, data):
    x, y = data
    limited = head_importance(model, (x, y), batch_size=8, max_batches=1)
    first = head_importance(model, (x[:8], y[:8]))
    for path in first:
        np.testing.assert_allclose(limited[path], first[path], rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(method="fisher"), r"`method`='fisher' is not a head-importance method"),
        (dict(data=(np.zeros((0, 6, 16), "float32"), np.zeros(0))), r"`data` yields no batches"),
        (dict(data=[]), r"`data` yields no batches"),
        (dict(data=iter([])), r"`data` yields no batches \(an iterator that yielded 0"),
        (dict(data=None), r"`data` is None"),
        (dict(loss={"out": "mse"}), r"per-output losses"),
        (dict(loss="not_a_loss"), r"`loss`='not_a_loss' is not a known Keras loss"),
        (dict(batch_size=0), r"`batch_size` must be a positive integer; received 0"),
    ],
)
def test_bad_input_raises_and_leaves_the_model_untouched(model, data, kwargs, message):
    before = all_variables(model)
    arguments = dict(data=data, method="taylor") | kwargs
    with pytest.raises(ValueError, match=message):
        head_importance(model, **arguments)
    assert_untouched(model, before)


def test_an_uncompiled_model_needs_a_loss(data):
    model = functional_model()
    with pytest.raises(ValueError, match=r"`loss` is None and the model was not compiled"):
        head_importance(model, data)
    scores = head_importance(
        model, data, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    assert set(scores) == {"mha", "gqa"}


def test_a_model_without_attention_layers_is_refused(data):
    model = keras.Sequential([keras.Input((6, 16)), keras.layers.Dense(3)], name="plain")
    model.compile(loss="mse")
    with pytest.raises(ValueError, match=r"`model` \(Sequential 'plain'\) has no keras-mha"):
        head_importance(model, data)


def test_batches_reads_sample_weights_and_dicts():
    x = {"tokens": np.zeros((5, 3)), "extra": np.ones((5, 2))}
    batches = list(Batches((x, np.arange(5), np.ones(5)), batch_size=2))
    assert [len(b[1]) for b in batches] == [2, 2, 1]
    assert batches[2][0]["extra"].shape == (1, 2)
    assert batches[0][2].shape == (2,)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="the jit cache is JAX's")
def test_jax_compiles_the_gate_loss_once_per_model_and_loss(data):
    """Every `head_importance` call (one per `HeadPruning` step) reused to recompile."""
    from keras_mha.backends.jax.gradients import cached_functions

    keras.utils.set_random_seed(2)
    model = compiled(functional_model())
    x, y = data
    first = head_importance(model, (x[:8], y[:8]), method="taylor", batch_size=8)
    second = head_importance(model, (x[:8], y[:8]), method="taylor", batch_size=8)
    for path in first:
        np.testing.assert_array_equal(first[path], second[path])
    gates = [layer.head_gates for layer in find_attention_layers(model).values()]
    loss_of_gates, value_and_grad = cached_functions(model, gates, resolve_loss(model, None))
    assert value_and_grad._cache_size() == 1  # One trace for two calls of one shape.
    head_importance(model, (x[:8], y[:8]), method="ablation", batch_size=8)
    assert loss_of_gates._cache_size() == 1
    # Another loss is another function: nothing stale is reused for it.
    other, _ = cached_functions(model, gates, resolve_loss(model, "mse"))
    assert other is not loss_of_gates
