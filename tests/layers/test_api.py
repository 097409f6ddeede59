"""Layer API: config and .keras round trips, functional / Sequential / subclassed
models, symbolic shapes, argument errors, head gates and in-place pruning."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_mha
from keras_mha.layers import (
    GroupedQueryAttention,
    MultiHeadAttention,
    MultiQueryAttention,
    RotaryEmbedding,
)
from tests.layer_testing import run_layer_test
from tests.layers.test_reference import random_inputs, randomise

ALL_OPTIONS = dict(
    head_dim=6,
    output_dim=10,
    dropout=0.1,
    use_bias=True,
    use_output_bias=False,
    causal=True,
    sliding_window=5,
    use_rope=True,
    rope_theta=5000.0,
    partial_rotary_factor=0.5,
    rope_scaling={"rope_type": "linear", "factor": 2.0},
    use_qk_norm=True,
    qk_norm_epsilon=1e-5,
    logit_soft_cap=30.0,
    attention_scale=0.3,
    flash_attention=False,
    kernel_initializer="he_normal",
    bias_initializer="ones",
    kernel_regularizer="l2",
    seed=3,
)

LAYERS = [
    pytest.param(GroupedQueryAttention, {"num_heads": 8, "num_key_value_heads": 2}, id="gqa"),
    pytest.param(MultiHeadAttention, {"num_heads": 4}, id="mha"),
    pytest.param(MultiQueryAttention, {"num_heads": 4}, id="mqa"),
]


def test_top_level_exports():
    assert keras_mha.GroupedQueryAttention is GroupedQueryAttention
    assert keras_mha.MultiHeadAttention is MultiHeadAttention
    assert keras_mha.MultiQueryAttention is MultiQueryAttention


@pytest.mark.parametrize("layer_cls, init_kwargs", LAYERS)
def test_standard_layer_checks_with_every_option(layer_cls, init_kwargs, tmp_path):
    """Config, serialization, symbolic and eager calls, `.keras` file: tests/layer_testing.py."""
    layer = run_layer_test(
        layer_cls,
        {**init_kwargs, **ALL_OPTIONS},
        input_data=random_inputs(2, 7, 12),
        expected_output_shape=(2, 7, 10),
        # q/k/v kernels and biases, the output kernel (no output bias), two q/k norms.
        expected_num_trainable_weights=9,
        expected_num_non_trainable_weights=1,  # the head gates
        saved_to=tmp_path,
    )
    config = layer.get_config()
    for name, value in ALL_OPTIONS.items():
        if not name.endswith(("initializer", "regularizer")):
            assert config[name] == value, name


def test_rotary_embedding_passes_the_standard_checks():
    run_layer_test(
        RotaryEmbedding,
        {"max_wavelength": 500.0, "partial_rotary_factor": 0.5},
        input_data=random_inputs(2, 6, 4, 16),
        expected_output_shape=(2, 6, 4, 16),
        expected_num_trainable_weights=0,
        expected_num_non_trainable_weights=0,
    )


def test_pruned_layer_keeps_its_shape_through_keras_file(tmp_path):
    inputs = keras.Input((5, 16))
    layer = GroupedQueryAttention(8, 4, head_dim=4, name="attention")
    model = keras.Model(inputs, layer(inputs))
    randomise(layer)
    x = random_inputs(2, 5, 16)
    gates = np.ones(8, "float32")
    gates[[2, 3, 6]] = 0.0
    gates[7] = 0.0
    layer.head_gates.assign(gates)
    gated = ops.convert_to_numpy(model(x))
    params_before = model.count_params()
    assert layer.prune_heads([2, 3, 6, 7]) == [0, 1, 4, 5]
    assert (layer.num_heads, layer.num_key_value_heads) == (4, 2)
    np.testing.assert_allclose(ops.convert_to_numpy(model(x)), gated, atol=1e-5)
    assert model.count_params() < params_before
    model.save(tmp_path / "pruned.keras")
    loaded = keras.models.load_model(tmp_path / "pruned.keras")
    reloaded = loaded.get_layer("attention")
    assert (reloaded.num_heads, reloaded.num_key_value_heads) == (4, 2)
    assert tuple(reloaded.query_kernel.shape) == (16, 4, 4)
    np.testing.assert_allclose(ops.convert_to_numpy(loaded(x)), gated, atol=1e-5)


def test_prune_heads_errors_leave_layer_untouched():
    layer = GroupedQueryAttention(8, 2, head_dim=4)
    layer(random_inputs(1, 3, 8))
    before = [ops.convert_to_numpy(w) for w in layer.weights]
    with pytest.raises(ValueError, match="all 8 heads"):
        layer.prune_heads(range(8))
    with pytest.raises(ValueError, match="different numbers of query heads"):
        layer.prune_heads([0])
    with pytest.raises(ValueError, match=r"outside \[0, num_heads=8\)"):
        layer.prune_heads([8])
    assert layer.num_heads == 8
    for w, b in zip(layer.weights, before, strict=True):
        np.testing.assert_array_equal(ops.convert_to_numpy(w), b)


def test_head_gates_silence_heads():
    x = random_inputs(2, 4, 8)
    layer = MultiHeadAttention(2, head_dim=4, use_bias=False)
    layer(x)
    assert layer.head_gates.trainable is False
    np.testing.assert_array_equal(ops.convert_to_numpy(layer.head_gates), [1.0, 1.0])
    layer.head_gates.assign([0.0, 0.0])
    np.testing.assert_array_equal(ops.convert_to_numpy(layer(x)), 0.0)


def test_sequential_functional_and_subclassed_models():
    x = random_inputs(2, 6, 8)
    sequential = keras.Sequential([keras.Input((6, 8)), MultiQueryAttention(2, causal=True)])
    assert tuple(sequential(x).shape) == (2, 6, 8)

    query, context = keras.Input((None, 8)), keras.Input((None, 5))
    cross = GroupedQueryAttention(4, 2, head_dim=3, output_dim=7)
    out, scores = cross(query, context, return_attention_scores=True)
    assert tuple(out.shape) == (None, None, 7)
    assert tuple(scores.shape) == (None, 4, None, None)
    functional = keras.Model([query, context], [out, scores])
    got, got_scores = functional([x, random_inputs(2, 3, 5)])
    assert tuple(got.shape) == (2, 6, 7) and tuple(got_scores.shape) == (2, 4, 6, 3)

    class Block(keras.Model):
        def __init__(self):
            super().__init__()
            self.attention = GroupedQueryAttention(4, 2, causal=True)
            self.norm = keras.layers.LayerNormalization()

        def call(self, inputs):
            return self.norm(inputs + self.attention(inputs))

    block = Block()
    assert tuple(block(x).shape) == (2, 6, 8)
    assert block.attention.count_params() > 0


def test_compute_output_shape():
    layer = GroupedQueryAttention(4, 2, output_dim=9)
    assert layer.compute_output_shape((3, 5, 8)) == (3, 5, 9)
    assert MultiHeadAttention(2).compute_output_shape((None, None, 8)) == (None, None, 8)


def test_parameter_counts_follow_bias_options():
    x = random_inputs(1, 2, 16)
    heads, kv, head_dim, features = 4, 2, 8, 16
    projections = features * head_dim * (heads + 2 * kv) + heads * head_dim * features
    for use_bias, use_output_bias, bias_params in [
        (True, True, head_dim * (heads + 2 * kv) + features),
        (True, False, head_dim * (heads + 2 * kv)),  # Qwen2
        (False, True, features),
        (False, False, 0),
    ]:
        layer = GroupedQueryAttention(
            heads, kv, head_dim=head_dim, use_bias=use_bias, use_output_bias=use_output_bias
        )
        layer(x)
        trainable = sum(int(np.prod(v.shape)) for v in layer.trainable_variables)
        assert trainable == projections + bias_params
        assert layer.count_params() == trainable + heads  # + the non-trainable gates


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            dict(num_heads=8, num_key_value_heads=3),
            "num_key_value_heads`=3 must divide `num_heads`=8",
        ),
        (
            dict(num_heads=0, num_key_value_heads=1),
            "num_heads` must be a positive integer; received 0",
        ),
        (dict(num_heads=4, num_key_value_heads=-2), "num_key_value_heads` must be a positive"),
        (dict(num_heads=4, num_key_value_heads=2, head_dim=0), "head_dim"),
        (dict(num_heads=4, num_key_value_heads=2, sliding_window=0), "sliding_window"),
        (dict(num_heads=4, num_key_value_heads=2, dropout=1.5), "dropout"),
        (dict(num_heads=4, num_key_value_heads=2, logit_soft_cap=-1.0), "logit_soft_cap"),
        (dict(num_heads=4, num_key_value_heads=2, flash_attention="yes"), "flash_attention"),
        (
            dict(num_heads=4, num_key_value_heads=2, use_rope=True, partial_rotary_factor=0.0),
            "partial_rotary_factor",
        ),
        (
            dict(
                num_heads=4,
                num_key_value_heads=2,
                use_rope=True,
                rope_scaling={"rope_type": "dynamic"},
            ),
            "rope_scaling",
        ),
    ],
)
def test_argument_errors_name_argument_and_value(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        GroupedQueryAttention(**kwargs)


def test_input_errors():
    layer = GroupedQueryAttention(4, 2)
    with pytest.raises(ValueError, match="query features=10 is not divisible by `num_heads`=4"):
        layer(random_inputs(1, 3, 10))
    layer = GroupedQueryAttention(4, 2)
    layer(random_inputs(1, 3, 8))
    with pytest.raises(ValueError, match="`query` has 6 features"):
        layer(random_inputs(1, 3, 6))
    with pytest.raises(ValueError, match="rank 3"):
        layer(random_inputs(3, 8))


def test_dropout_only_in_training():
    x = random_inputs(2, 5, 8)
    layer = GroupedQueryAttention(4, 2, dropout=0.5, seed=1)
    a = ops.convert_to_numpy(layer(x))
    np.testing.assert_array_equal(a, ops.convert_to_numpy(layer(x, training=False)))
    assert not np.allclose(a, ops.convert_to_numpy(layer(x, training=True)))
