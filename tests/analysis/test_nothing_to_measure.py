"""Head statistics with nothing to measure, and maps that are not probabilities.

A head's statistics average over real queries that see two or more keys. Data with no
such query (sequences of one token, an empty batch, an all-False padding mask, a causal
model's windows of one token) is refused in one line, as are ids no vocabulary holds,
data that is not data at all, and maps that are not softmax rows (`classify_heads`);
a model whose attention comes out NaN (NaN weights) raises `NonFiniteError`. A model of
one head per layer cannot lose 25% or 50% of its heads: the survival counts remove what
can go and say so. `head_roles` runs a tiny keras-mha decoder, so those tests run on
every backend; the NumPy ones once.
"""

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_mha.analysis import classify_heads, head_roles
from keras_mha.analysis.roles import assign_roles
from keras_mha.analysis.statistics import STATISTIC_NAMES
from keras_mha.analysis.survival import roles_surviving
from keras_mha.errors import NonFiniteError, UsageError
from keras_mha.models import build_model
from keras_mha.planning.spec import from_config
from tests.configs import tiny_llama

CONFIG = tiny_llama(head_dim=8, num_hidden_layers=1, max_position_embeddings=16)
VOCAB = CONFIG["vocab_size"]


def _softmax(logits):
    weights = np.exp(logits)  # logits of a standard normal: no overflow
    return weights / weights.sum(axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def decoder():
    model = build_model(from_config(CONFIG))
    model(np.ones((1, 4), "int32"))
    return model


@pytest.mark.backend_independent
@settings(max_examples=12, deadline=None)
@given(
    batch=st.integers(0, 3),
    length=st.integers(0, 5),
    real=st.integers(0, 1),
    causal=st.booleans(),
)
def test_no_query_that_sees_two_keys_is_refused_in_one_line(batch, length, real, causal):
    """Batches of no real token, or of at most one real token per sequence."""
    attention = _softmax(np.random.default_rng(0).normal(size=(batch, 2, length, length)))
    mask = np.arange(length)[None, :] < np.full((batch, 1), real)
    with pytest.raises(ValueError, match=r"no real query sees two or more keys") as error:
        classify_heads(attention, padding_mask=mask, causal=causal)
    assert "\n" not in str(error.value)


@pytest.mark.backend_independent
@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([5.0, -1.0, 0.5, 1.2]),
    where=st.sampled_from(["all", "one row"]),
)
def test_maps_that_are_not_probabilities_are_refused(seed, scale, where):
    attention = _softmax(np.random.default_rng(seed).normal(size=(2, 3, 5, 5)))
    assert classify_heads(attention).num_heads == 3  # softmax rows are accepted
    if where == "all":
        attention = attention * scale
    else:
        attention[1, 2, 3] *= scale
    with pytest.raises(ValueError, match=r"expected probabilities .* summing to 1") as error:
        classify_heads(attention)
    message = str(error.value)
    assert "\n" not in message and ("batch 1, head 2" in message or where == "all")


@pytest.mark.backend_independent
def test_constant_maps_and_padded_rows():
    """All 5.0 and all negative are refused; rows of padded queries are not read."""
    for value in (5.0, -0.25):
        with pytest.raises(ValueError, match=f"a value of {value:g}"):
            classify_heads(np.full((1, 2, 4, 4), value))
    attention = np.full((1, 1, 4, 4), 0.25)
    attention[0, 0, 3] = 9.0  # a padded query's row
    mask = np.array([[True, True, True, False]])
    attention[0, 0, :3, 3] = 0.0
    attention[0, 0, :3, :3] = 1 / 3
    assert classify_heads(attention, padding_mask=mask).queries == 3
    with pytest.raises(ValueError, match="every value is None"):
        assign_roles(dict.fromkeys(STATISTIC_NAMES))


@settings(max_examples=4, deadline=None)
@given(batch=st.integers(1, 3), length=st.integers(1, 4), masked=st.booleans())
def test_head_roles_refuses_data_with_nothing_to_measure(decoder, batch, length, masked):
    ids = np.ones((batch, 1 if not masked else length), "int32")
    mask = np.zeros(ids.shape, bool) if masked else np.ones(ids.shape, bool)
    with pytest.raises(UsageError, match=r"real token\(s\); a head's statistics need") as error:
        head_roles(decoder, {"token_ids": ids, "padding_mask": mask})
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "data, message",
    [
        (np.full((2, 4), -3, "int32"), r"token ids hold -3; expected ids of the vocabulary"),
        (np.full((2, 4), VOCAB, "int32"), rf"holds {VOCAB}, outside the vocabulary \[0, {VOCAB}\)"),
        (np.full((2, 4), 2**63, "uint64"), r"outside the vocabulary"),
        (12345, r"`data` is '12345' \(int\); expected arrays"),
        (np.zeros((0, 4), "int32"), r"`data` yields no batches"),
    ],
)
def test_head_roles_refuses_ids_and_data_it_cannot_read(decoder, data, message):
    with pytest.raises(UsageError, match=message):
        head_roles(decoder, data)


def test_nan_weights_raise_non_finite_error():
    model = build_model(from_config(CONFIG))
    model(np.ones((1, 4), "int32"))
    attention = model.blocks[0].attention
    attention.query_kernel.assign(np.full(attention.query_kernel.shape, np.nan))
    with pytest.raises(NonFiniteError, match=r"layer '.*attention' gave NaN or infinite"):
        head_roles(model, np.ones((2, 4), "int32"))
    assert NonFiniteError.exit_code == 19


def test_one_head_per_layer_survival_removes_what_can_go():
    inputs = keras.Input((4, 8))
    from keras_mha.layers import MultiHeadAttention

    model = keras.Model(inputs, MultiHeadAttention(1, name="only")(inputs))
    survival = roles_surviving(model, {"only": ["broad"]}, {"only": np.array([1.0])})
    assert survival["50%"] == {"broad": {"heads": 1, "kept": 1}}
    assert survival["removed"] == {"25%": {"only": []}, "50%": {"only": []}}
    assert survival["limited"] == {"50%": {"asked": 1, "removable": 0}}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A tiny Llama of one layer and one head, and a copy whose query weights are NaN,
    written by transformers with a byte-level BPE tokenizer trained on the text."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from safetensors.numpy import load_file, save_file

    from tests.cli.test_prune import TEXT, _bpe_tokenizer

    root = tmp_path_factory.mktemp("nothing_to_measure")
    tokenizer = _bpe_tokenizer(TEXT)
    config = transformers.LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=16, intermediate_size=24,
        num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
        max_position_embeddings=64, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=None,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).eval().save_pretrained(root / "one-head")
    tokenizer.save(str(root / "one-head" / "tokenizer.json"))
    nan = root / "nan"
    nan.mkdir()
    for path in (root / "one-head").iterdir():
        (nan / path.name).write_bytes(path.read_bytes())
    tensors = load_file(nan / "model.safetensors")
    name = next(name for name in tensors if "q_proj" in name)
    tensors[name] = np.full_like(tensors[name], np.nan)
    save_file(tensors, nan / "model.safetensors", metadata={"format": "pt"})
    (root / "text.txt").write_text(TEXT)
    return root


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "model, extra, code, mention",
    [
        ("one-head", ["--seq-len", "1"], 2, "data: 2 sequence(s) of at most 1 real token(s)"),
        ("nan", ["--seq-len", "8"], 19, "gave NaN or infinite attention probabilities"),
    ],
)
def test_heads_cli_nothing_to_measure_is_one_line(checkpoints, capsys, model, extra, code, mention):
    from keras_mha.cli import main

    plot = checkpoints / f"{model}.html"
    arguments = ["heads", str(checkpoints / model), "--text", str(checkpoints / "text.txt")]
    capsys.readouterr()
    assert main([*arguments, "--max-tokens", "14", "--html", str(plot), *extra]) == code
    error = capsys.readouterr().err.splitlines()
    assert error[-1].startswith("keras-mha: error: ") and mention in error[-1], error
    assert all(line.startswith("keras-mha: warning: ") for line in error[:-1])
    assert not plot.exists()


@pytest.mark.backend_independent
def test_heads_cli_one_head_model_with_importance(checkpoints, capsys):
    import json

    from keras_mha.cli import main

    arguments = ["heads", str(checkpoints / "one-head"), "--text", str(checkpoints / "text.txt")]
    capsys.readouterr()
    assert main([*arguments, "--importance", "magnitude", "--format", "json"]) == 0
    survival = json.loads(capsys.readouterr().out)["survival"]
    assert survival["limited"] == {"50%": {"asked": 1, "removable": 0}}
    assert main([*arguments, "--importance", "magnitude"]) == 0
    assert "at 50%: 0 head(s) removed, not 1: every layer keeps at least one" in (
        capsys.readouterr().out
    )
