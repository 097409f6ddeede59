"""`keras-mha prune` end to end on tiny checkpoints written by transformers.

A tiny Qwen2 decoder and a tiny BERT encoder are written by transformers with a
tokenizer trained here (byte-level BPE / WordPiece through the `tokenizers` library),
so the command reads `--data` exactly as it would for a real checkpoint. The exported
folder is loaded by transformers; the perplexity the command reports after pruning is
recomputed with transformers on the same windows, and the figures are checked against
their definitions. Bad input gives one line, the documented exit code and no output.
"""

import json
import sys

import numpy as np
import pytest

from keras_mha.cli import main

# The end-to-end runs load, score, measure and export real (tiny) checkpoints with
# transformers beside: torch leg only for CI time. The pieces they use are tested on
# every backend (pruning, models, export); the refusals below run on every leg.
torch_leg_only = pytest.mark.skipif(
    __import__("keras").backend.backend() != "torch",
    reason="end-to-end CLI run; its parts are tested on every backend",
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

TEXT = "\n\n".join(
    [
        "Attention heads read the whole sequence in parallel, and some matter more than "
        "others. Pruning removes the heads that matter least.",
        "The model then becomes smaller and faster. Does it stay as good? The perplexity "
        "on real text says how much was lost.",
        "Grouped-query attention shares each key and value head between several query "
        "heads, which shrinks the cache kept while generating text.",
        "A checkpoint on the Hub holds a config file, the weights as safetensors and the "
        "tokenizer. Exporting writes all three again.",
    ]
    * 4
)


def _bpe_tokenizer(text):
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator([text], trainers.BpeTrainer(vocab_size=320))
    return tokenizer


def _wordpiece_tokenizer(text):
    from tokenizers import models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer()
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    tokenizer.train_from_iterator(
        [text], trainers.WordPieceTrainer(vocab_size=200, special_tokens=special)
    )
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[
            ("[CLS]", tokenizer.token_to_id("[CLS]")),
            ("[SEP]", tokenizer.token_to_id("[SEP]")),
        ],
    )
    return tokenizer


def write_tiny_checkpoints(root, text, decoder_config):
    """A tiny decoder and a tiny BERT encoder written by transformers into `root`, each with
    a tokenizer trained on `text` (also written, as `text.txt`).

    `decoder_config(vocab_size)` gives the decoder's transformers config.
    """
    text_file = root / "text.txt"
    text_file.write_text(text)
    torch.manual_seed(0)
    decoder_tokenizer = _bpe_tokenizer(text)
    config = decoder_config(decoder_tokenizer.get_vocab_size())
    transformers.AutoModelForCausalLM.from_config(config).eval().save_pretrained(root / "decoder")
    decoder_tokenizer.save(str(root / "decoder" / "tokenizer.json"))

    encoder_tokenizer = _wordpiece_tokenizer(text)
    config = transformers.BertConfig(
        vocab_size=encoder_tokenizer.get_vocab_size(),
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    transformers.BertModel(config).eval().save_pretrained(root / "encoder")
    encoder_tokenizer.save(str(root / "encoder" / "tokenizer.json"))
    return {
        "decoder": root / "decoder",
        "encoder": root / "encoder",
        "text": text_file,
        "root": root,
    }


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    def qwen2(vocab_size):
        return transformers.Qwen2Config(
            vocab_size=vocab_size,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=8,
            max_position_embeddings=64,
            tie_word_embeddings=True,
        )

    return write_tiny_checkpoints(tmp_path_factory.mktemp("prune_cli"), TEXT, qwen2)


def _prune_json(capsys, *arguments):
    capsys.readouterr()
    assert main(["prune", *map(str, arguments), "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert "warning:" not in captured.err  # the CLI shows each Python warning as one line
    return json.loads(captured.out)


def _transformers_perplexity(folder, tokenizer_file, text, seq_len):
    from keras_mha.data.text import decoder_windows, load_tokenizer

    windows = decoder_windows(load_tokenizer(tokenizer_file.parent), text, seq_len)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = model(torch.tensor(windows.inputs, dtype=torch.long)).logits.double()
    nll = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), torch.tensor(windows.targets.reshape(-1)).long()
    )
    return float(torch.exp(nll))


@torch_leg_only
def test_decoder_prune_exports_and_reports(sources, tmp_path, capsys):
    out = tmp_path / "pruned"
    report = _prune_json(
        capsys,
        sources["decoder"],
        "--target",
        "50%",
        "--method",
        "taylor",
        "--data",
        sources["text"],
        "--seq-len",
        "16",
        "--batch-size",
        "4",
        "--out",
        out,
        "--latency-runs",
        "1",
    )
    assert report["architecture"] == "decoder" and report["method"] == "taylor"
    assert report["target"] == {
        "requested": 0.5, "heads_removed": 8, "heads_total": 16, "requested_heads": 8.0,
        "rounding": None,  # 50% of 16 heads is whole KV groups: nothing rounded
    }  # fmt: skip
    before, after = report["before"], report["after"]
    # Group policy: 2 of 4 KV groups go in each layer.
    assert (before["attention_heads"], after["attention_heads"]) == (16, 8)
    assert (before["kv_heads"], after["kv_heads"]) == (8, 4)
    # 2 layers x (K + V) x kv heads x head_dim 8 x 4 bytes.
    assert before["kv_cache_bytes_per_token"] == 2 * 2 * 4 * 8 * 4
    assert after["kv_cache_bytes_per_token"] == before["kv_cache_bytes_per_token"] // 2
    assert after["parameters"] < before["parameters"]
    assert after["attention_flops_per_token"] < before["attention_flops_per_token"]
    assert before["embedding_cosine"] is None and after["latency_ms"] > 0
    config = json.loads((out / "config.json").read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 2)
    assert (out / "tokenizer.json").is_file()
    assert report["export"]["heads_zeroed"] == 0 and report["export"]["format"] == "hub"
    # transformers, on the exported folder, measures the same perplexity.
    expected = _transformers_perplexity(
        out, sources["decoder"] / "tokenizer.json", TEXT, seq_len=16
    )
    assert after["perplexity"] == pytest.approx(expected, rel=1e-4)
    pruned = report["pruned_heads"]
    assert all(len(heads) == 4 for heads in pruned.values())


@torch_leg_only
def test_encoder_prune_with_heatmap(sources, tmp_path, capsys):
    out, heatmap = tmp_path / "pruned", tmp_path / "heads.png"
    report = _prune_json(
        capsys,
        sources["encoder"],
        "--target",
        "4",
        "--method",
        "ablation",
        "--data",
        sources["text"],
        "--batch-size",
        "8",
        "--out",
        out,
        "--heatmap",
        heatmap,
        "--latency-runs",
        "1",
    )
    assert report["architecture"] == "encoder"
    assert report["before"]["embedding_cosine"] == pytest.approx(1.0)
    assert 0 < report["after"]["embedding_cosine"] <= 1.0
    assert report["after"]["attention_heads"] == 4 and report["before"]["perplexity"] is None
    assert report["before"]["kv_cache_bytes_per_token"] is None
    export = report["export"]
    assert export["heads_zeroed"] == 2 and export["num_attention_heads"] == 4
    assert heatmap.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # transformers reproduces the pruned model's embeddings (cosine to the original).
    from keras_mha.commands.prune_report import mean_pooled_embeddings
    from keras_mha.data.text import encoder_sentences, load_tokenizer

    data = encoder_sentences(load_tokenizer(sources["encoder"]), TEXT, 128)
    embeddings = []
    for folder in (sources["encoder"], out):
        model = transformers.AutoModel.from_pretrained(folder).eval()
        with torch.no_grad():
            hidden = model(
                input_ids=torch.tensor(data.token_ids).long(),
                attention_mask=torch.tensor(data.padding_mask).long(),
            )
        embeddings.append(
            mean_pooled_embeddings(hidden.last_hidden_state.numpy(), data.padding_mask)
        )
    cosine = np.sum(embeddings[0] * embeddings[1], axis=-1)
    assert report["after"]["embedding_cosine"] == pytest.approx(float(cosine.mean()), abs=1e-5)


@torch_leg_only
def test_table_output_and_non_uniform_keras_model(sources, tmp_path, capsys):
    capsys.readouterr()
    out = tmp_path / "o"
    code = main(
        [
            "prune",
            str(sources["decoder"]),
            "--target",
            "4",
            "--method",
            "magnitude",
            "--no-uniform",
            "--policy",
            "query",
            "--out",
            str(out),
            "--latency-runs",
            "1",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    text = captured.out.replace("\n  ", " ")  # sentences wrapped at 80 columns, joined
    assert "removed 4 of 16 attention heads (magnitude, policy query, non-uniform" in text
    assert "KV-cache bytes / token" in text and "perplexity" not in text
    # One query head from every KV group of one layer: the layers differ, so no Hub
    # config can describe the result; a .keras model is written instead.
    assert "a .keras model (layers keep different head counts" in text
    # 80 columns, sentences wrapped (a path longer than that is never cut).
    assert all(len(line) <= 80 or " " not in line.strip() for line in captured.out.splitlines())
    assert [p.name for p in out.iterdir()] == ["model.keras"]
    import keras

    model = keras.saving.load_model(out / "model.keras")
    from keras_mha.pruning import find_attention_layers

    heads = sorted(layer.num_heads for layer in find_attention_layers(model).values())
    assert heads == [4, 8]


@torch_leg_only
def test_a_one_line_text_of_tiny_sentences_is_scored_within_the_caps(sources, tmp_path, capsys):
    """5 MB on one line, thousands of sentences: the data line says how many were used
    and why (the caps themselves: tests/cli/test_hostile_data.py)."""
    text = tmp_path / "one-line.txt"
    text.write_text(". ".join(["Heads read text", "Pruning removes heads"] * 130_000))
    assert text.stat().st_size > 5_000_000
    capsys.readouterr()
    arguments = ["prune", str(sources["encoder"]), "--target", "2", "--method", "taylor",
                 "--data", str(text), "--max-tokens", "256", "--out", str(tmp_path / "o"),
                 "--latency-runs", "1", "--wide"]  # fmt: skip
    assert main(arguments) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("data:"))
    assert " tokens in 16 sentences, 2 batches; scoring took " in line
    assert line.endswith(" s (at most 16 sentences: one per 16 tokens of --max-tokens 256)")


@torch_leg_only
def test_default_flags_fit_a_small_encoder_and_overwrite_keeps_other_files(
    sources, tmp_path, capsys
):
    """A BERT of 64 positions on default flags (the default --seq-len of 128 shrinks to
    them), in bfloat16, into a checkpoint folder that also holds the user's notes."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_text("an earlier export")
    (out / "notes.txt").write_text("mine")
    report = _prune_json(
        capsys,
        sources["encoder"],
        "--target",
        "4",
        "--method",
        "magnitude",
        "--dtype",
        "bfloat16",
        "--out",
        out,
        "--overwrite",
        "--latency-runs",
        "1",
    )
    assert report["dtype"] == "bfloat16" and report["export"]["dtype"] == "bfloat16"
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [*report["export"]["files"], "notes.txt"]
    )
    config = json.loads((out / "config.json").read_text())
    assert config["num_attention_heads"] == 4 and config["max_position_embeddings"] == 64


@pytest.mark.parametrize(
    "source, arguments, code, message",
    [
        ("decoder", ["--target", "16", "--method", "magnitude"], 16, "at most 6 can go"),
        ("decoder", ["--target", "3", "--method", "magnitude"], 16, "multiple of 2"),
        ("decoder", ["--target", "25%", "--method", "bogus"], 2, "--method 'bogus' is not"),
        ("decoder", ["--target", "25%", "--seq-len", "4096"], 2, "--seq-len 4096: .*=64; "),
        ("decoder", ["--target", "25%", "--max-tokens", "40"], 2, "too short to score heads"),
        ("decoder", ["--target", "25%", "--method", "taylor"], 2, "pass --data FILE"),
        # One sentence per batch has a contrastive loss of exactly 0: nothing to score with.
        ("encoder", ["--target", "4", "--batch-size", "1"], 2, "--batch-size 1: .*at least 2$"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    sources, tmp_path, capsys, source, arguments, code, message
):
    import re

    extra = ["--data", str(sources["text"])] if arguments[-1] != "taylor" else []
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["prune", str(sources[source]), *arguments, *extra, "--out", str(out)]) == code
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and re.search(message, error[0]), error
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == []


def test_existing_output_folder_needs_overwrite(sources, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    capsys.readouterr()
    command = ["prune", str(sources["decoder"]), "--target", "25%", "--method", "magnitude"]
    assert main([*command, "--out", str(out)]) == 14
    assert "exists and is not empty; pass --overwrite" in capsys.readouterr().err
    assert main([*command, "--out", str(out), "--overwrite"]) == 14
    assert "holds no config.json" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


@pytest.mark.backend_independent
def test_encoder_batches_drop_only_padding_columns():
    from keras_mha.data.text import ENCODER_LENGTH_MULTIPLE, EncoderData

    lengths = np.array([3, 9, 2, 20, 4])
    mask = np.arange(24) < lengths[:, None]
    ids = np.where(mask, np.arange(1, 25), 0).astype("int32")
    data = EncoderData(ids, mask, num_tokens=int(lengths.sum()))
    assert ENCODER_LENGTH_MULTIPLE == 8
    for (start, stop), width in {(0, 3): 16, (2, 3): 8, (3, 5): 24, (0, None): 24}.items():
        x = data.inputs(start, stop)
        assert x["token_ids"].shape == (len(lengths[start:stop]), width)
        # Every real token is kept, and what is cut is padding in every row.
        np.testing.assert_array_equal(x["padding_mask"].sum(axis=1), lengths[start:stop])
        assert not mask[start:stop, width:].any()


@pytest.mark.backend_independent
def test_paired_latency_takes_turns_and_pairs_the_ratio(monkeypatch):
    """Fake models advance a fake clock by their cost times the round's load: load that
    changes from round to round hits both models of a round, so the paired ratio is exact."""
    from keras_mha.commands import prune_report

    clock, calls, loads = [0.0], [], [1, 5, 2, 9, 3, 1]

    class Model:
        def __init__(self, name, cost):
            self.name, self.cost = name, cost

        def predict_on_batch(self, inputs):
            timed = len(calls) - 2  # After one warm-up call per model.
            clock[0] += self.cost * (loads[timed // 2] if timed >= 0 else 1)
            calls.append(self.name)
            return np.zeros(1)

    monkeypatch.setattr(prune_report.time, "perf_counter", lambda: clock[0])
    models = [Model("original", 2.0), Model("pruned", 1.0)]
    medians, ratios = prune_report.paired_latency_ms(models, None, runs=len(loads))
    # One warm-up each, then the rounds alternate the order: o p, p o, o p, ...
    assert calls == ["original", "pruned"] + ["original", "pruned", "pruned", "original"] * 3
    assert ratios == [1.0, 0.5]
    assert medians == pytest.approx([5000.0, 2500.0])  # Medians of 2 x load and 1 x load.
    with pytest.raises(ValueError, match="runs"):
        prune_report.paired_latency_ms(models, None, runs=0)


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "sentences, batch_size, bounds",
    [(5, 2, [(0, 2), (2, 5)]), (4, 2, [(0, 2), (2, 4)]), (3, 4, [(0, 3)]), (97, 16, None)],
)
def test_a_last_encoder_batch_of_one_sentence_joins_the_one_before(sentences, batch_size, bounds):
    from keras_mha.data.text import EncoderData

    data = EncoderData(
        np.ones((sentences, 3), "int32"), np.ones((sentences, 3), bool), 3 * sentences
    )
    if bounds is None:  # The all-MiniLM-L6-v2 example: 6 batches, the last of 17.
        bounds = [(start, start + 16) for start in range(0, 80, 16)] + [(80, 97)]
    assert data.batch_bounds(batch_size) == bounds
    assert data.batch_tokens(batch_size) == [3 * (stop - start) for start, stop in bounds]


@torch_leg_only
def test_progress_draws_on_a_terminal_whatever_the_format(sources, tmp_path, capsys, monkeypatch):
    capsys.readouterr()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # stderr a terminal, stdout JSON
    arguments = [
        "prune", sources["decoder"], "--target", "50%", "--method", "taylor", "--data",
        sources["text"], "--seq-len", "16", "--batch-size", "4", "--out", tmp_path / "o",
        "--latency-runs", "1", "--format", "json",
    ]  # fmt: skip
    assert main([str(argument) for argument in arguments]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["flops_sequence_length"] == 16
    assert "\r" in captured.err and " batches" in captured.err  # the scoring progress bar
