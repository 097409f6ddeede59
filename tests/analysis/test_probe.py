"""`record_attention` and `head_roles` end to end on small Keras models, on every backend.

A model whose weights make head 0 attend to the previous token (and head 1 to nothing
in particular) is classified end to end from token ids. Recording must not change the
layer's output, must reach layers with `flash_attention=True`, and must be honoured by
the eager PyTorch decode fast path (which skips Keras's `__call__`).
"""

import keras
import numpy as np
import pytest

from keras_mha.analysis.recording import record_attention
from keras_mha.analysis.run import head_roles
from keras_mha.layers import GroupedQueryAttention

LENGTH = 8
SHARPNESS = 12.0


def previous_token_model(causal=True, flash_attention=None):
    """Token id = position (one-hot embeddings); head 0's query at i matches key i - 1."""
    ids = keras.Input((LENGTH,), dtype="int32")
    hidden = keras.layers.Embedding(
        LENGTH, LENGTH, embeddings_initializer="identity", name="one_hot"
    )(ids)
    attention = GroupedQueryAttention(
        num_heads=2,
        num_key_value_heads=2,
        head_dim=LENGTH,
        use_bias=False,
        causal=causal,
        flash_attention=flash_attention,
        name="attention",
    )
    model = keras.Model(ids, attention(hidden))
    query = np.zeros((LENGTH, 2, LENGTH))
    key = np.zeros((LENGTH, 2, LENGTH))
    query[:, 0] = SHARPNESS * np.eye(LENGTH)  # q_i = c e_i
    key[:, 0] = SHARPNESS * np.eye(LENGTH, k=1)  # k_j = c e_(j+1): q_i . k_(i-1) = c^2
    attention.query_kernel.assign(query)
    attention.key_kernel.assign(key)  # head 1 stays all zeros: uniform attention
    attention.value_kernel.assign(np.random.default_rng(0).normal(size=(LENGTH, 2, LENGTH)))
    return model, attention


def positions(rows=3):
    return np.tile(np.arange(LENGTH, dtype="int32"), (rows, 1))


def test_a_planted_previous_token_head_is_found_end_to_end():
    model, _ = previous_token_model()
    result = head_roles(model, positions(), batch_size=3)
    assert result.layers == ["attention"]
    assert result.roles["attention"] == ["previous-token", "broad"]
    statistics = result.statistics["attention"]
    assert statistics["previous"][0] > 0.99 and statistics["next"] is None
    assert statistics["normalized_entropy"][1] == pytest.approx(1.0, abs=1e-6)
    assert result.architecture == "decoder" and result.tokens == 3 * LENGTH
    assert result.to_dict()["role_counts"] == {"previous-token": 1, "broad": 1}


@pytest.mark.parametrize("flash_attention", [None, True])
def test_recording_keeps_the_output_and_sees_every_layer(flash_attention):
    model, attention = previous_token_model(causal=False, flash_attention=flash_attention)
    ids = positions(2)
    reference = keras.ops.convert_to_numpy(model(ids))
    with record_attention(model) as probe:
        recorded = keras.ops.convert_to_numpy(model(ids))
    np.testing.assert_allclose(recorded, reference, atol=1e-5)
    maps = probe.attention["attention"]
    assert maps.shape == (2, 2, LENGTH, LENGTH) and probe.calls == {"attention": 1}
    np.testing.assert_allclose(maps.sum(axis=-1), 1.0, atol=1e-5)
    # Outside the block nothing is recorded any more.
    model(ids)
    assert probe.calls == {"attention": 1}


@pytest.mark.skipif(
    keras.backend.backend() != "torch", reason="the eager decode fast path is PyTorch's"
)
def test_the_eager_decode_fast_path_is_not_taken_while_recording():
    layer = GroupedQueryAttention(num_heads=4, num_key_value_heads=2, head_dim=8, causal=True)
    prompt = keras.random.normal((1, 5, 32), seed=1)
    layer(prompt)
    seen = []
    from keras_mha.pruning.gate_gradients import no_gradient_tracking

    with no_gradient_tracking():
        cache = layer.init_cache(batch_size=1, max_length=8)
        _, cache = layer(prompt, cache=cache, cache_index=0)
        step = prompt[:, -1:]
        expected, _ = layer(step, cache=layer.init_cache(1, 8), cache_index=0)
        with record_attention(layer, lambda path, p: seen.append(p)):
            output, cache = layer(step, cache=cache, cache_index=5)
    assert len(seen) == 1 and seen[0].shape[:3] == (1, 4, 1)
    np.testing.assert_allclose(seen[0].sum(axis=-1), 1.0, atol=1e-5)
    assert keras.ops.convert_to_numpy(output).shape == (1, 1, 32)


def test_a_model_without_attention_layers_is_refused():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="has no keras-mha attention layer"):
        head_roles(model, np.zeros((1, 4), dtype="int32"))
    with pytest.raises(ValueError, match="has no keras-mha attention layer"):
        with record_attention(model):
            pass
