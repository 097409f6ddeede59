"""Mixed precision and training: gradients flow on every backend, on real data."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_mha.layers import GroupedQueryAttention, MultiHeadAttention, MultiQueryAttention
from tests.layers.test_reference import random_inputs
from tests.reference import attention_numpy


@pytest.fixture
def policy():
    previous = keras.config.dtype_policy()
    yield keras.config.set_dtype_policy
    keras.config.set_dtype_policy(previous)


@pytest.mark.parametrize("policy_name", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("flash_attention", [None, False], ids=["fused", "generic"])
def test_mixed_precision_dtypes_and_accuracy(policy, policy_name, flash_attention):
    policy(policy_name)
    x = random_inputs(2, 16, 32)
    layer = GroupedQueryAttention(
        8, 2, causal=True, use_rope=True, use_qk_norm=True, flash_attention=flash_attention
    )
    out, scores = layer(x, return_attention_scores=True)
    assert layer.query_kernel.dtype == "float32"
    assert keras.backend.standardize_dtype(out.dtype) == policy_name.split("_")[1]
    assert keras.backend.standardize_dtype(scores.dtype) == "float32"  # Softmax in float32.
    assert ops.convert_to_numpy(scores).sum(-1) == pytest.approx(1.0, abs=1e-5)
    expected, _ = attention_numpy(layer, x, causal=True, rope_theta=10000.0, qk_norm_epsilon=1e-6)
    fast = ops.convert_to_numpy(ops.cast(layer(x), "float32"))
    tolerance = 2e-2 if policy_name == "mixed_float16" else 8e-2
    np.testing.assert_allclose(fast, expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("length", [16, 512], ids=["fused", "blockwise"])
def test_mixed_float16_model_compiles_fits_and_predicts(policy, length):
    """The default path under `fit`/`predict` (compiled: jax.jit, tf.function): XLA on a
    CPU refused float16 attention with float32 accumulation inside jax.jit."""
    policy("mixed_float16")
    x = random_inputs(2, length, 16)
    inputs = keras.Input((length, 16))
    model = keras.Model(inputs, GroupedQueryAttention(4, 2, causal=True)(inputs))
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, ops.zeros_like(x), epochs=1, batch_size=2, verbose=0)
    predicted = model.predict(x, verbose=0)
    assert predicted.dtype == np.float16 and np.isfinite(predicted).all()
    eager = ops.convert_to_numpy(model(x))
    np.testing.assert_allclose(predicted, eager, atol=2e-3, rtol=2e-3)


@pytest.mark.slow
@pytest.mark.parametrize("flash_attention", [None, False], ids=["fused", "generic"])
def test_float16_long_sequence_does_not_overflow(policy, flash_attention):
    """Sequence length 4096 in float16: large logits, long softmax sums."""
    policy("mixed_float16")
    x = random_inputs(1, 4096, 64) * 4.0
    layer = MultiQueryAttention(4, causal=True, flash_attention=flash_attention)
    out = ops.convert_to_numpy(ops.cast(layer(x), "float32"))
    assert out.dtype == np.float32 and np.isfinite(out).all()
    # The last query averages over 4096 keys: still a sensible magnitude.
    assert 0 < np.abs(out[0, -1]).max() < 1e3


def digits_as_row_tokens(limit=600):
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images[:limit] / 16.0).astype("float32")  # (N, 8, 8): 8 tokens of 8.
    return images, digits.target[:limit].astype("int32")


@pytest.mark.parametrize(
    "attention",
    [
        pytest.param(lambda: MultiHeadAttention(4, head_dim=8), id="mha"),
        pytest.param(lambda: GroupedQueryAttention(4, 2, head_dim=8, use_rope=True), id="gqa"),
        pytest.param(lambda: MultiQueryAttention(4, head_dim=8, use_qk_norm=True), id="mqa"),
    ],
)
def test_small_model_trains_on_digits(attention):
    """Loss drops on scikit-learn digits, 8 pixel rows as 8 tokens."""
    keras.utils.set_random_seed(0)
    images, labels = digits_as_row_tokens()
    inputs = keras.Input((8, 8))
    hidden = keras.layers.Dense(32)(inputs)
    hidden = keras.layers.LayerNormalization()(hidden + attention()(hidden))
    logits = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling1D()(hidden))
    model = keras.Model(inputs, logits)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    first = model.evaluate(images, labels, verbose=0)[0]
    history = model.fit(images, labels, epochs=6, batch_size=32, verbose=0)
    # Chance level is 10% and a loss of ln(10) = 2.3.
    assert history.history["loss"][-1] < 0.5 * first
    assert history.history["accuracy"][-1] > 0.6
    # Gradients reached the attention projections (they moved from their init).
    layer = model.layers[2]
    assert isinstance(layer, GroupedQueryAttention)
    assert np.abs(ops.convert_to_numpy(layer.query_bias)).max() > 0.0  # Initialised to 0.
