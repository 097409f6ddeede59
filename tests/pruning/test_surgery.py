"""Physical head removal over whole models: same outputs, fewer parameters and FLOPs,
`.keras` round trips, recompilation, one-shot head selection, and refusals that leave
the model untouched."""

import os

import keras
import numpy as np
import pytest

from keras_mha.layers import GroupedQueryAttention
from keras_mha.pruning import (
    find_attention_layers,
    get_head_gates,
    heads_to_prune,
    model_attention_flops,
    prune_heads,
    set_head_gates,
)
from tests.pruning.test_models import (
    FEATURES,
    SEQUENCE_LENGTH,
    all_variables,
    assert_untouched,
    block_model,
    classification_data,
    compiled,
    functional_model,
)

GATES = {
    "block_0/attention": [0, 1, 0, 1],  # MHA: two heads with their KV heads
    "block_1/attention": [0, 0, 1, 1],  # GQA 4/2: the first KV group
    "block_2/attention": [1, 0, 0, 1],  # MQA 4/1: query heads around the one KV head
}


def _head_parameters(layer, query_heads, kv_heads):
    features, head_dim = layer._query_features, layer.head_dim
    per_query = features * head_dim + head_dim + head_dim * features + 1  # q, q bias, o, gate
    per_kv = 2 * (features * head_dim + head_dim)
    return query_heads * per_query + kv_heads * per_kv


@pytest.fixture(scope="module")
def gated():
    keras.utils.set_random_seed(3)
    model = block_model()
    set_head_gates(model, GATES)
    x, _ = classification_data(8, seed=2)
    return model, x


@pytest.mark.slow
def test_pruned_model_equals_the_gated_one_and_is_smaller(gated, tmp_path):
    model, x = gated
    gated_output = keras.ops.convert_to_numpy(model(x))
    params_before = model.count_params()
    flops_before = model_attention_flops(model, SEQUENCE_LENGTH)
    removal = prune_heads(model)
    assert removal == {path: np.flatnonzero(np.array(g) == 0).tolist() for path, g in GATES.items()}
    pruned_output = keras.ops.convert_to_numpy(model(x))
    np.testing.assert_allclose(pruned_output, gated_output, atol=1e-5)

    layers = find_attention_layers(model)
    shapes = {path: (layer.num_heads, layer.num_key_value_heads) for path, layer in layers.items()}
    assert shapes == {
        "block_0/attention": (2, 2),
        "block_1/attention": (2, 1),
        "block_2/attention": (2, 1),
    }
    assert tuple(layers["block_1/attention"].key_kernel.shape) == (FEATURES, 1, 4)
    removed = (
        _head_parameters(layers["block_0/attention"], 2, 2)
        + _head_parameters(layers["block_1/attention"], 2, 1)
        + _head_parameters(layers["block_2/attention"], 2, 0)
    )
    assert model.count_params() == params_before - removed
    assert model_attention_flops(model, SEQUENCE_LENGTH) < flops_before
    assert all((values == 1).all() for values in get_head_gates(model).values())

    path = os.path.join(tmp_path, "pruned.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    loaded_layers = find_attention_layers(loaded)
    assert {p: (la.num_heads, la.num_key_value_heads) for p, la in loaded_layers.items()} == shapes
    assert loaded_layers["block_1/attention"].get_config()["num_heads"] == 2
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x)), pruned_output, atol=1e-6)


def test_query_policy_pattern_keeps_every_kv_head_and_soft_gates_survive():
    keras.utils.set_random_seed(4)
    inputs = keras.Input((SEQUENCE_LENGTH, FEATURES))
    model = keras.Model(inputs, GroupedQueryAttention(8, 2, head_dim=4, name="gqa")(inputs))
    x, _ = classification_data(4)
    # Two query heads off in each group; two kept heads have soft gates.
    set_head_gates(model, {"gqa": [1, 0, 0, 0.5, 0, 1, 0.25, 0]})
    expected = keras.ops.convert_to_numpy(model(x))
    prune_heads(model)
    layer = find_attention_layers(model)["gqa"]
    assert (layer.num_heads, layer.num_key_value_heads) == (4, 2)
    np.testing.assert_array_equal(get_head_gates(model)["gqa"], [1, 0.5, 1, 0.25])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x)), expected, atol=1e-5)


@pytest.mark.slow
def test_a_compiled_model_is_recompiled_and_trains_after_removal():
    keras.utils.set_random_seed(6)
    model = compiled(functional_model(), optimizer=keras.optimizers.Adam(learning_rate=1e-3))
    x, y = classification_data(16)
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)  # Builds the optimizer's slots.
    set_head_gates(model, {"mha": [0, 1, 0, 1], "gqa": [0, 0, 1, 1]})
    expected = model.predict(x, verbose=0)
    prune_heads(model)
    # A stale traced predict function would still hold the old variables.
    np.testing.assert_allclose(model.predict(x, verbose=0), expected, atol=1e-5)
    assert model.optimizer.learning_rate.numpy() == pytest.approx(1e-3)
    history = model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))


def test_explicit_heads_and_unknown_paths():
    keras.utils.set_random_seed(7)
    model = functional_model()
    with pytest.raises(ValueError, match=r"`heads` names \['nope'\]"):
        prune_heads(model, heads={"nope": [0]})
    assert prune_heads(model, heads={"mha": [3]}) == {"mha": [3], "gqa": []}
    assert find_attention_layers(model)["mha"].num_heads == 3


@pytest.mark.parametrize(
    "gates, message",
    [
        (
            {"mha": [0, 1, 1, 1], "gqa": [0, 1, 1, 1]},
            r"Cannot prune layer 'gqa': .* leaves KV groups with different",
        ),
        ({"gqa": [0, 0, 0, 0]}, r"Cannot prune layer 'gqa': .*all 4"),
    ],
)
def test_an_unremovable_pattern_changes_no_layer(gates, message):
    keras.utils.set_random_seed(8)
    model = functional_model()
    set_head_gates(model, gates)
    before = all_variables(model)
    with pytest.raises(ValueError, match=message):
        prune_heads(model)
    assert_untouched(model, before)
    assert find_attention_layers(model)["mha"].num_heads == 4


def test_a_model_without_attention_layers_is_refused():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)], name="plain")
    with pytest.raises(ValueError, match=r"`model` \(Sequential 'plain'\) has no keras-mha"):
        prune_heads(model)


def test_heads_to_prune_picks_the_least_important_and_changes_nothing():
    keras.utils.set_random_seed(9)
    model = block_model()
    scores = {
        "block_0/attention": np.array([0.4, 0.1, 0.9, 0.3]),
        "block_1/attention": np.array([0.2, 0.25, 0.8, 0.7]),
        "block_2/attention": np.array([0.5, 0.6, 0.05, 0.95]),
    }
    before = all_variables(model)
    heads = heads_to_prune(model, scores, target=4, gqa_policy="query")
    assert_untouched(model, before)
    # In score order: MQA head 2 (0.05), MHA heads 1, 3, 0 (0.1, 0.3, 0.4); the GQA unit
    # (one head per group: {0, 3}, mean 0.45) would come next.
    assert heads == {
        "block_0/attention": [0, 1, 3],
        "block_1/attention": [],
        "block_2/attention": [2],
    }
    set_head_gates(model, {"block_0/attention": [1, 0, 1, 1]})
    again = heads_to_prune(model, scores, target=4, gqa_policy="query")
    assert again["block_0/attention"] == [0, 3]  # head 1 is already gated: counted, not repeated
    with pytest.raises(ValueError, match=r"`importance` must map every attention layer to 4"):
        heads_to_prune(model, {"block_0/attention": scores["block_0/attention"]}, target=2)
    with pytest.raises(ValueError, match=r"`target`=11 asks to remove 11 of 12 heads"):
        heads_to_prune(model, scores, target=11)
