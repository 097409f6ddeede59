"""Refusals of the attention layers: mismatched query / key / value shapes (eager,
symbolic and traced calls on every backend), wrong ranks and feature sizes, and
constructor arguments that are not finite, not in range or of the wrong type."""

import math

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from keras import ops

from keras_mha.layers import GroupedQueryAttention, MultiHeadAttention, RotaryEmbedding
from keras_mha.layers.rotary_embedding import check_rope_scaling
from keras_mha.layers.validation import finite_number
from tests.conftest import current_backend

FEATURES = 8

# (query shape, value shape, key shape, the error). Most of these passed silently
# before on at least one backend: einsum and fused kernels broadcast size-1
# batches and lengths (JAX and PyTorch), TensorFlow's batched matmul broadcasts batches.
MISMATCHES = [
    pytest.param((2, 5, 8), (2, 6, 8), (2, 7, 8), "`key` and `value` must have", id="key-len"),
    pytest.param((2, 5, 8), (2, 6, 8), (2, 1, 8), "`key` and `value` must have", id="key-len-1"),
    pytest.param((2, 5, 8), (2, 1, 8), (2, 6, 8), "`key` and `value` must have", id="val-len-1"),
    pytest.param((2, 5, 8), (2, 6, 8), (1, 6, 8), "`key` and `value` must have", id="key-batch-1"),
    pytest.param((2, 5, 8), (1, 6, 8), (1, 6, 8), "`query` and `value` must have", id="kv-batch-1"),
    pytest.param((1, 5, 8), (2, 6, 8), (2, 6, 8), "`query` and `value` must have", id="q-batch-1"),
    pytest.param((2, 5, 8), (3, 6, 8), (3, 6, 8), "`query` and `value` must have", id="batch"),
]


def _shapes_in_message(*shapes):
    # Both shapes are named; the regex escapes the parentheses.
    return ".*".join(f"{s}".replace("(", r"\(").replace(")", r"\)") for s in shapes)


def _built_layer(flash_attention=None):
    layer = GroupedQueryAttention(4, 2, flash_attention=flash_attention)
    layer.build((None, None, FEATURES))
    return layer


def _ones(shape):
    return np.ones(shape, "float32")


@pytest.mark.parametrize("flash_attention", [None, False], ids=["fused", "generic"])
@pytest.mark.parametrize("query_shape, value_shape, key_shape, message", MISMATCHES)
def test_mismatched_inputs_are_refused_at_call(
    flash_attention, query_shape, value_shape, key_shape, message
):
    layer = _built_layer(flash_attention)
    with pytest.raises(ValueError, match=message):
        layer(_ones(query_shape), _ones(value_shape), _ones(key_shape))


@pytest.mark.parametrize("query_shape, value_shape, key_shape, message", MISMATCHES)
def test_mismatched_shapes_are_refused_at_build_and_symbolically(
    query_shape, value_shape, key_shape, message
):
    layer = GroupedQueryAttention(4, 2)
    with pytest.raises(ValueError, match=message):
        layer.compute_output_shape(query_shape, value_shape, key_shape)
    with pytest.raises(ValueError, match=message):
        layer.build(query_shape, value_shape, key_shape)
    assert not layer.built and not layer.weights  # Refused before creating anything.
    inputs = [keras.Input(shape[1:], batch_size=shape[0]) for shape in (query_shape, value_shape)]
    key = keras.Input(key_shape[1:], batch_size=key_shape[0])
    with pytest.raises(ValueError, match=message):
        layer(*inputs, key)


def test_messages_name_both_shapes():
    layer = _built_layer()
    with pytest.raises(ValueError, match=_shapes_in_message((2, 7, 8), (2, 6, 8))):
        layer.compute_output_shape((2, 5, 8), (2, 6, 8), (2, 7, 8))
    with pytest.raises(ValueError, match=_shapes_in_message((1, 5, 8), (2, 6, 8))):
        layer(_ones((1, 5, 8)), _ones((2, 6, 8)))


@pytest.mark.parametrize("query_shape, value_shape, key_shape, message", MISMATCHES)
def test_we_refuse_whatever_keras_multi_head_attention_refuses(
    query_shape, value_shape, key_shape, message
):
    """Keras's own layer is the reference: each shape it refuses, we refuse too."""
    reference = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    try:
        reference.compute_output_shape(query_shape, value_shape, key_shape)
        keras_refuses = False
    except ValueError:
        keras_refuses = True
    if keras_refuses:
        with pytest.raises(ValueError):
            GroupedQueryAttention(4, 2).compute_output_shape(query_shape, value_shape, key_shape)


def test_unknown_dimensions_are_not_compared():
    layer = GroupedQueryAttention(4, 2)
    assert layer.compute_output_shape((None, 5, 8), (2, None, 8), (None, 7, 8)) == (None, 5, 8)
    output = layer(keras.Input((5, 8)), keras.Input((None, 8)), keras.Input((7, 8)))
    assert tuple(output.shape) == (None, 5, 8)


def test_matching_cross_attention_still_works():
    layer = _built_layer()
    output = layer(_ones((2, 5, 8)), _ones((2, 6, 8)), _ones((2, 6, 8)))
    assert tuple(output.shape) == (2, 5, 8)


def _traced(layer):
    """The layer's call under the backend's compiler."""
    if current_backend() == "jax":
        import jax

        return jax.jit(lambda q, v, k: layer(q, v, k))
    import tensorflow as tf

    return tf.function(lambda q, v, k: layer(q, v, k), jit_compile=True)


# torch.compile runs the same Python checks while dynamo traces (checked by hand:
# ValueError), but compiling costs 10+ s on a 2-core CI machine.
@pytest.mark.skipif(current_backend() == "torch", reason="torch.compile is too slow for CI")
def test_mismatched_inputs_are_refused_when_traced():
    """Shapes are static while jax.jit, tf.function or torch.compile traces: refused then.

    Before, this key / value batch of 1 was broadcast over the query batch silently.
    """
    layer = _built_layer()
    function = _traced(layer)
    assert tuple(function(_ones((2, 5, 8)), _ones((2, 6, 8)), _ones((2, 6, 8))).shape) == (2, 5, 8)
    with pytest.raises(ValueError, match="`query` and `value` must have the same batch size"):
        function(_ones((2, 5, 8)), _ones((1, 6, 8)), _ones((1, 6, 8)))


@pytest.mark.parametrize(
    "index, received",
    [
        (2.5, "received 2.5"),  # used to write at 2
        (True, "received True"),
        ("2", "received '2'"),
        (np.float32(2.0), "dtype float32"),
        (np.array([1, 2]), r"shape \(2,\)"),
    ],
)
def test_cache_index_must_be_an_integer_scalar(index, received):
    layer = GroupedQueryAttention(4, 2, causal=True)
    x = _ones((1, 2, FEATURES))
    layer(x)
    cache = layer.init_cache(1, 8)
    with pytest.raises(ValueError, match=r"`cache_index` must be an integer scalar.*" + received):
        layer(x, cache=cache, cache_index=index)
    if current_backend() == "torch":  # the decode function's eager step (its checks first)
        with pytest.raises(ValueError, match=r"`cache_index` must be an integer"):
            layer.make_decode_function()(ops.convert_to_tensor(x), cache, index)
    layer(x, cache=cache, cache_index=np.int64(3))  # NumPy integers are integers


@pytest.mark.skipif(current_backend() != "tensorflow", reason="TensorFlow graph constants")
def test_a_constant_index_in_a_compiled_tf_step_is_refused_when_traced():
    """`tf.constant(7)` inside the step is known at trace time: refused, not a NaN step."""
    import tensorflow as tf

    layer = GroupedQueryAttention(4, 2, causal=True)
    x = _ones((1, 2, FEATURES))
    layer(x)
    step = tf.function(
        lambda cache: layer(x, cache=cache, cache_index=tf.constant(7)), jit_compile=True
    )
    with pytest.raises(ValueError, match=r"`cache_index`=7 overruns"):
        step(layer.init_cache(1, 8))


@pytest.mark.skipif(current_backend() != "tensorflow", reason="TensorFlow graphs only")
def test_tf_graph_with_unknown_batch_asserts_at_run_time():
    import tensorflow as tf

    layer = _built_layer()
    spec = tf.TensorSpec((None, None, FEATURES), "float32")
    function = tf.function(lambda q, v, k: layer(q, v, k), input_signature=[spec] * 3)
    assert tuple(function(_ones((2, 5, 8)), _ones((2, 6, 8)), _ones((2, 6, 8))).shape) == (2, 5, 8)
    with pytest.raises(tf.errors.InvalidArgumentError, match="`query` and `value` must have"):
        function(_ones((2, 5, 8)), _ones((1, 6, 8)), _ones((1, 6, 8)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="`key` and `value` must have"):
        function(_ones((2, 5, 8)), _ones((2, 6, 8)), _ones((2, 1, 8)))


def test_wrong_ranks_are_refused_before_any_weight_exists():
    for shapes, name in [
        (((2, 8),), "query"),
        (((2, 5, 8), (2, 6, 1, 8)), "value"),
        (((2, 5, 8), (2, 6, 8), (6, 8)), "key"),
    ]:
        layer = GroupedQueryAttention(4, 2)
        with pytest.raises(ValueError, match=f"`{name}` must have rank 3"):
            layer(*[_ones(shape) for shape in shapes])
        assert not layer.weights
    layer = _built_layer()
    with pytest.raises(ValueError, match=r"`query` must have rank 3.*\(2, 5, 1, 8\)"):
        layer(_ones((2, 5, 1, 8)))


def test_feature_sizes_must_match_the_built_kernels():
    layer = GroupedQueryAttention(4, 2)
    layer(_ones((1, 3, 8)), _ones((1, 4, 6)), _ones((1, 4, 10)))
    with pytest.raises(ValueError, match=r"`value` has 8 features .* built for 6"):
        layer(_ones((1, 3, 8)), _ones((1, 4, 8)), _ones((1, 4, 10)))
    with pytest.raises(ValueError, match=r"`key` has 6 features .* built for 10"):
        layer(_ones((1, 3, 8)), _ones((1, 4, 6)), _ones((1, 4, 6)))


# ------------------------------------------------------------ constructor
GQA = dict(num_heads=4, num_key_value_heads=2)
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

BAD_ARGUMENTS = [
    (dict(num_heads=True), r"`num_heads` must be a positive integer; received True"),
    (dict(num_heads=4.0), r"`num_heads` must be a positive integer; received 4.0"),
    (dict(num_heads="4"), r"`num_heads` must be a positive integer; received '4'"),
    (dict(num_key_value_heads=np.bool_(True)), r"`num_key_value_heads` must be a positive"),
    (dict(head_dim=True), r"`head_dim` must be a positive integer or None; received True"),
    (dict(output_dim=-3), r"`output_dim` must be a positive integer or None; received -3"),
    (dict(sliding_window=False), r"`sliding_window` must be a positive integer or None"),
    (dict(dropout=math.nan), r"`dropout` must be a finite number in \[0, 1\); received nan"),
    (dict(dropout=1.0), r"`dropout` must be a finite number in \[0, 1\); received 1.0"),
    (dict(dropout=-0.1), r"`dropout` must be .*; received -0.1"),
    (dict(dropout="0.1"), r"`dropout` must be .*; received '0.1'"),
    (dict(dropout=True), r"`dropout` must be .*; received True"),
    (dict(rope_theta=0.0), r"`rope_theta` must be a finite number > 0; received 0.0"),
    (dict(rope_theta=math.inf), r"`rope_theta` must be a finite number > 0; received inf"),
    (dict(rope_theta=-1e4), r"`rope_theta` must be a finite number > 0; received -10000.0"),
    (dict(rope_theta="1e4"), r"`rope_theta` must be a finite number > 0; received '1e4'"),
    (dict(partial_rotary_factor=1.5), r"`partial_rotary_factor` must be a finite number in "),
    (dict(partial_rotary_factor=math.nan), r"`partial_rotary_factor` .*; received nan"),
    (dict(attention_scale=math.inf), r"`attention_scale` must be a finite number > 0 or None"),
    (dict(attention_scale=-0.1), r"`attention_scale` .*; received -0.1"),
    (dict(attention_scale=math.nan), r"`attention_scale` .*; received nan"),
    (dict(seed=math.nan), r"`seed` must be an integer or None; received nan"),
    (dict(seed="x"), r"`seed` must be an integer or None; received 'x'"),
    (dict(logit_soft_cap=math.inf), r"`logit_soft_cap` must be a finite number > 0 or None"),
    (dict(logit_soft_cap=0.0), r"`logit_soft_cap` .*; received 0.0"),
    (dict(logit_soft_cap=True), r"`logit_soft_cap` .*; received True"),
    (dict(qk_norm_epsilon=0.0), r"`qk_norm_epsilon` must be a finite number > 0; received 0.0"),
    (dict(qk_norm_epsilon=math.inf), r"`qk_norm_epsilon` .*; received inf"),
    (dict(flash_attention=1), r"`flash_attention` must be None, True or False; received 1"),
    (dict(causal="no"), r"`causal` must be True or False; received 'no'"),
    (dict(use_bias=None), r"`use_bias` must be True or False; received None"),
    (dict(use_output_bias=0), r"`use_output_bias` must be True, False or None; received 0"),
    (dict(use_rope="true"), r"`use_rope` must be True or False; received 'true'"),
    (dict(use_qk_norm=1), r"`use_qk_norm` must be True or False; received 1"),
    # RoPE scaling: every field checked, whether or not `use_rope` is on.
    (dict(rope_scaling=[("factor", 2)]), r"`rope_scaling` must be None or a dict"),
    (dict(rope_scaling={"rope_type": "yarn"}), r"`rope_scaling` type 'yarn' is not supported"),
    (dict(rope_scaling={"rope_type": 2}), r"`rope_scaling` type 2 is not supported"),
    (
        dict(rope_scaling={"rope_type": "linear", "type": "llama3", "factor": 2.0}),
        r"'rope_type'='linear' and 'type'='llama3'",
    ),
    (dict(rope_scaling={"rope_type": "linear"}), r"type 'linear' needs the key 'factor'"),
    *[
        (
            dict(rope_scaling={"rope_type": "linear", "factor": factor}),
            rf"`rope_scaling\['factor'\]` must be a finite number > 0; received {shown}",
        )
        for factor, shown in [
            (0.0, "0.0"),
            (-2.0, "-2.0"),
            (math.nan, "nan"),
            (math.inf, "inf"),
            ("2", "'2'"),
            (True, "True"),
            (None, "None"),
        ]
    ],
    *[
        (
            dict(rope_scaling=LLAMA3 | {key: value}),
            rf"`rope_scaling\['{key}'\]` must be a {expected}; received {shown}",
        )
        for key, value, expected, shown in [
            ("factor", math.inf, "finite number > 0", "inf"),
            ("low_freq_factor", 0.0, "finite number > 0", "0.0"),
            ("low_freq_factor", math.nan, "finite number > 0", "nan"),
            ("high_freq_factor", -4.0, "finite number > 0", "-4.0"),
            ("original_max_position_embeddings", 0, "positive integer", "0"),
            ("original_max_position_embeddings", 8192.5, "positive integer", "8192.5"),
            ("original_max_position_embeddings", True, "positive integer", "True"),
            ("original_max_position_embeddings", "8192", "positive integer", "'8192'"),
        ]
    ],
    (
        dict(rope_scaling=LLAMA3 | {"high_freq_factor": 1.0}),
        r"`rope_scaling\['high_freq_factor'\]`=1.0 must be greater than "
        r"`rope_scaling\['low_freq_factor'\]`=1.0",
    ),
    (
        dict(rope_scaling={k: v for k, v in LLAMA3.items() if k != "low_freq_factor"}),
        r"type 'llama3' needs the key 'low_freq_factor'",
    ),
]


@pytest.mark.backend_independent
@pytest.mark.parametrize("kwargs, message", BAD_ARGUMENTS)
def test_bad_constructor_arguments_name_the_argument_and_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GroupedQueryAttention(**(GQA | kwargs))


@pytest.mark.backend_independent
def test_rotary_embedding_checks_its_own_arguments():
    with pytest.raises(ValueError, match=r"`max_wavelength` must be a finite number > 0"):
        RotaryEmbedding(max_wavelength=math.inf)
    with pytest.raises(ValueError, match=r"`partial_rotary_factor` must be a finite number in"):
        RotaryEmbedding(partial_rotary_factor=0.0)
    with pytest.raises(ValueError, match=r"`rope_scaling\['factor'\]`"):
        RotaryEmbedding(rope_scaling={"type": "linear", "factor": -1})  # Legacy "type" key.


@pytest.mark.backend_independent
def test_valid_values_of_other_types_are_accepted_and_normalised():
    layer = MultiHeadAttention(
        np.int64(4),
        head_dim=np.int32(2),
        dropout=np.float32(0.25),
        causal=np.bool_(True),
        rope_theta=500000,
        attention_scale=np.float64(0.5),
        rope_scaling=LLAMA3 | {"factor": 8, "rope_theta": 500000.0},  # transformers 5 adds it
    )
    config = layer.get_config()
    assert (config["num_heads"], config["head_dim"], config["dropout"]) == (4, 2, 0.25)
    assert config["causal"] is True and config["rope_theta"] == 500000.0
    assert check_rope_scaling(config["rope_scaling"]) == (
        "llama3",
        {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    assert type(layer).from_config(config).get_config() == config


BOUNDED = {
    "dropout": dict(at_least=0, below=1),
    "rope_theta": dict(above=0),
    "attention_scale": dict(above=0),
    "logit_soft_cap": dict(above=0),
    "qk_norm_epsilon": dict(above=0),
    "partial_rotary_factor": dict(above=0, at_most=1),
}


def _in_range(value, above=None, at_least=None, below=None, at_most=None):
    return (
        math.isfinite(value)
        and (above is None or value > above)
        and (at_least is None or value >= at_least)
        and (below is None or value < below)
        and (at_most is None or value <= at_most)
    )


@pytest.mark.backend_independent
@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(BOUNDED)),
    value=st.floats(allow_nan=True, allow_infinity=True, width=64)
    | st.floats(min_value=-1.0, max_value=2.0),
)
def test_every_float_argument_is_accepted_exactly_in_its_range(name, value):
    """Any float: the layer either keeps it exactly, or refuses it naming it."""
    if _in_range(value, **BOUNDED[name]):
        layer = GroupedQueryAttention(**GQA, **{name: value})
        assert layer.get_config()[name] == value
    else:
        with pytest.raises(ValueError, match=f"`{name}` must be a finite number"):
            GroupedQueryAttention(**GQA, **{name: value})


@pytest.mark.backend_independent
@settings(max_examples=40, deadline=None)
@given(
    field=st.sampled_from(["factor", "low_freq_factor", "high_freq_factor"]),
    value=st.floats(allow_nan=True, allow_infinity=True) | st.integers(-5, 5) | st.booleans(),
)
def test_llama3_factors_are_refused_unless_finite_positive_and_ordered(field, value):
    scaling = LLAMA3 | {field: value}
    valid = (
        not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
        and scaling["high_freq_factor"] > scaling["low_freq_factor"]
    )
    if valid:
        RotaryEmbedding(rope_scaling=scaling)
    else:
        with pytest.raises(ValueError, match="rope_scaling"):
            RotaryEmbedding(rope_scaling=scaling)


@pytest.mark.backend_independent
def test_finite_number_messages_say_what_was_expected():
    with pytest.raises(ValueError, match=r"^`x` must be a finite number < 2; received 3\.$"):
        finite_number("x", 3, below=2)
    with pytest.raises(ValueError, match=r"^`x` must be a finite number <= 2 or None; received"):
        finite_number("x", "a", at_most=2, allow_none=True)
    assert finite_number("x", None, allow_none=True) is None
    assert finite_number("x", np.float16(0.5), above=0) == 0.5


@settings(max_examples=6, deadline=None)
@given(
    batch=st.just(2),  # the batch is not what is tested: one shape fewer to compile per example
    value_length=st.sampled_from([None, 1, 6]),
    grouped=st.booleans(),
    scores=st.booleans(),
    causal=st.booleans(),
    flash_attention=st.sampled_from([None, False]),
)
def test_a_query_of_length_zero_gives_what_keras_gives(
    batch, value_length, grouped, scores, causal, flash_attention
):
    """An empty query attends to nothing: `(B, 0, F)` (and `(B, H, 0, S)` scores), as
    keras.layers.MultiHeadAttention and GroupQueryAttention return, eagerly and
    symbolically, on every backend (TensorFlow's grouped einsum used to fail on it)."""
    kv_heads = 2 if grouped else 4
    ours = GroupedQueryAttention(4, kv_heads, head_dim=3, flash_attention=flash_attention)
    if grouped:
        reference = keras.layers.GroupQueryAttention(3, 4, kv_heads)
    else:
        reference = keras.layers.MultiHeadAttention(4, 3)
    values = _ones((batch, value_length or 5, FEATURES))
    for layer in (ours, reference):
        layer(values, values)  # build
    query = _ones((batch, 0, FEATURES))
    value = query if value_length is None else values[:, :value_length]
    arguments = {"return_attention_scores": scores, "use_causal_mask": causal}
    expected = reference(query, value, **arguments)
    received = ours(query, None if value_length is None else value, **arguments)
    expected, received = keras.tree.flatten(expected), keras.tree.flatten(received)
    assert [tuple(x.shape) for x in received] == [tuple(x.shape) for x in expected]
    assert tuple(received[0].shape) == (batch, 0, FEATURES)
    symbolic = keras.KerasTensor((batch, 0, FEATURES))
    assert tuple(ours(symbolic).shape) == tuple(reference(symbolic, symbolic).shape)


def test_a_query_of_length_zero_is_refused_with_a_cache():
    layer = _built_layer()
    cache = layer.init_cache(2, 8)
    with pytest.raises(ValueError, match=r"`query` has no positions \(shape \(2, 0, 8\)\)"):
        layer(_ones((2, 0, FEATURES)), cache=cache, cache_index=0)


def test_mha_and_mqa_refuse_a_num_key_value_heads_that_contradicts_them():
    from keras_mha.layers import MultiQueryAttention

    with pytest.raises(ValueError, match=r"must be None or `num_heads` \(4\).*received 2"):
        MultiHeadAttention(num_heads=4, num_key_value_heads=2)
    with pytest.raises(ValueError, match="must be None or 1 for MultiQueryAttention.*received 4"):
        MultiQueryAttention(num_heads=4, num_key_value_heads=4)
    # What the class is anyway (as older saved configs carry it) is accepted.
    assert MultiHeadAttention(num_heads=4, num_key_value_heads=4).num_key_value_heads == 4
    assert MultiQueryAttention(num_heads=4, num_key_value_heads=1).num_key_value_heads == 1
