"""`keras-mha convert` end to end on tiny multi-head checkpoints written by transformers.

A Llama decoder and a BERT encoder, each with a tokenizer trained here on a shipped text
(the Python reference's topics, which come with CPython). The exported decoder is
loaded by transformers, which must compute the perplexity the report gives; `inspect`
of the exported folder must show the smaller KV cache the report gives. Bad input
gives one line, the documented exit code and no output folder.
"""

import json

import numpy as np
import pytest

from keras_mha.cli import main
from tests.cli.test_prune import write_tiny_checkpoints
from tests.conversion.texts import shipped_text

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

# The end-to-end runs load, measure, uptrain and export with transformers beside: torch
# leg only for CI time; their parts are tested on every backend (tests/conversion).
torch_leg_only = pytest.mark.skipif(
    __import__("keras").backend.backend() != "torch",
    reason="end-to-end CLI run; its parts are tested on every backend",
)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    def multi_head_llama(vocab_size):
        return transformers.LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            head_dim=8,
            max_position_embeddings=128,
            tie_word_embeddings=True,
            bos_token_id=None,
            eos_token_id=None,
        )

    root = tmp_path_factory.mktemp("convert_cli")
    return write_tiny_checkpoints(root, shipped_text(12_000), multi_head_llama)


def _convert_json(capsys, *arguments):
    capsys.readouterr()
    assert main(["convert", *map(str, arguments), "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert "warning:" not in captured.err
    return json.loads(captured.out)


@torch_leg_only
def test_decoder_converts_uptrains_exports_and_reports(sources, tmp_path, capsys):
    from keras_mha.conversion.report import render_markdown, render_table
    from keras_mha.data.text import decoder_windows, load_tokenizer

    out = tmp_path / "gqa"
    report = _convert_json(
        capsys,
        sources["decoder"],
        "--kv-heads", "2", "--method", "regroup", "--data", sources["text"],
        "--steps", "6", "--lr", "1e-2", "--distill", "--seq-len", "32", "--batch-size", "4",
        "--out", out,
    )  # fmt: skip
    assert report["kv_heads"] == {"before": 4, "after": 2}
    cache = report["kv_cache"]
    assert cache["applicable"] and cache["context_length"] == 128 and cache["dtype"] == "float32"
    # 2 layers x (K + V) x heads x head_dim 8 x 4 bytes, and 128 tokens of it.
    assert cache["before"]["bytes_per_token"] == 2 * 2 * 4 * 8 * 4
    assert cache["after"] == {"bytes_per_token": 256, "bytes_at_context": 256 * 128}
    per_layer_kv = 2 * (32 * 8 + 0)  # two KV heads fewer, each a 32 x 8 kernel, K and V
    assert report["parameters"]["before"] - report["parameters"]["after"] == 2 * 2 * per_layer_kv
    uptraining = report["uptraining"]
    assert uptraining["objective"] == "distill_kl" and uptraining["steps"] == 6
    assert uptraining["teacher_bytes"] == 4 * report["parameters"]["before"]
    quality = report["quality"]
    assert quality["metric"] == "perplexity"
    assert quality["converted"] != quality["original"] != quality["uptrained"]
    assert report["export"]["format"] == "hub" and report["export"]["num_key_value_heads"] == 2

    # transformers reads the folder and computes the reported perplexity.
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert model.config.num_key_value_heads == 2
    windows = decoder_windows(load_tokenizer(out), sources["text"].read_text(), 32, 16384)
    held = report["data"]["held_out_examples"]
    assert held == round(0.1 * windows.num_examples)
    with torch.no_grad():
        logits = model(torch.tensor(windows.inputs[-held:], dtype=torch.long)).logits.double()
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        torch.tensor(windows.targets[-held:].reshape(-1)).long(),
    )
    np.testing.assert_allclose(float(torch.exp(loss)), quality["uptrained"], rtol=1e-4)

    # `inspect` of the exported folder: the cache the report gives, half the MHA one.
    capsys.readouterr()
    assert main(["inspect", str(out), "--format", "json", "--kv-dtype", "float32"]) == 0
    inspected = json.loads(capsys.readouterr().out)
    assert inspected["attention"]["kind"] == "GQA"
    assert inspected["kv_cache"]["bytes_per_token"] == cache["after"]["bytes_per_token"]
    assert inspected["kv_cache"]["mha_equivalent_bytes"] == 2 * inspected["kv_cache"]["total_bytes"]

    table, markdown = render_table(report), render_markdown(report)
    for text in (table, markdown):
        assert "KV heads per layer" in text and "perplexity (held out)" in text
    assert markdown.count("\n|") >= 6 and "uptrained" in table
    assert all(len(line) <= 80 or " " not in line.strip() for line in table.splitlines())


@torch_leg_only
def test_encoder_converts_in_keras_and_says_why_it_is_not_a_hub_checkpoint(
    sources, tmp_path, capsys
):
    import keras

    out = tmp_path / "mqa"
    report = _convert_json(
        capsys,
        sources["encoder"],
        "--kv-heads", "1", "--data", sources["text"], "--steps", "3", "--distill",
        "--seq-len", "24", "--batch-size", "4", "--out", out,
    )  # fmt: skip
    assert report["architecture"] == "encoder" and not report["kv_cache"]["applicable"]
    quality = report["quality"]
    assert quality["metric"] == "embedding_cosine" and quality["original"] == 1.0
    assert 0 < quality["converted"] < 1 and quality["uptrained"] is not None
    assert report["uptraining"]["objective"] == "distill_cosine"
    export = report["export"]
    assert export["format"] == "keras" and "no num_key_value_heads" in export["reason"]
    assert sorted(p.name for p in out.iterdir()) == ["model.keras"]
    loaded = keras.saving.load_model(out / "model.keras")
    assert loaded.blocks[0].attention.num_key_value_heads == 1


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "source, arguments, code, mention",
    [
        ("decoder", ["--kv-heads", "0"], 2, "--kv-heads: 0 must be a positive integer"),
        ("decoder", ["--kv-heads", "3"], 16, "--kv-heads 3: `num_key_value_heads`=3 does not"),
        ("decoder", ["--kv-heads", "8"], 16, "it cannot add any"),
        ("decoder", ["--kv-heads", "2", "--method", "median"], 2, "--method: invalid choice"),
        ("decoder", ["--kv-heads", "2", "--steps", "5"], 2, "--steps 5 uptrains on text"),
        ("decoder", ["--kv-heads", "2", "--distill"], 2, "--distill is how uptraining"),
        (
            "decoder",
            ["--kv-heads", "2", "--lr", "-1"],
            2,
            "--lr: '-1' is out of range; expected a positive",
        ),
        (
            "decoder",
            ["--kv-heads", "2", "--held-out", "1.5"],
            2,
            "--held-out: '1.5' is out of range",
        ),
        ("decoder", ["--kv-heads", "2", "--data", "missing.txt"], 14, "does not exist"),
        (
            "decoder",
            ["--kv-heads", "2", "--seq-len", "4096"],
            2,
            "--seq-len 4096: this model has max_position_embeddings=128",
        ),
        ("encoder", ["--kv-heads", "2", "--data", "TEXT", "--steps", "2"], 2, "is an encoder"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    sources, tmp_path, capsys, source, arguments, code, mention
):
    out = tmp_path / "out"
    arguments = [str(sources["text"]) if a == "TEXT" else a for a in arguments]
    capsys.readouterr()
    assert main(["convert", str(sources[source]), *arguments, "--out", str(out)]) == code
    error = capsys.readouterr().err
    assert error.startswith("keras-mha: error: ") and error.count("\n") == 1, error
    assert mention in error
    assert not out.exists()


@pytest.mark.backend_independent
def test_existing_output_folder_is_refused(sources, tmp_path, capsys):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["convert", str(sources["decoder"]), "--kv-heads", "2", "--out", str(out)]) == 14
    assert "--out" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


@pytest.mark.backend_independent
def test_output_inside_the_source_is_refused(sources, capsys):
    out = sources["decoder"] / "gqa"
    assert main(["convert", str(sources["decoder"]), "--kv-heads", "2", "--out", str(out)]) == 14
    error = capsys.readouterr().err
    assert error.startswith("keras-mha: error: --out") and error.count("\n") == 1, error
    assert not out.exists()
