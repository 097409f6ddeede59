"""PyTorch's whole-model decode step (`backends.torch.model_step`) against transformers'
logits, token by token from an empty cache, on every decoder family's tiny checkpoint;
`generate` takes it by default on the CPU and keeps the layers' steps where it does not
serve (a trait it does not describe, a key mask, a quantized KV cache)."""

import keras
import numpy as np
import pytest

from keras_mha.models import generate, generation_stats
from keras_mha.models import generation as generation_module
from keras_mha.models.decoder_layout import decoder_layout
from tests.conftest import current_backend
from tests.models_checkpoints import DECODERS
from tests.models_checkpoints import loaded as loaded_model

pytestmark = pytest.mark.skipif(current_backend() != "torch", reason="PyTorch's CPU step")

# Families with a trait the whole-model step does not describe: q/k norms (Qwen3,
# Gemma 3) and attention logit soft caps (Gemma 2).
LAYERS_ONLY = ("gemma2", "gemma3", "qwen3")


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return lambda case: loaded_model(tmp_path_factory, case)


@pytest.mark.parametrize("case", DECODERS)
def test_step_by_step_logits_equal_transformers(loaded, case):
    import torch

    from keras_mha.backends.torch.model_step import ModelStep

    made, model = loaded(case)
    layout = decoder_layout(model)
    if case in LAYERS_ONLY:
        assert layout is None
        return
    batch, length = made.token_ids.shape
    caches = model.init_caches(batch, length + 3)
    step = ModelStep.bind(layout, caches)
    tokens = torch.from_numpy(made.token_ids)
    with torch.no_grad():
        logits = [step.logits(tokens[:, t], t).numpy() for t in range(length)]
    # transformers' forward over the whole sequence, each position's row.
    np.testing.assert_allclose(np.stack(logits, axis=1), made.reference, atol=1e-4, rtol=0)
    step.release()


def test_generate_takes_it_and_gives_the_layers_tokens(loaded, monkeypatch):
    made, model = loaded("llama")
    prompt = made.token_ids[:, :4]
    ours = generate(model, prompt, 8)
    stats = generation_stats(model)
    assert (stats["path"], stats["step"]) == ("device_loop", "whole_model"), stats
    per_token = generate(model, prompt, 8, decode_path="per_token")
    assert generation_stats(model)["step"] == "whole_model"
    quantized = generate(model, prompt, 8, kv_cache_dtype="int8")
    assert generation_stats(model)["step"] == "layers"  # int8 codes: the layers' step
    assert quantized.shape == ours.shape
    monkeypatch.setattr(generation_module, "decoder_layout", lambda model: None)
    layers = generate(model, prompt, 8)
    assert generation_stats(model)["step"] == "layers"
    np.testing.assert_array_equal(ours, layers)
    np.testing.assert_array_equal(per_token, layers)


def test_changed_weights_are_bound_again(loaded, monkeypatch):
    made, model = loaded("llama_plain")
    prompt = made.token_ids[:1, :4]
    generate(model, prompt, 3)
    decoder = generation_module._LATEST[model]
    first = decoder._model_step
    assert first is not None and first.matches(decoder_layout(model))
    kernel = model.blocks[0].up_proj.kernel
    original = keras.ops.convert_to_numpy(kernel)
    try:
        kernel.assign(original * 2.0)  # written in place: same tensor, new version
        assert not first.matches(decoder_layout(model))
        ours = generate(model, prompt, 6)
        assert decoder._model_step is not first
        monkeypatch.setattr(generation_module, "decoder_layout", lambda model: None)
        expected = generate(model, prompt, 6)
        np.testing.assert_array_equal(ours, expected)
    finally:
        kernel.assign(original)
