"""Loading paths and bad input of keras_mha.models, and the weight-name table's inverse.

- A Hub id through a local Hub-protocol server (tests/hub_server.py), then offline from
  the HF cache; a sharded checkpoint with its index.
- Every kind of bad input gives one line naming the file, tensor or argument.
- `weight_names.hub_tensors` (the direction `save_pretrained` uses) gives back exactly
  the tensors transformers wrote, for every layout (split q/k/v, fused qkv and gate/up,
  Gemma's 1 + w q/k norms, BERT, GPT-2's Conv1D c_attn, GPT-NeoX's per-head qkv,
  RoBERTa).
- Sampling is seeded and restricted as documented; an EOS ends rows.
"""

import json
import shutil

import keras
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from keras_mha.errors import CheckpointError, UnsupportedModelError
from keras_mha.models import from_pretrained, generate
from keras_mha.models.weight_names import hub_tensors
from tests.hub_server import hub_environment
from tests.models_checkpoints import checkpoint, loaded

ATOL = 1e-4


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return loaded(tmp_path_factory, "llama")


def copy_checkpoint(made, tmp_path, name="copy"):
    target = tmp_path / name
    shutil.copytree(made.directory, target)
    return target


def logits(model, made):
    return keras.ops.convert_to_numpy(model(made.token_ids))


# -- where checkpoints come from ------------------------------------------------------------------


def test_hub_id_through_the_hf_cache_then_offline(llama, tmp_path, monkeypatch):
    made, _ = llama
    files = {path.name: path.read_bytes() for path in made.directory.iterdir()}
    with hub_environment(tmp_path, monkeypatch, {"org/tiny-llama": {"main": files}}) as hub:
        model = from_pretrained("org/tiny-llama")
        np.testing.assert_allclose(logits(model, made), made.reference, atol=ATOL, rtol=0)
        fetched = {request.path.rsplit("/", 1)[-1] for request in hub.resolve_requests("GET")}
        assert {"config.json", "model.safetensors"} <= fetched
        hub.stop()
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        from huggingface_hub import constants

        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        again = from_pretrained("org/tiny-llama")
        np.testing.assert_allclose(logits(again, made), made.reference, atol=ATOL, rtol=0)


def test_hub_repository_without_safetensors(llama, tmp_path, monkeypatch):
    made, _ = llama
    files = {"config.json": (made.directory / "config.json").read_bytes()}
    with hub_environment(tmp_path, monkeypatch, {"org/no-weights": {"main": files}}):
        with pytest.raises(CheckpointError, match="neither model.safetensors nor"):
            from_pretrained("org/no-weights")


def test_sharded_checkpoint_with_index(tmp_path_factory, tmp_path):
    made = checkpoint(tmp_path_factory, "qwen2")
    made.model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    model = from_pretrained(tmp_path)
    np.testing.assert_allclose(logits(model, made), made.reference, atol=ATOL, rtol=0)


# -- bad input --------------------------------------------------------------------------------


def test_folder_without_safetensors(llama, tmp_path):
    made, _ = llama
    shutil.copy(made.directory / "config.json", tmp_path / "config.json")
    with pytest.raises(CheckpointError, match=r"no model\.safetensors or model\.safetensors"):
        from_pretrained(tmp_path)


def test_tokenizer_only_folder(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="no config.json .a tokenizer-only folder") as error:
        from_pretrained(tmp_path)
    assert "\n" not in str(error.value)


def test_shape_disagreeing_with_the_config(llama, tmp_path):
    made, _ = llama
    folder = copy_checkpoint(made, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 80
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor 'model\.layers\.0\.mlp"):
        from_pretrained(folder)


@pytest.mark.parametrize(
    "edit,message",
    [
        ("drop", r"tensor 'model\.layers\.1\.self_attn\.k_proj\.weight' is missing"),
        ("add", r"unexpected tensor 'model\.layers\.0\.self_attn\.extra\.weight'"),
    ],
)
def test_missing_and_unexpected_tensors(llama, tmp_path, edit, message):
    made, _ = llama
    folder = copy_checkpoint(made, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    if edit == "drop":
        del tensors["model.layers.1.self_attn.k_proj.weight"]
    else:
        tensors["model.layers.0.self_attn.extra.weight"] = np.zeros((2, 2), np.float32)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=message):
        from_pretrained(folder)


def test_unsupported_family_is_named(tmp_path):
    config = {
        "model_type": "opt",
        "architectures": ["OPTForCausalLM"],
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_hidden_layers": 1,
        "ffn_dim": 64,
        "vocab_size": 50,
        "max_position_embeddings": 16,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(
        {"decoder.embed_tokens.weight": np.zeros((50, 32), np.float32)},
        tmp_path / "model.safetensors",
    )
    with pytest.raises(UnsupportedModelError, match="model_type='opt'.*learned position"):
        from_pretrained(tmp_path)
    assert issubclass(UnsupportedModelError, NotImplementedError)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda m: m(np.array([[1, 500]])), r"token_ids holds 500, outside the vocabulary"),
        (lambda m: generate(m, [[1, -1]], 2), r"token_ids holds -1, outside the vocabulary"),
        (lambda m: generate(m, [[1, 2]], 0), r"max_new_tokens=0; expected a positive integer"),
        (lambda m: generate(m, [[1, 2]], -3), r"max_new_tokens=-3"),
        (lambda m: generate(m, [[1, 2]], 2, temperature=-1.0), r"temperature=-1.0"),
        (lambda m: generate(m, [[1, 2]], 2, top_p=1.5), r"top_p=1.5"),
        (
            lambda m: generate(m, [[1, 2]], 2, padding_mask=[[1, 0]]),
            r"row 0 ends with padding; generate needs left-padded",
        ),
    ],
)
def test_bad_arguments_are_named(llama, call, message):
    _, model = llama
    with pytest.raises(ValueError, match=message) as error:
        call(model)
    assert "\n" not in str(error.value)


def test_learned_positions_bound_the_length(tmp_path_factory):
    _, model = loaded(tmp_path_factory, "gpt2")  # n_positions=32
    with pytest.raises(ValueError, match=r"token_ids needs 40 positions; .*=32") as error:
        model(np.ones((1, 40), dtype="int32"))
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=r"max_new_tokens=5: .* 35 positions"):
        generate(model, [[5] * 30], 5)


# -- the inverse direction of the weight-name table -----------------------------------------------


@pytest.mark.parametrize(
    "case", ["llama_tied_bias", "phi3", "gemma3", "bert", "gpt2", "gpt_neox", "roberta"]
)
def test_hub_tensors_give_back_the_checkpoint(tmp_path_factory, case):
    made, model = loaded(tmp_path_factory, case)
    written = load_file(made.directory / "model.safetensors")
    exported = dict(hub_tensors(model))
    ignored = {name for name in written if "pooler" in name or "position_ids" in name}
    assert set(exported) == set(written) - ignored
    for name, tensor in exported.items():
        np.testing.assert_allclose(tensor, written[name], atol=1e-6, rtol=0, err_msg=name)


# -- sampling -----------------------------------------------------------------------------------


def test_sampling_is_seeded_and_restricted(llama):
    made, model = llama
    prompt = made.token_ids[:, :4]
    first = generate(model, prompt, 5, temperature=1.0, seed=3)
    assert np.array_equal(first, generate(model, prompt, 5, temperature=1.0, seed=3))
    others = [generate(model, prompt, 5, temperature=1.0, seed=s) for s in range(4, 8)]
    assert any(not np.array_equal(first, other) for other in others)
    greedy = generate(model, prompt, 5)
    assert np.array_equal(generate(model, prompt, 5, temperature=0.7, top_k=1, seed=0), greedy)
    assert np.array_equal(generate(model, prompt, 5, temperature=0.7, top_p=1e-6, seed=0), greedy)


def test_eos_ends_rows_and_generation(llama):
    made, model = llama
    # The prompt shape of the sampling test: the compiled prefill and step are reused.
    prompt = made.token_ids[:, :4]
    greedy = generate(model, prompt, 6)
    eos = [int(greedy[0, 5]), int(greedy[1, 5])]  # each row's second new token
    stopped = generate(model, prompt, 6, eos_token_id=eos)
    # A row ends at its first EOS and is then filled with the first EOS id; generation
    # stops once every row has ended (here by the second new token at the latest).
    ends = [4 + int(np.flatnonzero(np.isin(row[4:], eos))[0]) for row in greedy]
    assert stopped.shape == (2, max(ends) + 1)
    for row, end in enumerate(ends):
        np.testing.assert_array_equal(stopped[row, : end + 1], greedy[row, : end + 1])
        assert (stopped[row, end + 1 :] == eos[0]).all()


def test_a_head_dim_gpt_neox_never_reads_loads_as_in_transformers(tmp_path_factory, tmp_path):
    # transformers' GPTNeoXAttention derives hidden / heads and never reads `head_dim`: the
    # checkpoint loads there, and here, with the same outputs (the planner costs the same).
    made = checkpoint(tmp_path_factory, "gpt_neox")
    folder = copy_checkpoint(made, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "head_dim": 32}))
    model = from_pretrained(folder)
    np.testing.assert_allclose(logits(model, made), made.reference, atol=ATOL, rtol=0)
