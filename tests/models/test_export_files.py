"""Export plumbing that needs no model: safetensors shards, output folders, text data, progress.

Shards are read back with the `safetensors` library itself (and the index with
transformers' own layout); bfloat16 rounding is checked against torch's; text windows
are checked against the tokenizer's own encoding of the text.
"""

import io
import json
import os

import numpy as np
import pytest

from keras_mha.data import text as text_data
from keras_mha.errors import ExportError, PathError, UsageError
from keras_mha.models.export_files import (
    INDEX_FILE_NAME,
    SINGLE_FILE_NAME,
    LazyTensor,
    check_output_file,
    check_output_folder,
    float32_to_bfloat16_bits,
    output_folder,
    parse_size,
    write_safetensors,
)
from keras_mha.progress import ProgressBar, format_duration

pytestmark = pytest.mark.backend_independent


def _tensors(rng):
    values = {
        "a.weight": rng.normal(size=(4, 6)).astype("float32"),
        "b.bias": rng.normal(size=(6,)).astype("float32"),
        "c.weight": rng.normal(size=(8, 3)).astype("float32"),
        "d.weight": rng.normal(size=(2, 2)).astype("float32"),
    }
    return values, {
        name: LazyTensor(value.shape, "F32", lambda value=value: value)
        for name, value in values.items()
    }


def test_single_file_reads_back_with_safetensors(tmp_path):
    from safetensors import safe_open

    values, lazy = _tensors(np.random.default_rng(0))
    assert write_safetensors(lazy, tmp_path) == [SINGLE_FILE_NAME]
    with safe_open(str(tmp_path / SINGLE_FILE_NAME), framework="np") as handle:
        assert handle.metadata() == {"format": "pt"}
        assert sorted(handle.keys()) == sorted(values)
        for name, value in values.items():
            np.testing.assert_array_equal(handle.get_tensor(name), value)


def test_shards_and_index_match_transformers_layout(tmp_path):
    from safetensors import safe_open

    values, lazy = _tensors(np.random.default_rng(1))
    # 96 + 24 | 96 + 16 bytes: shards of at most 120 bytes -> 2 files, in tensor order.
    files = write_safetensors(lazy, tmp_path, max_shard_size=120)
    assert files == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        INDEX_FILE_NAME,
    ]
    index = json.loads((tmp_path / INDEX_FILE_NAME).read_text())
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in values.values())
    assert index["weight_map"] == {
        "a.weight": files[0],
        "b.bias": files[0],
        "c.weight": files[1],
        "d.weight": files[1],
    }
    for name, file_name in index["weight_map"].items():
        with safe_open(str(tmp_path / file_name), framework="np") as handle:
            np.testing.assert_array_equal(handle.get_tensor(name), values[name])
    # transformers' own reader of sharded checkpoints accepts it.
    torch = pytest.importorskip("torch")
    from transformers.modeling_utils import load_state_dict

    for file_name in files[:-1]:
        state = load_state_dict(str(tmp_path / file_name))
        for name, tensor in state.items():
            assert torch.equal(tensor, torch.from_numpy(values[name]))


def test_bfloat16_rounding_matches_torch(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    values = np.random.default_rng(2).normal(size=(257,)).astype("float32")
    values[:3] = [np.inf, -0.0, 3.0e38]
    expected = torch.from_numpy(values).to(torch.bfloat16)
    bits = float32_to_bfloat16_bits(values)
    np.testing.assert_array_equal(bits.view(np.int16), expected.view(torch.int16).numpy())
    write_safetensors({"x": LazyTensor(values.shape, "BF16", lambda: values)}, tmp_path)
    assert torch.equal(load_file(str(tmp_path / SINGLE_FILE_NAME))["x"], expected)


@pytest.mark.parametrize(
    "size, expected", [("5GB", 5 * 10**9), ("500MB", 5 * 10**8), ("2GiB", 2 * 2**30), (7, 7)]
)
def test_parse_size(size, expected):
    assert parse_size(size) == expected


@pytest.mark.parametrize("size", ["", "5XB", "-1GB", 0, True, None])
def test_parse_size_refuses(size):
    with pytest.raises(ExportError, match="max_shard_size"):
        parse_size(size)


def test_output_folder_is_written_whole_or_not_at_all(tmp_path):
    out = tmp_path / "pruned"
    with output_folder(out) as staging:
        assert staging.parent == tmp_path and staging.name.startswith(".pruned.partial-")
        (staging / "config.json").write_text("{}")
        assert not out.exists()
    assert sorted(os.listdir(out)) == ["config.json"]
    assert sorted(os.listdir(tmp_path)) == ["pruned"]

    # A failure half-way leaves the previous folder as it was and no staging folder.
    with pytest.raises(RuntimeError), output_folder(out, overwrite=True) as staging:
        (staging / "config.json").write_text('{"new": true}')
        raise RuntimeError("boom")
    assert (out / "config.json").read_text() == "{}"
    assert sorted(os.listdir(tmp_path)) == ["pruned"]

    with output_folder(out, overwrite=True) as staging:
        (staging / "config.json").write_text('{"new": true}')
    assert json.loads((out / "config.json").read_text()) == {"new": True}
    assert sorted(os.listdir(tmp_path)) == ["pruned"]


def test_output_folder_refusals(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    with pytest.raises(PathError, match="--out: .* exists and is not empty; pass --overwrite"):
        check_output_folder(full)
    with pytest.raises(PathError, match="holds no config.json"):
        check_output_folder(full, overwrite=True)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(PathError, match="is not a directory"):
        check_output_folder(a_file)
    source = tmp_path / "source"
    source.mkdir()
    (source / "config.json").write_text("{}")
    with pytest.raises(PathError, match="is the source checkpoint folder"):
        check_output_folder(source, overwrite=True, source=source)
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        try:
            with pytest.raises(PathError, match="cannot write into"):
                check_output_folder(locked / "deep" / "out")
        finally:
            locked.chmod(0o700)
    assert check_output_folder(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()  # checking creates nothing
    with pytest.raises(PathError, match="does not end in .png"):
        check_output_file(tmp_path / "heads.jpg", suffix=".png", argument="--heatmap")


def test_progress_bar_counts_and_eta():
    ticks = iter([0.0, 1.0, 2.0, 4.0, 4.0])
    out = io.StringIO()
    bar = ProgressBar(
        4,
        "batches",
        400,
        "scoring",
        stream=out,
        enabled=True,
        min_interval=0.0,
        clock=lambda: next(ticks),
    )
    bar.advance(tokens=100)  # t=1: 1 of 4 in 1 s -> 3 s left
    assert bar.line(1.0).endswith("1/4 batches, 100/400 tokens  00:01 < 00:03")
    bar.advance(tokens=100)
    bar.advance(tokens=200)
    bar.close()
    assert out.getvalue().endswith("3/4 batches, 400/400 tokens  00:04 < 00:01\n")
    assert "[##################------]" in out.getvalue()
    assert format_duration(3725) == "1:02:05"


def test_progress_bar_is_silent_off_a_terminal():
    out = io.StringIO()  # not a TTY
    with ProgressBar(2, stream=out) as bar:
        bar.advance(tokens=5)
    assert out.getvalue() == ""


# -- text data ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bpe_with_bos():
    """A byte-level tokenizer that puts <s> before a text, like Llama's."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"])
    tokenizer.train_from_iterator([TEXT], trainer)
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", bos)]
    )
    return tokenizer


TEXT = (
    "Attention heads read the sequence in parallel. Some of them matter more than others.\n\n"
    "Pruning removes the heads that matter least! The model becomes smaller and faster.\n"
    "Does it stay as good? That is what the perplexity says.\n\n"
) * 6


def test_decoder_windows_follow_the_tokenizer(bpe_with_bos):
    data = text_data.decoder_windows(bpe_with_bos, TEXT, seq_len=16)
    bos = bpe_with_bos.token_to_id("<s>")
    stream = []
    for paragraph in TEXT.split("\n\n"):
        if paragraph.strip():
            stream += bpe_with_bos.encode(paragraph.strip() + "\n\n", add_special_tokens=False).ids
    assert data.inputs.shape == data.targets.shape == (len(data.inputs), 16)
    assert len(data.inputs) == (len(stream) - 1) // 15
    assert (data.inputs[:, 0] == bos).all()  # each window starts as the model's texts did
    for index in range(len(data.inputs)):
        content = stream[index * 15 : index * 15 + 16]
        assert data.inputs[index].tolist() == [bos] + content[:15]
        assert data.targets[index].tolist() == content
    capped = text_data.decoder_windows(bpe_with_bos, TEXT, seq_len=16, max_tokens=40)
    assert len(capped.inputs) == (40 - 1) // 15
    x, y, weights = capped.batches(batch_size=2)[0]
    assert x["token_ids"].shape == (2, 16) and x["padding_mask"].all() and weights is None


def test_decoder_data_too_short(bpe_with_bos):
    with pytest.raises(UsageError, match=r"--data: \d+ tokens is too short to score heads"):
        text_data.decoder_windows(bpe_with_bos, "Too short.", seq_len=64)


def test_encoder_sentences_with_minilm_tokenizer():
    from tests.cards.test_rebuild_minilm import minilm_directory

    tokenizer = text_data.load_tokenizer(minilm_directory())
    text = "The cat sat.\nA dog barked loudly at the postman!  Why?\n\nEnd"
    data = text_data.encoder_sentences(tokenizer, text, seq_len=6)
    assert text_data.split_sentences(text) == [
        "The cat sat.",
        "A dog barked loudly at the postman!",
        "Why?",
        "End",
    ]
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    assert data.token_ids.shape == (4, 6)
    assert (data.token_ids[:, 0] == cls).all()
    first = tokenizer.encode("The cat sat.").ids
    assert data.token_ids[0, : len(first)].tolist() == first
    assert data.padding_mask[0].tolist() == [True] * len(first) + [False] * (6 - len(first))
    # The long sentence is cut to 6 tokens and still ends with [SEP].
    assert data.token_ids[1, -1] == sep and data.padding_mask[1].all()
    assert data.num_tokens == int(data.padding_mask.sum())
    with pytest.raises(UsageError, match="at least 2 sentences"):
        text_data.encoder_sentences(tokenizer, "Only one sentence here", seq_len=16)


def test_reading_text_refusals(tmp_path):
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"\xff\xfe\x00\x80")
    with pytest.raises(PathError, match="is not UTF-8 text"):
        text_data.read_text(binary)
    with pytest.raises(PathError, match="does not exist"):
        text_data.read_text(tmp_path / "missing.txt")
    with pytest.raises(Exception, match="has no tokenizer.json"):
        text_data.load_tokenizer(tmp_path)
