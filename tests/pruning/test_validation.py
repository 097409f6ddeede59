"""Pruning that reaches its target or says why not, and refuses what it cannot use:
NaN / infinite scores, labels outside the model's classes, head indices that are
not integers in range, negative or NaN arguments. Every refusal leaves the
model untouched."""

import importlib.util
import math
import warnings

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_mha.errors import PruningError
from keras_mha.layers import GroupedQueryAttention, MultiHeadAttention
from keras_mha.layers.head_surgery import plan_head_removal
from keras_mha.pruning import (
    HeadPruning,
    find_attention_layers,
    get_head_gates,
    head_importance,
    heads_to_prune,
    model_attention_flops,
    prune_heads,
    save_head_heatmap,
    set_head_gates,
)
from keras_mha.pruning.policy import (
    LayerState,
    reachable_heads,
    select_heads,
    select_step_heads,
    shortfall,
)
from tests.pruning.test_models import (
    FEATURES,
    NUM_CLASSES,
    SEQUENCE_LENGTH,
    all_variables,
    assert_untouched,
    classification_data,
    compiled,
    functional_model,
    subclassed_model,
)


def mixed_model():
    """The issue's case: MHA (4 heads) then GQA (8 query heads, 2 KV heads)."""
    inputs = keras.Input((SEQUENCE_LENGTH, FEATURES))
    x = MultiHeadAttention(4, name="mha")(inputs)
    x = GroupedQueryAttention(8, 2, head_dim=4, name="gqa")(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, keras.layers.Dense(NUM_CLASSES)(x), name="mixed")


def _drive(model, callback, epochs):
    """Call the callback's hooks as `fit` does, without training steps: the schedule is
    what is tested, and compiling a train step costs seconds per backend (the callback
    inside a real `fit` is tested in test_pruning_callback.py)."""
    callback.set_model(model)
    callback.set_params({"epochs": epochs, "steps": 1, "verbose": 0})
    history = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        callback.on_train_begin()
        for epoch in range(epochs):
            callback.on_epoch_begin(epoch)
            logs = {"loss": 0.0}
            callback.on_epoch_end(epoch, logs)
            for key, value in logs.items():
                history.setdefault(key, []).append(value)
        callback.on_train_end()
    return history, [str(w.message) for w in caught if "HeadPruning" in str(w.message)]


# ------------------------------------------------------------- reaching the target
def test_global_target_of_6_on_mha4_plus_gqa8x2_is_reached_like_heads_to_prune():
    """Before: 3 cheap MHA heads at the first step left 3 to go, which only a 4-head GQA
    group could bring; the schedule stopped at 3 without a word."""
    keras.utils.set_random_seed(4)
    model = mixed_model()
    scores = head_importance(model, method="magnitude")
    assert sum(map(len, heads_to_prune(model, scores, 6).values())) == 6
    pruning = HeadPruning(6, method="magnitude", start_epoch=0, end_epoch=1)
    history, messages = _drive(model, pruning, 2)
    # Step 1 wants 3, but within a plan for 6 (2 MHA heads + a 4-head group) 2 is closest.
    assert history["pruned_heads"] == [2, 6]
    assert history["pruning_target_heads"] == history["pruning_reachable_heads"] == [6, 6]
    assert messages == [] and pruning.shortfall_reason is None
    pruned = pruning.pruned_heads
    assert len(pruned["mha"]) == 2 and pruned["gqa"] in ([0, 1, 2, 3], [4, 5, 6, 7])
    for path, layer in find_attention_layers(model).items():  # A regular model's gates.
        plan_head_removal(layer.num_heads, layer.num_key_value_heads, pruned[path])


def test_a_target_units_cannot_make_up_is_reported_in_logs_and_a_warning():
    keras.utils.set_random_seed(5)
    model = mixed_model()
    # Two heads per layer; the GQA layer can only lose whole groups of 4.
    pruning = HeadPruning(2, method="magnitude", scope="per_layer", start_epoch=0)
    history, messages = _drive(model, pruning, 1)
    assert history["pruned_heads"] == [2]
    assert history["pruning_target_heads"] == [4] and history["pruning_reachable_heads"] == [2]
    assert len(messages) == 1
    assert "'gqa' 0 of 2" in messages[0] and "'gqa': 4" in messages[0]
    assert pruning.shortfall_reason in messages[0]


def test_a_fit_that_ends_before_the_last_step_says_how_far_it_got():
    keras.utils.set_random_seed(6)
    model = mixed_model()
    pruning = HeadPruning(2, method="magnitude", start_epoch=0, end_epoch=3)
    history, messages = _drive(model, pruning, 2)
    assert history["pruned_heads"] == [1, 1]
    assert "`end_epoch`=3 is not before `epochs`=2" in messages[0]
    assert (
        "ended after epoch 1, before the last pruning step at epoch 3: 1 of the 2" in (messages[-1])
    )


@pytest.mark.backend_independent
def test_every_schedule_reaches_what_one_shot_selection_reaches():
    """Random mixes of unit sizes, random scores at every step: the last step always
    lands on the most heads reachable without exceeding the target."""
    rng = np.random.default_rng(0)
    for trial in range(150):
        states = []
        for index in range(int(rng.integers(1, 4))):
            kv_heads = int(rng.choice([1, 2, 4]))
            states.append(LayerState(f"l{index}", kv_heads * int(rng.choice([1, 2, 4])), kv_heads))
        policy, minimum = ["group", "query"][trial % 2], int(rng.integers(1, 3))
        total = sum(state.num_heads for state in states)
        final = int(rng.integers(1, total + 1))
        expected = reachable_heads(states, final, "global", policy, minimum)
        steps = int(rng.integers(1, 5))
        for step in range(1, steps + 1):
            now = math.floor(step / steps * final + 0.5)
            scores = {state.path: rng.random(state.num_heads) for state in states}
            chosen = select_step_heads(states, scores, now, final, policy, minimum)
            states = [
                LayerState(
                    s.path, s.num_heads, s.num_key_value_heads, s.pruned | set(chosen[s.path])
                )
                for s in states
            ]
            assert sum(len(s.pruned) for s in states) <= max(now, expected)
        assert sum(len(s.pruned) for s in states) == expected


@pytest.mark.backend_independent
def test_shortfall_explains_units_and_minimum():
    states = [LayerState("mha", 4, 4), LayerState("gqa", 8, 2)]
    assert shortfall(6, states, "global", "group", 1) == (6, 6, None)
    asked, reachable, reason = shortfall(3, states, "global", "group", 4)
    assert (asked, reachable) == (3, 0)
    assert "`target`=3 asks for 3 heads" in reason and "'gqa': 4" in reason
    assert "`min_heads_per_layer`=4" in reason and "is 0" in reason


# ------------------------------------------------------------- non-finite scores
@pytest.mark.backend_independent
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_scores_are_refused_by_the_selection(bad):
    states = [LayerState("a", 4, 4)]
    with pytest.raises(PruningError, match=r"`importance\['a'\]` has non-finite .* heads \[2\]"):
        select_heads(states, {"a": np.array([0.1, 0.2, bad, 0.3])}, 1, "global", "group", 1)
    with pytest.raises(PruningError, match=r"4 real scores for layer 'a'; received shape \(4,\)"):
        select_heads(states, {"a": np.array(["1", "2", "3", "4"])}, 1, "global", "group", 1)


def test_heads_to_prune_refuses_nan_scores_and_nothing_changes():
    model = functional_model()
    before = all_variables(model)
    scores = {"mha": np.array([0.1, np.nan, 0.3, 0.4]), "gqa": np.ones(4)}
    with pytest.raises(PruningError, match=r"`importance\['mha'\]` has non-finite scores \[nan\]"):
        heads_to_prune(model, scores, 2)
    assert_untouched(model, before)


def _nan_loss(y_true, y_pred):
    return keras.ops.mean(y_pred) * float("nan")


def test_nan_importance_raises_in_head_importance_and_in_the_callback():
    keras.utils.set_random_seed(7)
    model = compiled(functional_model())
    x, y = classification_data(8)
    with pytest.raises(PruningError, match=r"taylor importance of layer 'mha' is not finite"):
        head_importance(model, (x, y), loss=_nan_loss)
    before = all_variables(model)
    pruning = HeadPruning(2, data=(x, y), method="ablation", loss=_nan_loss, start_epoch=0)
    with pytest.raises(PruningError, match=r"is not finite for heads \[0, 1, 2, 3\]"):
        model.fit(x, y, epochs=1, callbacks=[pruning], verbose=0)
    assert_untouched(model, before)  # Refused before any gate or weight changed.


# ------------------------------------------------------------- labels
@pytest.mark.parametrize(
    "labels, message",
    [
        ([0, 1, 2, 3], r"the label 3, outside the model's 3 classes"),
        ([0, -1, 2, 1], r"the label -1, outside"),
        ([0.0, 1.5, 2.0, 1.0], r"the label 1.5, outside"),
        ([0.0, np.nan, 2.0, 1.0], r"the label nan, outside"),
    ],
)
def test_sparse_labels_outside_the_classes_are_refused_on_every_backend(labels, message):
    """JAX used to score these silently (an out-of-range gather), TF and torch crashed."""
    keras.utils.set_random_seed(8)
    model = compiled(functional_model())
    x, _ = classification_data(4)
    with pytest.raises(PruningError, match=message + r".*integer class indices in \[0, 3\)"):
        head_importance(model, (x, np.array(labels)), method="ablation")


def test_label_checks_cover_datasets_subclassed_models_and_ignore_class():
    keras.utils.set_random_seed(9)
    x, _ = classification_data(4)
    batches = [(x[:2], np.array([0, 1])), (x[2:], np.array([2, 5]))]  # Checked batch by batch.
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with pytest.raises(PruningError, match="the label 5, outside the model's 3 classes"):
        # No symbolic outputs: a forward pass of the first batch gives the classes.
        head_importance(subclassed_model(), batches[::-1], method="ablation", loss=loss)
    model = functional_model()
    with pytest.raises(PruningError, match="the label 5, outside the model's 3 classes"):
        head_importance(model, batches, method="ablation", loss=loss)
    ignoring = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-1)
    scores = head_importance(model, (x, np.array([0, -1, 2, 1])), method="ablation", loss=ignoring)
    assert all(np.isfinite(values).all() for values in scores.values())
    with pytest.raises(PruningError, match=r"or the ignored class -1"):
        head_importance(model, (x, np.array([0, -2, 2, 1])), loss=ignoring)
    with pytest.raises(PruningError, match=r"labels of shape \(4, 4\).*one-hot labels with 3"):
        head_importance(model, (x, np.eye(4)), loss="categorical_crossentropy")


def test_the_callback_refuses_bad_array_labels_before_the_first_epoch():
    keras.utils.set_random_seed(10)
    model = compiled(functional_model())
    x, y = classification_data(8)
    before = all_variables(model)
    pruning = HeadPruning(2, data=(x, np.full(8, 7)), start_epoch=1)
    with pytest.raises(PruningError, match="the label 7, outside the model's 3 classes"):
        model.fit(x, y, epochs=2, callbacks=[pruning], verbose=0)
    assert_untouched(model, before)


# ------------------------------------------------------------- head indices
@pytest.mark.parametrize(
    "heads, message",
    [
        ([1.9], r"has 1.9, which is not a query-head index"),
        ("03", r"must be a list of query-head indices; received '03'"),
        (["0", "3"], r"has '0', which is not a query-head index"),
        ([True], r"has True, which is not a query-head index"),
        ([1, 1], r"has the index 1 more than once"),
        ([-1], r"has the index -1 outside \[0, num_heads=4\)"),
        ([4], r"has the index 4 outside \[0, num_heads=4\)"),
        (3, r"must be a list of query-head indices; received 3"),
    ],
)
def test_prune_heads_refuses_indices_that_are_not_integers_in_range(heads, message):
    keras.utils.set_random_seed(11)
    model = functional_model()
    before = all_variables(model)
    with pytest.raises(PruningError, match=r"Cannot prune layer 'mha': .*" + message):
        prune_heads(model, heads={"mha": heads})
    with pytest.raises(PruningError, match=message):
        find_mha(model).prune_heads(heads)
    assert_untouched(model, before)


def find_mha(model):
    return model.get_layer("mha")


def test_numpy_integer_indices_are_fine_and_heads_must_be_a_dict():
    keras.utils.set_random_seed(12)
    model = functional_model()
    with pytest.raises(PruningError, match=r"`heads` must be None or a dict"):
        prune_heads(model, heads=[("mha", [0])])
    assert prune_heads(model, heads={"mha": np.array([2, 0]), "gqa": [np.int32(1), np.int64(3)]})
    assert (find_mha(model).num_heads, model.get_layer("gqa").num_heads) == (2, 2)


def test_gates_recompile_and_heatmap_refuse_nan_negative_or_non_bool_values(tmp_path):
    model = functional_model()
    with pytest.raises(PruningError, match=r"`gates\['gqa'\]`=\[1.0, nan, 1.0, 1.0\] has non"):
        set_head_gates(model, {"mha": [0, 1, 1, 1], "gqa": [1, np.nan, 1, 1]})
    with pytest.raises(PruningError, match=r"=\[1, -1, 1, 1\] has non-finite or negative"):
        set_head_gates(model, {"mha": [1, -1, 1, 1]})
    with pytest.raises(PruningError, match=r"`recompile` must be True or False; received nan"):
        prune_heads(model, heads={"mha": [0]}, recompile=NAN)
    if importlib.util.find_spec("matplotlib"):
        with pytest.raises(PruningError, match=r"`importance\['mha'\]` has non-finite scores"):
            save_head_heatmap(
                tmp_path / "heads.png",
                {"mha": [1.0, NAN, 1.0, 1.0], "gqa": [1.0] * 4},
                get_head_gates(model),
            )
        assert list(tmp_path.iterdir()) == []
    assert all((values == 1).all() for values in get_head_gates(model).values())


# ------------------------------------------------------------- arguments
NAN = float("nan")


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(target=NAN), r"`target`=nan must be a finite fraction"),
        (dict(target=float("inf")), r"`target`=inf must be a finite fraction"),
        (dict(target=-3), r"`target`=-3 must be a positive number of heads"),
        (dict(target="6"), r"`target`='6' must be a fraction"),
        (dict(min_heads_per_layer=-1), r"`min_heads_per_layer`=-1 must be an integer >= 1"),
        (dict(min_heads_per_layer=NAN), r"`min_heads_per_layer`=nan must be an integer >= 1"),
        (dict(frequency=-2), r"`frequency` must be an integer >= 1; received -2"),
        (dict(start_epoch=NAN), r"`start_epoch` must be an integer >= 0; received nan"),
        (dict(end_epoch=-1), r"`end_epoch` must be an integer >= 0; received -1"),
        (dict(end_epoch=True), r"`end_epoch` must be an integer >= 0; received True"),
        (dict(batch_size=-8), r"`batch_size` must be a positive integer; received -8"),
        (dict(batch_size=NAN), r"`batch_size` must be a positive integer; received nan"),
        (dict(max_batches=0), r"`max_batches` must be a positive integer or None; received 0"),
        (dict(max_batches=2.5), r"`max_batches` must be .*; received 2.5"),
        (dict(verbose=-1), r"`verbose` must be an integer >= 0; received -1"),
        (dict(verbose=NAN), r"`verbose` must be an integer >= 0; received nan"),
        (dict(remove_at_end=NAN), r"`remove_at_end` must be True or False; received nan"),
    ],
)
def test_negative_or_nan_arguments_are_refused(kwargs, message):
    # Also with method="magnitude", which reads no data: a bad value is still a mistake.
    with pytest.raises(PruningError, match=message):
        HeadPruning(**({"target": 2, "method": "magnitude"} | kwargs))


@pytest.mark.backend_independent
@settings(max_examples=50, deadline=None)
@given(
    name=st.sampled_from(["frequency", "start_epoch", "min_heads_per_layer", "batch_size"]),
    value=st.integers(-3, 3) | st.floats(allow_nan=True, allow_infinity=True) | st.booleans(),
)
def test_integer_arguments_accept_exactly_the_integers_in_range(name, value):
    minimum = 0 if name == "start_epoch" else 1
    valid = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
    arguments = {"target": 2, "method": "magnitude", name: value}
    if name == "start_epoch":
        arguments["end_epoch"] = 5
    if valid:
        HeadPruning(**arguments)
    else:
        with pytest.raises(PruningError, match=f"`{name}`"):
            HeadPruning(**arguments)


def test_heads_to_prune_and_head_importance_refuse_bad_arguments():
    model = functional_model()
    scores = {"mha": np.ones(4), "gqa": np.ones(4)}
    with pytest.raises(PruningError, match=r"`target`=nan"):
        heads_to_prune(model, scores, NAN)
    with pytest.raises(PruningError, match=r"`min_heads_per_layer`=-1"):
        heads_to_prune(model, scores, 2, min_heads_per_layer=-1)
    with pytest.raises(PruningError, match=r"`batch_size` must be a positive integer; received -1"):
        head_importance(model, method="magnitude", batch_size=-1)
    with pytest.raises(PruningError, match=r"`max_batches` must be .*; received nan"):
        head_importance(model, method="magnitude", max_batches=NAN)
    with pytest.raises(ValueError, match=r"`query_length` must be a positive integer; received -3"):
        model_attention_flops(model, -3)
    with pytest.raises(ValueError, match=r"`key_length` must be a positive integer; received nan"):
        model_attention_flops(model, 4, NAN)
