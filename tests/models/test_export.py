"""`save_pretrained` of pruned whole models, checked by transformers loading the result.

Each tiny checkpoint is written by transformers itself (random weights, perturbed so
biases and norms are not trivial), loaded with `keras_mha.models.from_pretrained`,
pruned physically with `keras_mha.pruning.prune_heads`, exported, and loaded back by
`transformers.AutoModelForCausalLM` / `AutoModel`: its outputs must equal the Keras
pruned model's to 1e-4 and greedy decoding must pick the same tokens. Covered:

- Qwen2 (explicit `head_dim`, q/k/v biases, GQA): genuinely smaller tensors;
- Phi-3 (fused `qkv_proj` and `gate_up_proj`): the inverse split;
- Llama, whose transformers config requires `hidden_size % num_attention_heads == 0`:
  zero heads padded in, with a warning;
- BERT (head size derived from `hidden_size / num_attention_heads`): the original head
  count with the removed heads zeroed, with a warning;
- GPT-2, GPT-NeoX and RoBERTa (their head sizes are derived too): head importance on
  every backend, then pruned, exported under the family's own key spellings (GPT-2's
  `n_head`) with zeroed heads, and loaded back by transformers with equal outputs;
- refusal of non-uniform models, sharding with an index, tokenizer files copied, the
  round trip through `from_pretrained`, and a bfloat16 export.
"""

import json
import warnings

import keras
import numpy as np
import pytest

from keras_mha.errors import ExportError
from keras_mha.models import from_pretrained, save_pretrained
from keras_mha.pruning import find_attention_layers, head_importance, prune_heads, set_head_gates
from tests.models_checkpoints import ENCODERS, checkpoint

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ATOL = 1e-4
# The tiny Qwen2 export (prune, export, transformers, equal logits, greedy tokens, round
# trip, shards, bfloat16) runs on every backend; the other families exercise the export
# table and padding, which do not depend on the backend, so they run in the torch leg
# only to keep CI time (each loads and runs transformers models).
torch_leg_only = pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="export-format variant; backend-neutral past loading, runs in the torch leg",
)
VOCAB = 61
TOKENS = np.array([[5, 17, 3, 42, 8, 33, 1, 60, 12], [7, 7, 19, 2, 55, 31, 4, 9, 11]], "int32")


def _perturbed(model, seed):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


def _write(directory, config, model_class, seed=0):
    torch.manual_seed(seed)
    model = _perturbed(model_class(config), seed)
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Source folders written by transformers, shared by the tests of this module."""
    root = tmp_path_factory.mktemp("export_sources")
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2)
    decoder = dict(max_position_embeddings=64, tie_word_embeddings=False, **common)
    sources = {
        "qwen2": _write(
            root / "qwen2",
            transformers.Qwen2Config(
                num_attention_heads=8, num_key_value_heads=4, head_dim=8, **decoder
            ),
            transformers.Qwen2ForCausalLM,
        ),
        "phi3": _write(
            root / "phi3",
            transformers.Phi3Config(
                num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, **decoder
            ),
            transformers.Phi3ForCausalLM,
        ),
        "llama": _write(
            root / "llama",
            transformers.LlamaConfig(num_attention_heads=4, num_key_value_heads=4, **decoder),
            transformers.LlamaForCausalLM,
        ),
        "bert": _write(
            root / "bert",
            transformers.BertConfig(
                num_attention_heads=4, max_position_embeddings=32, hidden_act="gelu", **common
            ),
            transformers.BertModel,
        ),
    }
    # A tokenizer beside one source, to be copied on export.
    (sources["qwen2"] / "tokenizer.json").write_text('{"version": "1.0"}')
    (sources["qwen2"] / "generation_config.json").write_text('{"do_sample": false}')
    return sources


@pytest.fixture(scope="module")
def pruned_qwen2(checkpoints):
    """Qwen2 with KV group 1 (query heads 2, 3) removed in both layers: 6 / 3 heads."""
    model = from_pretrained(checkpoints["qwen2"])
    _prune(model, [2, 3])
    return model


def _keras_outputs(model, token_ids=TOKENS):
    return keras.ops.convert_to_numpy(model(token_ids)).astype("float64")


def _transformers_outputs(folder, encoder=False):
    auto = transformers.AutoModel if encoder else transformers.AutoModelForCausalLM
    model = auto.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        output = model(torch.tensor(TOKENS, dtype=torch.long))
    value = output.last_hidden_state if encoder else output.logits
    return model, value.double().numpy()


def _keras_greedy(model, token_ids, steps):
    """Greedy decoding with full forward passes (independent of any cache code)."""
    tokens = np.asarray(token_ids)
    for _ in range(steps):
        logits = keras.ops.convert_to_numpy(model(tokens.astype("int32")))
        tokens = np.concatenate([tokens, logits[:, -1].argmax(-1)[:, None]], axis=1)
    return tokens


def _assert_same_greedy_tokens(model, reference, steps):
    """Greedy continuations of the first 4 tokens: the Keras model's equal transformers'."""
    with torch.no_grad():
        generated = reference.generate(
            torch.tensor(TOKENS[:, :4], dtype=torch.long),
            max_new_tokens=steps,
            do_sample=False,
            attention_mask=torch.ones((2, 4), dtype=torch.long),
            pad_token_id=0,
        ).numpy()
    np.testing.assert_array_equal(_keras_greedy(model, TOKENS[:, :4], steps), generated)


def _prune(model, heads):
    return prune_heads(model, heads={path: heads for path in find_attention_layers(model)})


def _tensor_shape(folder, name):
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="np") as handle:
        return tuple(handle.get_slice(name).get_shape())


@pytest.mark.parametrize(
    "family, removed, heads, kv_heads",
    [("qwen2", [2, 3], 6, 3), pytest.param("phi3", [0, 1], 2, 1, marks=torch_leg_only)],
)
def test_explicit_head_dim_exports_smaller(
    checkpoints, pruned_qwen2, tmp_path, family, removed, heads, kv_heads
):
    if family == "qwen2":
        model = pruned_qwen2
    else:
        model = from_pretrained(checkpoints[family])
        _prune(model, removed)
    out = tmp_path / "pruned"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # nothing to warn about: truly smaller
        summary = save_pretrained(model, out)
    config = json.loads((out / "config.json").read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (heads, kv_heads)
    assert config["head_dim"] == 8 and summary.heads_zeroed == 0
    if family == "qwen2":
        assert _tensor_shape(out, "model.layers.0.self_attn.q_proj.weight") == (heads * 8, 32)
        assert _tensor_shape(out, "model.layers.1.self_attn.k_proj.bias") == (kv_heads * 8,)
        assert {"tokenizer.json", "generation_config.json"} <= set(summary.files)
    else:
        assert _tensor_shape(out, "model.layers.0.self_attn.qkv_proj.weight") == (
            (heads + 2 * kv_heads) * 8,
            32,
        )
    reference, logits = _transformers_outputs(out)
    assert summary.parameters == sum(p.numel() for p in reference.parameters())
    np.testing.assert_allclose(_keras_outputs(model), logits, atol=ATOL, rtol=0)
    # Greedy decoding agrees token for token.
    _assert_same_greedy_tokens(model, reference, 6)
    if family == "qwen2":
        # Round trip: from_pretrained of the export gives the pruned model's outputs.
        np.testing.assert_allclose(
            _keras_outputs(from_pretrained(out)), _keras_outputs(model), atol=1e-5, rtol=0
        )


@torch_leg_only
def test_llama_pads_heads_transformers_cannot_state(checkpoints, tmp_path):
    model = from_pretrained(checkpoints["llama"])
    _prune(model, [1])  # 3 heads of 8: transformers' LlamaConfig needs 32 % heads == 0
    with pytest.warns(UserWarning, match=r"states 4 heads per layer, 1 of them with zeroed"):
        summary = save_pretrained(model, tmp_path / "out")
    assert (summary.num_attention_heads, summary.heads_zeroed, summary.kept_heads) == (4, 1, 3)
    _, logits = _transformers_outputs(tmp_path / "out")
    np.testing.assert_allclose(_keras_outputs(model), logits, atol=ATOL, rtol=0)


@torch_leg_only
def test_bert_keeps_its_head_count_with_zeroed_heads(checkpoints, tmp_path):
    model = from_pretrained(checkpoints["bert"])
    _prune(model, [0, 2])
    assert all(layer.num_heads == 2 for layer in find_attention_layers(model).values())
    with pytest.warns(UserWarning, match="derives the head size .* the file is bigger"):
        summary = save_pretrained(model, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["num_attention_heads"] == 4 and "head_dim" not in config
    assert summary.heads_zeroed == 2 and summary.kept_heads == 2
    reference, hidden = _transformers_outputs(tmp_path / "out", encoder=True)
    np.testing.assert_allclose(_keras_outputs(model), hidden, atol=ATOL, rtol=0)
    # The pooler, which the Keras encoder does not hold, is carried over from the source.
    source = transformers.AutoModel.from_pretrained(checkpoints["bert"])
    assert torch.equal(reference.pooler.dense.weight, source.pooler.dense.weight)


@torch_leg_only
def test_non_uniform_model_is_refused_and_nothing_is_written(checkpoints, tmp_path):
    model = from_pretrained(checkpoints["llama"])
    paths = list(find_attention_layers(model))
    prune_heads(model, heads={paths[0]: [0, 1]})
    with pytest.raises(ExportError, match=r"layers differ .* scope='per_layer'.*--uniform"):
        save_pretrained(model, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_sharded_and_bfloat16_exports_load_in_transformers(pruned_qwen2, tmp_path):
    model = pruned_qwen2
    summary = save_pretrained(model, tmp_path / "sharded", max_shard_size="20KB")
    shards = [name for name in summary.files if name.startswith("model-")]
    assert len(shards) > 1 and "model.safetensors.index.json" in summary.files
    _, logits = _transformers_outputs(tmp_path / "sharded")
    np.testing.assert_allclose(_keras_outputs(model), logits, atol=ATOL, rtol=0)

    summary = save_pretrained(model, tmp_path / "half", dtype="bfloat16")
    config = json.loads((tmp_path / "half" / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and summary.dtype == "bfloat16"
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "half")
    weight = reference.model.layers[0].self_attn.q_proj.weight
    assert weight.dtype == torch.bfloat16
    expected = keras.ops.convert_to_numpy(
        find_attention_layers(model)[next(iter(find_attention_layers(model)))].query_kernel
    )
    np.testing.assert_array_equal(
        weight.detach().float().numpy(),
        torch.from_numpy(expected.reshape(32, -1).T.copy()).to(torch.bfloat16).float().numpy(),
    )


def test_not_a_pretrained_model_is_refused(tmp_path):
    inputs = keras.Input((4, 8))
    plain = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    with pytest.raises(ExportError, match="was not built by keras_mha.models.from_pretrained"):
        save_pretrained(plain, tmp_path / "out")


# -- the families added in 0.3 ------------------------------------------------------------------

NEW_FAMILIES = ["gpt2", "gpt_neox", "roberta"]
torch_leg_gradients = pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="compiling the decoder's gradient costs tens of seconds here; RoBERTa's runs",
)


def _importance_data(made, model):
    """Next-token data for a decoder; for an encoder, its own outputs as regression targets."""
    ids = made.token_ids.astype("int32")
    if made.case in ENCODERS:
        target = keras.ops.convert_to_numpy(model(ids)) + 0.1
        return (ids, target), keras.losses.MeanSquaredError()
    return (ids[:, :-1], ids[:, 1:]), keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@pytest.mark.parametrize(
    "case",
    # Taylor scores compile the model's gradient on JAX and TensorFlow (tens of seconds on a
    # 2-core CI machine each): the decoders run in the torch leg, RoBERTa on every backend.
    [pytest.param(case, marks=torch_leg_gradients) for case in ("gpt2", "gpt_neox")] + ["roberta"],
)
def test_head_importance_then_pruning_on_the_new_families(tmp_path_factory, case):
    made = checkpoint(tmp_path_factory, case)
    model = from_pretrained(made.directory)
    data, loss = _importance_data(made, model)
    scores = head_importance(model, data, method="taylor", loss=loss)
    layers = find_attention_layers(model)
    assert list(scores) == list(layers)
    for values in scores.values():
        assert values.shape == (4,) and np.all(np.isfinite(values)) and values.max() > 0
    before = _keras_outputs(model)
    gated = {path: [0, 1, 1, 1] for path in layers}  # keep three heads of four per layer
    set_head_gates(model, gated)
    gated_outputs = _keras_outputs(model)
    assert np.abs(gated_outputs - before).max() > 1e-4
    prune_heads(model)
    assert all(layer.num_heads == 3 for layer in layers.values())
    np.testing.assert_allclose(_keras_outputs(model), gated_outputs, atol=1e-5, rtol=0)


@torch_leg_only
@pytest.mark.parametrize("case", NEW_FAMILIES)
def test_new_families_export_pruned_heads_that_transformers_loads(tmp_path_factory, tmp_path, case):
    made = checkpoint(tmp_path_factory, case)
    model = from_pretrained(made.directory)
    _prune(model, [2])
    with pytest.warns(UserWarning, match="derives the head size .* the file is bigger"):
        summary = save_pretrained(model, tmp_path / "out")
    assert (summary.num_attention_heads, summary.kept_heads, summary.heads_zeroed) == (4, 3, 1)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    heads_key = "n_head" if case == "gpt2" else "num_attention_heads"
    assert config[heads_key] == 4 and "head_dim" not in config
    assert case != "gpt2" or "num_attention_heads" not in config
    encoder = case in ENCODERS
    reference, outputs = _transformers_outputs(tmp_path / "out", encoder=encoder)
    assert summary.parameters == sum(p.numel() for p in reference.parameters())
    np.testing.assert_allclose(_keras_outputs(model), outputs, atol=ATOL, rtol=0)
    if not encoder:
        _assert_same_greedy_tokens(model, reference, 5)
