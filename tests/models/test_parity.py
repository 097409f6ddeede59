"""Whole models from `from_pretrained` against transformers, per family, on the current backend.

transformers writes each tiny checkpoint (`tests/models_checkpoints.py`: random weights
perturbed so every norm and bias matters) and computes the reference; keras-mha reads
the folder back with `from_pretrained` and must give the same logits (decoders) or last
hidden states (encoders) to 1e-4, with and without padding, and `generate` must pick the
same tokens as transformers' greedy `generate(do_sample=False)` on a left-padded batch.
Decoder outputs are compared at the real tokens (a causal model's padded queries are
not defined the same way: transformers' forward numbers every position, keras-mha only
the real tokens); an encoder's every row is compared.
"""

import keras
import numpy as np
import pytest

from keras_mha.models import generate, generation_stats
from tests.models_checkpoints import CASES, ENCODERS, RIGHT_PADDED
from tests.models_checkpoints import loaded as loaded_model

ATOL = 1e-4
NEW_TOKENS = 6
# The decode path of the families whose attention or blocks differ most (MQA with a
# sliding window, soft caps and alternating windows, q/k norms with per-layer RoPE, fused
# qkv, learned positions, a parallel residual with partial rotary); fewer cases keep the
# compile time of every leg low.
GENERATION_CASES = ["mistral", "gemma2", "gemma3", "phi3", "gpt2", "gpt_neox"]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return lambda case: loaded_model(tmp_path_factory, case)


@pytest.mark.parametrize("case", list(CASES))
def test_outputs_equal_transformers(loaded, case):
    made, model = loaded(case)
    assert model.family == CASES[case][3]
    # One call for both batches: the unpadded rows, then the padded ones.
    token_ids = np.concatenate([made.token_ids, made.token_ids])
    padding_mask = np.concatenate([np.ones_like(made.padding_mask), made.padding_mask])
    outputs = keras.ops.convert_to_numpy(
        model({"token_ids": token_ids, "padding_mask": padding_mask})
    )
    unpadded, padded = outputs[:2], outputs[2:]
    np.testing.assert_allclose(unpadded, made.reference, atol=ATOL, rtol=0)
    valid = made.padding_mask.astype(bool)
    if case in ENCODERS:
        valid[:] = True  # every query row of an encoder is defined: only keys are masked
    np.testing.assert_allclose(padded[valid], made.reference_padded[valid], atol=ATOL, rtol=0)
    if case not in RIGHT_PADDED or case in ENCODERS:
        # The padded row really differs from the unpadded one (the mask is applied); a
        # right-padded causal row does not, its real tokens never see the padding.
        assert np.abs(padded[1, 3:6] - unpadded[1, 3:6]).max() > 1e-3
    # A bare token-ids tensor is the unpadded batch.
    if case == "llama":
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(model(made.token_ids)), made.reference, atol=ATOL, rtol=0
        )


@pytest.mark.parametrize("case", GENERATION_CASES)
def test_greedy_generation_equals_transformers(loaded, case):
    import torch

    made, model = loaded(case)
    prompt, mask = made.token_ids[:, :7], np.ones((2, 7), dtype=np.int64)
    mask[1, :3] = 0  # generation takes left-padded prompts
    with torch.no_grad():
        expected = made.model.generate(
            input_ids=torch.from_numpy(prompt),
            attention_mask=torch.from_numpy(mask),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        ).numpy()
    ours = generate(model, prompt, NEW_TOKENS, padding_mask=mask)
    np.testing.assert_array_equal(ours, expected)
    if case == "mistral":
        # A prompt of another length reuses the compiled decode step.
        generate(model, prompt[:, 1:], NEW_TOKENS, padding_mask=mask[:, 1:])
        stats = generation_stats(model)
        if stats["path"] == "loop":  # JAX, TensorFlow: one program for the whole loop
            assert (stats["loop_traces"], stats["prefill_traces"]) == (1, 2), stats
            assert (stats["loop_calls"], stats["step_calls"]) == (2, 0), stats
        else:  # Eager PyTorch: the blocks' sub-layers were called directly.
            assert stats["direct_calls"] is True, stats
            assert stats["step_calls"] == 2 * (NEW_TOKENS - 1)
    # Row 0 is unpadded: alone, it runs with no key mask (plain causal attention).
    np.testing.assert_array_equal(generate(model, prompt[:1], NEW_TOKENS), expected[:1])
