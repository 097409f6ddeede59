"""Rotary embeddings against transformers' own implementation (Llama, Phi), plus
q/k RMS norm and logit soft-capping against NumPy."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_mha.layers import GroupedQueryAttention, RotaryEmbedding
from tests.layers.test_reference import random_inputs, randomise
from tests.reference import attention_numpy

torch = pytest.importorskip("torch", reason="transformers' RoPE reference runs on torch")
transformers = pytest.importorskip("transformers")

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def transformers_rope(q, positions, *, theta, scaling=None, partial=1.0):
    """Rotate q (B, T, H, D) with transformers' Llama (or Phi, for partial) RoPE."""
    head_dim = q.shape[-1]
    common = dict(
        hidden_size=head_dim * q.shape[2],
        num_attention_heads=q.shape[2],
        max_position_embeddings=4096,
    )
    tq = torch.from_numpy(q).transpose(1, 2)  # (B, H, T, D)
    pos = torch.from_numpy(np.asarray(positions))[None].expand(q.shape[0], -1)
    if partial == 1.0:
        from transformers.models.llama import modeling_llama as m

        config = transformers.LlamaConfig(rope_theta=theta, rope_scaling=scaling, **common)
        rope = m.LlamaRotaryEmbedding(config)
        cos, sin = rope(tq, pos)
        rotated, _ = m.apply_rotary_pos_emb(tq, tq, cos, sin)
    else:
        from transformers.models.phi import modeling_phi as m

        config = transformers.PhiConfig(rope_theta=theta, partial_rotary_factor=partial, **common)
        rope = m.PhiRotaryEmbedding(config)
        cos, sin = rope(tq, pos)
        width = cos.shape[-1]
        rot, _ = m.apply_rotary_pos_emb(tq[..., :width], tq[..., :width], cos, sin)
        rotated = torch.cat([rot, tq[..., width:]], dim=-1)
    return rotated.transpose(1, 2).numpy()


@pytest.mark.parametrize(
    "theta,scaling,partial",
    [
        (10000.0, None, 1.0),
        (500000.0, LLAMA3_SCALING, 1.0),
        (10000.0, {"rope_type": "linear", "factor": 4.0}, 1.0),
        (10000.0, None, 0.4),  # Phi-2: 32 of 80 features rotate.
    ],
    ids=["default", "llama3", "linear", "partial"],
)
def test_rotary_embedding_matches_transformers(theta, scaling, partial):
    head_dim = 80 if partial != 1.0 else 32
    q = random_inputs(2, 7, 3, head_dim)
    positions = np.arange(100, 107)
    expected = transformers_rope(q, positions, theta=theta, scaling=scaling, partial=partial)
    rope = RotaryEmbedding(
        max_wavelength=theta, partial_rotary_factor=partial, rope_scaling=scaling
    )
    got = ops.convert_to_numpy(rope(q, positions=positions))
    np.testing.assert_allclose(got, expected, atol=2e-5)


@pytest.mark.parametrize("scaling", [None, LLAMA3_SCALING], ids=["default", "llama3"])
def test_default_positions_match_transformers(scaling):
    """Positions 0 .. T - 1 (on JAX, tables computed once as constants)."""
    q = random_inputs(2, 9, 3, 32)
    expected = transformers_rope(q, np.arange(9), theta=500000.0, scaling=scaling)
    rope = RotaryEmbedding(max_wavelength=500000.0, rope_scaling=scaling)
    np.testing.assert_allclose(ops.convert_to_numpy(rope(q)), expected, atol=2e-5)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="XLA's compiled text on JAX")
def test_compiled_default_positions_compute_no_sines_on_jax():
    import jax

    rope = RotaryEmbedding()
    text = jax.jit(lambda x: rope(x)).lower(random_inputs(1, 16, 2, 8)).compile().as_text()
    assert " sine(" not in text and " cosine(" not in text


def test_rope_errors_name_the_argument():
    with pytest.raises(ValueError, match="rope_scaling.*'yarn'"):
        RotaryEmbedding(rope_scaling={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        RotaryEmbedding(partial_rotary_factor=1.5)
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        RotaryEmbedding(
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
            }
        )(random_inputs(1, 2, 1, 8))


def test_attention_with_rope_qk_norm_and_soft_cap_matches_numpy():
    x = random_inputs(2, 6, 16)
    layer = GroupedQueryAttention(
        4,
        2,
        head_dim=8,
        causal=True,
        use_rope=True,
        rope_theta=1000.0,
        use_qk_norm=True,
        qk_norm_epsilon=1e-6,
        logit_soft_cap=2.0,
        attention_scale=0.2,
    )
    layer(x)
    randomise(layer)
    expected, _ = attention_numpy(
        layer, x, causal=True, rope_theta=1000.0, soft_cap=2.0, qk_norm_epsilon=1e-6, scale=0.2
    )
    np.testing.assert_allclose(ops.convert_to_numpy(layer(x)), expected, atol=1e-5)


def test_soft_cap_bounds_logits():
    """With a tiny cap every logit is within +-cap, so weights are near uniform."""
    x = random_inputs(1, 5, 8) * 100
    layer = GroupedQueryAttention(2, 1, head_dim=4, logit_soft_cap=1e-3)
    layer(x)
    _, scores = layer(x, return_attention_scores=True)
    np.testing.assert_allclose(ops.convert_to_numpy(scores), 0.2, atol=1e-3)


def test_flash_attention_true_refuses_soft_cap():
    x = random_inputs(1, 3, 8)
    layer = GroupedQueryAttention(2, 1, head_dim=4, logit_soft_cap=5.0, flash_attention=True)
    with pytest.raises(ValueError, match="logit_soft_cap"):
        layer(x)
