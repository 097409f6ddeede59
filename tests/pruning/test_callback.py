"""The HeadPruning callback during `fit`: schedule, logs, the JAX train state,
resuming after save/load, heatmaps, removal at the end, and bad input."""

import os

import keras
import numpy as np
import pytest

from keras_mha.layers import GroupedQueryAttention, MultiHeadAttention
from keras_mha.pruning import (
    HeadPruning,
    find_attention_layers,
    get_head_gates,
    set_head_gates,
)
from tests.pruning.test_models import (
    FEATURES,
    SEQUENCE_LENGTH,
    all_variables,
    assert_untouched,
    classification_data,
    compiled,
    functional_model,
)


class RecordOutputs(keras.callbacks.Callback):
    """Model outputs on fixed inputs at the end of every epoch."""

    def __init__(self, x):
        super().__init__()
        self.x = x
        self.outputs = []

    def on_epoch_end(self, epoch, logs=None):
        self.outputs.append(keras.ops.convert_to_numpy(self.model(self.x)))


class RecordQueryKernels(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.kernels = []

    def on_epoch_end(self, epoch, logs=None):
        layers = find_attention_layers(self.model)
        self.kernels.append(
            {p: keras.ops.convert_to_numpy(la.query_kernel).copy() for p, la in layers.items()}
        )


def test_heads_are_gated_at_the_scheduled_epochs_and_logged(tmp_path):
    keras.utils.set_random_seed(10)
    # Learning rate 0: the outputs change only when the callback gates heads.
    model = compiled(functional_model(), optimizer=keras.optimizers.SGD(learning_rate=0.0))
    x, y = classification_data(16)
    record = RecordOutputs(x[:4])
    initial = keras.ops.convert_to_numpy(model(x[:4]))
    pruning = HeadPruning(
        0.5,
        data=(x, y),
        start_epoch=1,
        end_epoch=2,
        heatmap_dir=str(tmp_path),
    )
    history = model.fit(
        x, y, epochs=4, batch_size=8, callbacks=[pruning, record], verbose=2
    ).history
    np.testing.assert_array_equal(record.outputs[0], initial)  # epoch 0: warm-up
    assert np.abs(record.outputs[1] - record.outputs[0]).max() > 1e-4  # step 1
    assert np.abs(record.outputs[2] - record.outputs[1]).max() > 1e-4  # step 2
    np.testing.assert_array_equal(record.outputs[3], record.outputs[2])  # done

    assert history["pruned_heads"] == [0, 2, 4, 4]
    assert len(history["head_gates/mha"]) == 4
    np.testing.assert_array_equal(history["head_gates/mha"][0], np.ones(4))
    assert len(history["head_importance/mha"]) == len(history["head_importance/gqa"]) == 2
    final = get_head_gates(model)
    for path in ("mha", "gqa"):
        np.testing.assert_array_equal(history[f"head_gates/{path}"][-1], final[path])
    assert [step["epoch"] for step in pruning.steps] == [1, 2]
    assert sum(map(len, pruning.pruned_heads.values())) == 4
    # The GQA layer lost whole groups only ("group" policy).
    assert pruning.pruned_heads["gqa"] in ([], [0, 1], [2, 3])

    import matplotlib.image

    names = sorted(os.listdir(tmp_path))
    assert names == ["head_pruning_epoch_001.png", "head_pruning_epoch_002.png"]
    with open(tmp_path / names[0], "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(tmp_path / names[1])
    assert image.ndim == 3 and image.shape[0] > 50 and image.shape[1] > 100


def _train_step_model():
    inputs = keras.Input((SEQUENCE_LENGTH, FEATURES))
    x = MultiHeadAttention(4, name="mha")(inputs)
    outputs = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling1D()(x))
    # Plain SGD: a head with zero gradient keeps its weights exactly.
    return compiled(keras.Model(inputs, outputs), keras.optimizers.SGD(learning_rate=0.5))


def test_gates_set_by_the_callback_reach_the_train_step():
    keras.utils.set_random_seed(11)
    model = _train_step_model()
    x, y = classification_data(16)
    kernels = RecordQueryKernels()
    pruning = HeadPruning(2, data=(x, y), method="magnitude", start_epoch=1)
    model.fit(x, y, epochs=3, batch_size=8, callbacks=[pruning, kernels], verbose=0)
    pruned = pruning.pruned_heads["mha"]
    kept = [h for h in range(4) if h not in pruned]
    assert len(pruned) == 2
    history = [k["mha"] for k in kernels.kernels]
    for head in pruned:  # Frozen from epoch 1 on: the train step saw gate 0.
        np.testing.assert_array_equal(history[2][:, head], history[0][:, head])
    for head in kept:
        assert np.abs(history[2][:, head] - history[0][:, head]).max() > 0


class GateMidEpoch(keras.callbacks.Callback):
    """Gates head 0 after the first batch, through a model reference of its own."""

    def __init__(self, model, use_sync=True):
        super().__init__()
        self.target = model  # Not `self.model`, whose getter syncs the JAX state itself.
        self.use_sync = use_sync
        self.kernel_when_gated = None

    def on_train_batch_end(self, batch, logs=None):
        if batch != 0 or self.kernel_when_gated is not None:
            return
        layer = find_attention_layers(self.target)["mha"]
        if self.use_sync:
            set_head_gates(self.target, {"mha": [0.0, 1.0, 1.0, 1.0]})
            self.kernel_when_gated = keras.ops.convert_to_numpy(layer.query_kernel).copy()
        else:
            layer.head_gates.assign([0.0, 1.0, 1.0, 1.0])
            self.kernel_when_gated = "assigned"


def test_gates_set_mid_epoch_survive_and_reach_the_next_steps():
    keras.utils.set_random_seed(12)
    model = _train_step_model()
    x, y = classification_data(32)
    gate = GateMidEpoch(model)
    model.fit(x, y, epochs=2, batch_size=8, callbacks=[gate], verbose=0)
    np.testing.assert_array_equal(get_head_gates(model)["mha"], [0, 1, 1, 1])
    layer = find_attention_layers(model)["mha"]
    kernel = keras.ops.convert_to_numpy(layer.query_kernel)
    np.testing.assert_array_equal(kernel[:, 0], gate.kernel_when_gated[:, 0])
    assert np.abs(kernel[:, 1] - gate.kernel_when_gated[:, 1]).max() > 0


@pytest.mark.skipif(
    keras.backend.backend() != "jax",
    reason="only Keras's JAX trainer keeps its own copy of the variables during an epoch",
)
def test_without_the_sync_a_mid_epoch_gate_is_lost_on_jax():
    """Why `set_head_gates` syncs: a plain `assign` is overwritten at the epoch's end."""
    keras.utils.set_random_seed(12)
    model = _train_step_model()
    x, y = classification_data(32)
    gate = GateMidEpoch(model, use_sync=False)
    model.fit(x, y, epochs=1, batch_size=8, callbacks=[gate], verbose=0)
    assert gate.kernel_when_gated == "assigned"
    np.testing.assert_array_equal(get_head_gates(model)["mha"], [1, 1, 1, 1])


def test_pruning_resumes_after_save_and_load(tmp_path):
    keras.utils.set_random_seed(13)
    model = compiled(functional_model())
    x, y = classification_data(16)
    # Per layer, half of 4 heads in three steps: MHA 1, 1, 2; GQA (units of a
    # 2-head group) 0, 0, 2. Totals 1, 1, 4 whatever the scores.
    arguments = dict(
        target=0.5, data=(x, y), scope="per_layer", start_epoch=1, end_epoch=3, frequency=1
    )
    with pytest.warns(UserWarning, match="will not reach its target in this fit"):
        first = model.fit(
            x, y, epochs=2, batch_size=8, callbacks=[HeadPruning(**arguments)], verbose=0
        )
    assert first.history["pruned_heads"] == [0, 1]
    gated_before = get_head_gates(model)
    path = os.path.join(tmp_path, "half_way.keras")
    model.save(path)

    restored = keras.models.load_model(path)
    for name, gates in get_head_gates(restored).items():
        np.testing.assert_array_equal(gates, gated_before[name])
    resumed = HeadPruning(**arguments)
    second = restored.fit(
        x, y, epochs=5, initial_epoch=2, batch_size=8, callbacks=[resumed], verbose=0
    )
    assert second.history["pruned_heads"] == [1, 4, 4]
    assert [step["epoch"] for step in resumed.steps] == [2, 3]
    final = get_head_gates(restored)
    for name, gates in gated_before.items():
        assert np.all(final[name][gates == 0] == 0)  # Nothing un-pruned.
    assert sorted(map(len, resumed.pruned_heads.values())) == [2, 2]


def test_query_policy_and_per_layer_scope_during_fit():
    keras.utils.set_random_seed(14)
    inputs = keras.Input((SEQUENCE_LENGTH, FEATURES))
    h = GroupedQueryAttention(8, 2, head_dim=4, name="gqa_a")(inputs)
    h = GroupedQueryAttention(8, 2, head_dim=4, name="gqa_b")(h)
    outputs = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling1D()(h))
    model = compiled(keras.Model(inputs, outputs))
    x, y = classification_data(16)
    pruning = HeadPruning(
        0.5,
        data=(x, y),
        method="ablation",
        scope="per_layer",
        gqa_policy="query",
        start_epoch=0,
        remove_at_end=True,
    )
    model.fit(x, y, epochs=1, batch_size=8, callbacks=[pruning], verbose=0)
    for path in ("gqa_a", "gqa_b"):
        removed = pruning.removed[path]
        assert len(removed) == 4
        assert sorted(h // 4 for h in removed) == [0, 0, 1, 1]  # two per group
        layer = find_attention_layers(model)[path]
        assert (layer.num_heads, layer.num_key_value_heads) == (4, 2)
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)  # Recompiled for the new shapes.


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(method="fisher"), r"`method`='fisher' is not a head-importance method"),
        (dict(gqa_policy="kv"), r"`gqa_policy`='kv' is unknown"),
        (dict(scope="layer"), r"`scope`='layer' is unknown"),
        (dict(target=1.0), r"`target`=1.0 as a fraction must be in \(0, 1\)"),
        (dict(target=0), r"`target`=0 must be a positive number of heads"),
        (dict(data=(np.zeros((0, 6, 16)), np.zeros(0))), r"`data` yields no batches"),
        (dict(data=[]), r"`data` yields no batches"),
        (dict(data=None), r"`data` is None but `method`='taylor'"),
        (dict(start_epoch=-1), r"`start_epoch` must be an integer >= 0; received -1"),
        (dict(start_epoch=3, end_epoch=2), r"`end_epoch`=2 must be >= `start_epoch`=3"),
        (dict(frequency=0), r"`frequency` must be an integer >= 1; received 0"),
        (dict(min_heads_per_layer=0), r"`min_heads_per_layer`=0 must be an integer >= 1"),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, message):
    x, y = classification_data(4)
    arguments = dict(target=0.5, data=(x, y)) | kwargs
    with pytest.raises(ValueError, match=message):
        HeadPruning(**arguments)


@pytest.fixture(scope="module")
def trained():
    keras.utils.set_random_seed(15)
    return compiled(functional_model()), classification_data(8)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(target=4, scope="per_layer"),
            r"`target`=4 with scope='per_layer' asks to remove 4 of the 4 heads of layer 'mha'",
        ),
        (dict(target=8), r"`target`=8 asks to remove 8 of 8 heads.*at most 5 can go"),
        (dict(target=3, scope="per_layer", min_heads_per_layer=2), r"at most 2 can go"),
    ],
)
def test_a_target_that_would_empty_a_layer_stops_fit_before_any_change(trained, kwargs, message):
    model, (x, y) = trained
    before = all_variables(model)
    with pytest.raises(ValueError, match=message):
        model.fit(x, y, epochs=2, callbacks=[HeadPruning(data=(x, y), **kwargs)], verbose=0)
    assert_untouched(model, before)


def test_a_model_without_attention_layers_stops_fit_before_any_change():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)], name="plain")
    model.compile("sgd", "mse")
    x, y = np.ones((4, 4), "float32"), np.ones((4, 2), "float32")
    before = all_variables(model)
    with pytest.raises(ValueError, match=r"`model` \(Sequential 'plain'\) has no keras-mha"):
        model.fit(x, y, epochs=1, callbacks=[HeadPruning(0.5, method="magnitude")], verbose=0)
    assert_untouched(model, before)


def test_unequal_groups_in_existing_gates_stop_fit_before_any_change(trained):
    model, (x, y) = trained
    set_head_gates(model, {"gqa": [0, 1, 1, 1]})
    before = all_variables(model)
    try:
        with pytest.raises(ValueError, match=r"Layer 'gqa' has gated-off heads \[0\]"):
            model.fit(x, y, epochs=2, callbacks=[HeadPruning(0.25, data=(x, y))], verbose=0)
        assert_untouched(model, before)
    finally:
        set_head_gates(model, {"gqa": [1, 1, 1, 1]})
