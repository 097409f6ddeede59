"""Hostile input to whole models, as a careless or malicious user would give it.

Per backend (tiny models built from a config, random weights):
- ids outside the vocabulary (>= vocab_size, negative) and segment ids outside their
  table are refused in every path, `model(...)`, `predict`, `predict_on_batch`,
  `evaluate` and `fit`, where compiled steps would otherwise return NaN logits (JAX),
  wrap a negative id around (JAX, TensorFlow) or fail deep inside the backend; the
  model's variables are intact afterwards (JAX detaches them during `predict` and `fit`);
- ragged lists are refused naming the argument;
- `generate` stops at `max_position_embeddings` and at the device's memory, and names
  every malformed argument; PyTorch's gate gradients take a bfloat16 model.

Once (backend-independent): plain lists are token ids; bfloat16 head gates round-trip; NaN
and infinite weights are named when a checkpoint loads; a corrupt entry that loading
ignores (BERT's pooler) is refused on load; `save_pretrained` checks its output before
writing anything; `bench model` refuses sizes it cannot hold.
"""

import json
import os
import shutil
import struct

import keras
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from keras_mha.cli import main
from keras_mha.errors import CheckpointError, ExportError, PathError, UsageError
from keras_mha.models import build_model, from_pretrained, generate, limits, save_pretrained
from keras_mha.models.safetensors_reader import SafetensorsCheckpoint
from keras_mha.planning.spec import from_config
from tests.configs import tiny_llama
from tests.models import test_api as models_api

# The tiny shapes of tests/models/test_api.py, with one layer and 16 positions.
CONFIG = tiny_llama(head_dim=8, num_hidden_layers=1, max_position_embeddings=16)
BERT_CONFIG = {**models_api.BERT_CONFIG, "num_hidden_layers": 1}
GOOD = np.arange(1, 17, dtype="int32").reshape(4, 4)


@pytest.fixture(scope="module")
def decoder():
    model = build_model(from_config(CONFIG))
    model.compile(
        optimizer=keras.optimizers.SGD(0.0),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


@pytest.fixture(scope="module")
def encoder():
    model = build_model(from_config(BERT_CONFIG))
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    return model


def _with(bad_id):
    ids = GOOD.copy()
    ids[0, 1] = bad_id  # in the first batch: refused before any step is compiled or run
    return ids


@pytest.mark.parametrize("bad_id", [50, -1])
def test_ids_outside_the_vocabulary_are_refused_in_every_path(decoder, bad_id):
    weights = [keras.ops.convert_to_numpy(v) for v in decoder.weights]
    ids = _with(bad_id)
    message = f"token_ids holds {bad_id}, outside the vocabulary \\[0, 50\\)"
    for run in (
        lambda: decoder(ids),
        lambda: decoder.predict(ids, batch_size=2, verbose=0),
        lambda: decoder.predict({"token_ids": ids, "padding_mask": ids > 0}, verbose=0),
        lambda: decoder.predict_on_batch(ids),
        lambda: decoder.evaluate(ids, GOOD, batch_size=2, verbose=0),
        lambda: decoder.fit(ids, GOOD, batch_size=2, verbose=0),
    ):
        with pytest.raises(UsageError, match=message):
            run()
    # The same model: JAX detaches the variables from the model during predict, evaluate
    # and fit, and each refusal gave them back.
    for variable, before in zip(decoder.weights, weights, strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), before)


def test_encoder_segments_and_lengths_are_checked_inside_predict(encoder):
    segments = np.zeros_like(GOOD)
    segments[0, 0] = 2
    with pytest.raises(UsageError, match="segment_ids holds 2, outside the vocabulary \\[0, 2\\)"):
        encoder.predict({"token_ids": GOOD, "segment_ids": segments}, batch_size=2, verbose=0)
    with pytest.raises(UsageError, match="token_ids holds 50"):
        encoder.predict(_with(50), batch_size=2, verbose=0)
    with pytest.raises(UsageError, match="token_ids has 17 positions; .*=16"):
        encoder.predict(np.ones((2, 17), "int32"), verbose=0)


@pytest.mark.backend_independent
def test_plain_lists_are_token_ids(decoder):
    """Converted before Keras's call, the same on every backend (eager JAX is slow)."""
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(decoder(GOOD.tolist())),
        keras.ops.convert_to_numpy(decoder(GOOD)),
    )


def test_ragged_or_fractional_lists_are_refused(decoder, encoder):
    for model in (decoder, encoder):
        with pytest.raises(UsageError, match="token_ids: the rows have different lengths"):
            model([[1, 2, 3], [4]])
        with pytest.raises(UsageError, match="padding_mask: the rows have different lengths"):
            model({"token_ids": [[1, 2]], "padding_mask": [[1, 1], [1]]})
        with pytest.raises(UsageError, match="token_ids must be integers"):
            model([[1.5, 2.0]])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m: generate(m, [[1, 2, 3]], 10**9), r"max_new_tokens=1000000000: .* <= 13$"),
        (lambda m: generate(m, [[1, 2, 3]], 14), r"that is 17 positions, past .*=16"),
        (lambda m: generate(m, [list(range(1, 17))], 1), r"token_ids has 16 positions;"),
        (lambda m: generate(m, [[1, 2, 3], [4]], 2), r"token_ids: the rows have different"),
        (lambda m: generate(m, [[1, 2]], 2, temperature=1.0, seed="x"), r"seed='x'; expected"),
        (lambda m: generate(m, [[1, 2]], 2, temperature=1.0, seed=-1), r"seed=-1; expected"),
        (lambda m: generate(m, [[1, 2]], 2, temperature=float("inf")), r"temperature=inf"),
        (lambda m: generate(m, [[1, 2]], 2, eos_token_id=[[1], [2, 3]]), r"eos_token_id="),
        (lambda m: generate(m, [[1, 2]], 2.0), r"max_new_tokens=2.0; expected"),
    ],
)
def test_generate_refuses_with_one_line_naming_the_argument(decoder, call, message):
    with pytest.raises(UsageError, match=message) as error:
        call(decoder)
    assert "\n" not in str(error.value)


def test_generate_stops_at_the_positions_and_the_memory(decoder, monkeypatch):
    from keras_mha.models.generation import _check_length

    _check_length(decoder, (1, 3), 13)  # the last position is allowed
    with pytest.raises(UsageError, match="expected max_new_tokens <= 13"):
        _check_length(decoder, (1, 3), 14)
    # A cache the device cannot hold is refused before anything is allocated.
    monkeypatch.setattr(limits, "device_memory", lambda: (2**20, "a 1 MiB test device"))
    with pytest.raises(UsageError, match=r"512 sequence\(s\) of 16 tokens need at least .*1 MiB"):
        generate(decoder, np.ones((512, 3), "int32"), 13)


@pytest.mark.backend_independent
def test_head_gates_round_trip_in_bfloat16():
    """`keras-mha prune --dtype bfloat16` set the gates it had read, and was refused."""
    from keras_mha.layers import GroupedQueryAttention
    from keras_mha.pruning import get_head_gates, set_head_gates

    layer = GroupedQueryAttention(4, 2, head_dim=8, dtype="bfloat16", name="attention")
    layer.build((None, None, 32))
    gates = get_head_gates(layer)
    gates["attention"][1] = 0
    set_head_gates(layer, gates)
    assert get_head_gates(layer)["attention"].tolist() == [1, 0, 1, 1]


@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="the bfloat16 conversion is in the PyTorch branch of the gate gradients",
)
def test_taylor_scores_in_bfloat16():
    """PyTorch's gate gradients could not take NumPy's bfloat16 gates."""
    from keras_mha.pruning import head_importance

    model = build_model(from_config(CONFIG), dtype="bfloat16")
    scores = head_importance(
        model,
        [(GOOD[:, :-1], GOOD[:, 1:], None)],
        method="taylor",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    assert np.isfinite(scores["block_0/attention"]).all()


# -- loading and exporting (backend-independent) -------------------------------------------------


@pytest.fixture(scope="module")
def exported(decoder, tmp_path_factory):
    """`(folder, model read from it)`: the decoder written by save_pretrained."""
    folder = tmp_path_factory.mktemp("exported") / "source"
    save_pretrained(decoder, folder)
    return folder, from_pretrained(folder)


@pytest.mark.backend_independent
def test_nan_and_infinite_weights_are_named_on_load(exported, tmp_path):
    folder = shutil.copytree(exported[0], tmp_path / "copy")
    tensors = load_file(folder / "model.safetensors")
    tensors["model.norm.weight"][:3] = [np.nan, np.inf, -np.inf]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.warns(UserWarning, match=r"tensor 'model.norm.weight' holds 3 NaN or infinite"):
        from_pretrained(folder)


@pytest.mark.backend_independent
def test_a_corrupt_entry_loading_ignores_is_refused_on_load(encoder, tmp_path):
    """BERT's pooler is not part of the model, but save_pretrained copies it."""
    folder = tmp_path / "bert"
    save_pretrained(encoder, folder)
    path = folder / "model.safetensors"
    tensors = load_file(path)
    tensors["pooler.dense.bias"] = np.zeros(32, np.float32)
    save_file(tensors, path, metadata={"format": "pt"})
    from_pretrained(folder)  # the pooler is ignored
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    header["pooler.dense.bias"]["shape"] = [33]  # one element more than its bytes hold
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data[8 + length :])
    with pytest.raises(CheckpointError, match=r"model.safetensors: not a valid safetensors"):
        from_pretrained(folder)


@pytest.mark.backend_independent
def test_save_pretrained_checks_its_output_before_writing(exported, tmp_path, monkeypatch):
    source, model = exported
    monkeypatch.chdir(tmp_path)
    source_before = sorted(os.listdir(source))
    for out, error, message in [
        (None, PathError, "out_dir=None is not a folder to write"),
        ("", PathError, "out_dir='' is not a folder to write"),
        (source, PathError, "is the source checkpoint folder"),
        (source / "sub", PathError, "lies inside the source checkpoint folder"),
        (source.parent, PathError, "contains the source checkpoint folder"),
        ("out", ExportError, "max_shard_size='inf'"),
    ]:
        shard = "inf" if out == "out" else "5GB"
        with pytest.raises(error, match=message):
            save_pretrained(model, out, max_shard_size=shard, overwrite=True)
    with pytest.raises(PathError, match="tokenizer_from='missing' is not a folder"):
        save_pretrained(model, "out", tokenizer_from="missing")
    assert os.listdir(tmp_path) == []
    assert sorted(os.listdir(source)) == source_before


@pytest.mark.backend_independent
def test_overwriting_an_export_keeps_the_users_files(exported, tmp_path):
    model = exported[1]
    out = tmp_path / "out"
    save_pretrained(model, out)
    first = {key: SafetensorsCheckpoint(out).get(key) for key in SafetensorsCheckpoint(out).keys()}
    (out / "notes.txt").write_text("mine")
    summary = save_pretrained(model, out, overwrite=True, max_shard_size="20KB")
    names = sorted(os.listdir(out))
    assert "model.safetensors" not in names  # the earlier export's single file went
    assert set(summary.files) | {"notes.txt"} == set(names)
    assert (out / "notes.txt").read_text() == "mine"
    sharded = SafetensorsCheckpoint(out)
    assert sharded.keys() == sorted(first)
    for key, value in first.items():
        np.testing.assert_array_equal(sharded.get(key), value)


@pytest.mark.backend_independent
def test_bench_model_refuses_sizes_it_cannot_hold(capsys):
    capsys.readouterr()
    assert main(["bench", "model", "--batch", "100000", "--prompt-length", "100000"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert (
        len(error) == 1 and "--batch / --prompt-length / --new-tokens: 100000 sequence" in error[0]
    )
    assert main(["bench", "model", "--prompt-length", "200000"]) == 2
    assert "past the card's max_position_embeddings=131072" in capsys.readouterr().err
