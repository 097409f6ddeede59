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


def _model_tensors(model):
    return {v.value.untyped_storage().data_ptr() for v in model.variables}


def _matrices(step):
    for block in step.blocks:
        yield from block.attention_input.matrices
        yield from block.mlp_input.matrices
        yield block.output
    yield from step.head.matrices


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "views"])
@pytest.mark.parametrize("case", DECODERS)
def test_step_by_step_logits_equal_transformers(loaded, case, fused, monkeypatch):
    import torch

    from keras_mha.backends.torch import model_step

    made, model = loaded(case)
    layout = decoder_layout(model)
    if case in LAYERS_ONLY:
        assert layout is None
        return
    if not fused:  # as a model whose fused copies would not fit
        monkeypatch.setattr(model_step, "FUSED_BYTES", 0)
    batch, length = made.token_ids.shape
    caches = model.init_caches(batch, length + 3)
    step = model_step.ModelStep.bind(layout, caches)
    assert step.fused is fused
    if not fused:  # every product reads the model's own tensors: no copy
        owned = _model_tensors(model)
        assert all(m.untyped_storage().data_ptr() in owned for m in _matrices(step))
    tokens = torch.from_numpy(made.token_ids)
    with torch.no_grad():
        logits = [step.logits(tokens[:, t], t).numpy() for t in range(length)]
    # transformers' forward over the whole sequence, each position's row.
    np.testing.assert_allclose(np.stack(logits, axis=1), made.reference, atol=1e-4, rtol=0)
    step.release()


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "views"])
def test_head_gates_scale_heads_as_the_layers_do(loaded, fused, monkeypatch):
    import torch

    from keras_mha.backends.torch import model_step

    made, model = loaded("llama")
    if not fused:
        monkeypatch.setattr(model_step, "FUSED_BYTES", 0)
    gates = model.blocks[1].attention.head_gates
    heads = int(gates.shape[0])
    gates.assign(np.linspace(0.0, 1.5, heads).astype("float32"))
    try:
        expected = keras.ops.convert_to_numpy(model(made.token_ids))
        caches = model.init_caches(*made.token_ids.shape)
        step = model_step.ModelStep.bind(decoder_layout(model), caches)
        tokens = torch.from_numpy(made.token_ids)
        with torch.no_grad():
            logits = [step.logits(tokens[:, t], t).numpy() for t in range(tokens.shape[1])]
        step.release()
    finally:
        gates.assign(np.ones(heads, dtype="float32"))
    np.testing.assert_allclose(np.stack(logits, axis=1), expected, atol=1e-4, rtol=0)
    assert not np.allclose(expected, made.reference, atol=1e-3)  # the gates changed them


def test_generate_takes_it_and_gives_the_layers_tokens(loaded, monkeypatch):
    made, model = loaded("llama")
    prompt = made.token_ids[:, :4]
    ours = generate(model, prompt, 8)
    stats = generation_stats(model)
    assert (stats["path"], stats["step"]) == ("device_loop", "whole_model"), stats
    per_token = generate(model, prompt, 8, decode_path="per_token")
    stats = generation_stats(model)
    assert (stats["path"], stats["step"]) == ("per_token", "whole_model"), stats
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
