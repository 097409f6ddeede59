"""`keras-mha heads` end to end on the real all-MiniLM-L6-v2, and its refusals.

One run reads the shipped public-domain text and EWT sample with magnitude importance
and writes the plot and the page (`--format json`): the JSON keys, the role grid, the
syntax report and the survival counts are checked, the PNG is a PNG, and the page is
opened in Debian's chromium through Playwright with the network cut (no request may
leave the file), a cell is clicked and the head's token-to-token view must appear.
Bad input gets one line on stderr, the exit code of `keras_mha.errors` and no file.
"""

import json
import os
from pathlib import Path

import keras
import pytest

from keras_mha.cli import main
from tests.cards.test_rebuild_minilm import minilm_directory

DATA = Path(__file__).parents[2] / "examples" / "data" / "heads"
TEXT = DATA / "public-domain.txt"
TREEBANK = DATA / "ewt-sample.conllu"
CHROMIUM = "/usr/bin/chromium"

# The whole run loads the model and checks the outputs, whose figures do not depend on
# the backend (the statistics are checked against transformers on every backend in
# test_transformers_maps.py): once, on the torch leg.
pytestmark = pytest.mark.backend_independent


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("heads_cli")
    text = out / "text.txt"
    text.write_text("\n\n".join(TEXT.read_text().split("\n\n")[:2]))  # 5 sentences
    # The first 12 sentences of the sample (the method itself: test_syntax.py).
    treebank = out / "sample.conllu"
    treebank.write_text("\n\n".join(TREEBANK.read_text().split("\n\n")[:12]) + "\n")
    arguments = [
        "heads", str(minilm_directory()), "--text", str(text), "--conllu", str(treebank),
        "--importance", "magnitude", "--batch-size", "16", "--plot", str(out / "heads.png"),
        "--html", str(out / "heads.html"), "--format", "json",
    ]  # fmt: skip
    return out, arguments


def test_json_report_plot_and_page(run, capsys):
    out, arguments = run
    capsys.readouterr()
    assert main(arguments) == 0
    captured = capsys.readouterr()
    assert "warning:" not in captured.err
    report = json.loads(captured.out)
    assert report["architecture"] == "encoder" and len(report["layers"]) == 6
    head = report["layers"][0]["heads"][2]
    assert head["role"] == "previous-token" and head["statistics"]["previous"] > 0.9
    assert head["importance"] > 0 and set(head["statistics"]) >= {"entropy", "rare", "first"}
    assert sum(report["role_counts"].values()) == 72
    assert set(report["survival"]) == {"25%", "50%", "removed", "limited"}
    assert report["survival"]["limited"] == {}  # 72 heads: both fractions can go
    kept = report["survival"]["50%"]
    assert sum(entry["heads"] - entry["kept"] for entry in kept.values()) == 36
    syntax = report["syntax"]
    assert syntax["sentences"] == 12 and syntax["source"] == "sample.conllu"
    det = syntax["relations"]["det"]
    assert det["best"]["accuracy"] >= det["baseline"]["accuracy"] and det["words"] > 0
    assert report["thresholds"]["previous-token"] == {"statistics": ["previous"], "at_least": 0.5}
    assert (out / "heads.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "heads.html").read_text()
    # Nothing to fetch: no src/href attribute, no CSS url(), no import.
    assert not any(word in page for word in ("src=", "href=", "url(", "@import", "fetch("))


def test_the_page_works_offline_in_chromium(run):
    out, _ = run
    page_file = out / "heads.html"
    if not page_file.exists():
        pytest.skip("needs test_json_report_plot_and_page's page (same module, same worker)")
    if not (Path(CHROMIUM).exists() and _has_playwright()):
        if os.environ.get("CI"):
            pytest.fail(f"CI must have {CHROMIUM} and playwright (see .ci/run)")
        pytest.skip(f"needs {CHROMIUM} and playwright")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            context = browser.new_context(offline=True)
            requests, errors = [], []
            context.on("request", lambda request: requests.append(request.url))
            page = context.new_page()
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(page_file.as_uri())
            assert page.locator("td[data-layer]").count() == 72
            page.click('td[data-layer="0"][data-head="2"]')
            assert "head 2: previous-token" in page.inner_text("#head-title")
            tokens = page.locator("#attention svg text.query")
            assert tokens.count() > 3 and tokens.first.text_content() == "[CLS]"
            assert page.locator("#attention svg line").count() >= tokens.count() - 1
            first_sentence = tokens.count()
            page.select_option("#sentence", "1")  # another sentence, another length
            assert page.locator("#attention svg text.query").count() != first_sentence
        finally:
            browser.close()
    assert requests == [page_file.as_uri()] and errors == []


def _has_playwright():
    import importlib.util

    return importlib.util.find_spec("playwright") is not None


def _no_attention_model(path):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.save(path)
    return path


@pytest.mark.parametrize(
    "case, code, message",
    [
        ("empty text", 2, r"--text: .* is empty; expected plain text"),
        ("binary text", 14, r"--text: .* looks binary"),
        ("not utf-8", 14, r"--text: .* is not UTF-8 text"),
        ("conllu does not parse", 2, r"--conllu: the sentence at line 1 is not CoNLL-U"),
        ("conllu does not match", 2, r"--conllu: none of its 1 sentences matches the model's"),
        ("no attention layers", 15, r"MODEL: .* has no keras-mha attention layer"),
        ("bad importance", 2, r"--importance 'bogus' is not a head-importance method"),
        ("bad plot name", 14, r"--plot: .* does not end in \.png"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, case, code, message):
    import re

    text = tmp_path / "text.txt"
    text.write_text("A short text. It has two sentences.")
    model = str(minilm_directory())
    extra = []
    if case == "empty text":
        text.write_text("  \n\n")
    elif case == "binary text":
        text.write_bytes(b"\x00\x01\x02binary")
    elif case == "not utf-8":
        text.write_bytes(b"\xff\xfe\xfa")
    elif case == "conllu does not parse":
        (tmp_path / "bad.conllu").write_text("this is not\na treebank\n")
        extra = ["--conllu", str(tmp_path / "bad.conllu")]
    elif case == "conllu does not match":
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers

        # An English BPE without an unknown token drops Greek letters: no word gets a token.
        english = Tokenizer(models.BPE())
        english.pre_tokenizer = pre_tokenizers.Whitespace()
        english.train_from_iterator(["a short text it has two sentences"], trainers.BpeTrainer())
        english.save(str(tmp_path / "tokenizer.json"))
        (tmp_path / "greek.conllu").write_text(
            "1\tγάτα\t_\tNOUN\t_\t_\t2\tnsubj\t_\t_\n2\tκάθεται\t_\tVERB\t_\t_\t0\troot\t_\t_\n"
        )
        extra = ["--conllu", str(tmp_path / "greek.conllu"), "--tokenizer", str(tmp_path)]
    elif case == "no attention layers":
        model = str(_no_attention_model(tmp_path / "dense.keras"))
    elif case == "bad importance":
        extra = ["--importance", "bogus"]
    elif case == "bad plot name":
        extra = ["--plot", str(tmp_path / "heads.jpg")]
    before = sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()
    arguments = ["heads", model, "--text", str(text), *extra, "--html", str(tmp_path / "h.html")]
    assert main(arguments) == code
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and re.search(message, error[0]), error
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_decoder_reads_windows_and_scores_heads_with_taylor(tmp_path, capsys, monkeypatch):
    """A tiny Qwen2 (GQA) written by transformers, with a byte-level BPE of its own."""
    import torch
    import transformers

    from tests.cli.test_prune import TEXT as PRUNE_TEXT
    from tests.cli.test_prune import _bpe_tokenizer

    torch.manual_seed(0)
    tokenizer = _bpe_tokenizer(PRUNE_TEXT)
    config = transformers.Qwen2Config(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        max_position_embeddings=64, tie_word_embeddings=True,
    )  # fmt: skip
    transformers.Qwen2ForCausalLM(config).eval().save_pretrained(tmp_path / "decoder")
    tokenizer.save(str(tmp_path / "decoder" / "tokenizer.json"))
    (tmp_path / "text.txt").write_text(PRUNE_TEXT)
    capsys.readouterr()
    arguments = [
        "heads", str(tmp_path / "decoder"), "--text", str(tmp_path / "text.txt"),
        "--importance", "taylor", "--seq-len", "32", "--max-tokens", "256",
        "--html", str(tmp_path / "heads.html"), "--format", "json",
    ]  # fmt: skip
    assert main(arguments) == 0
    report = json.loads(capsys.readouterr().out)
    # 256 tokens make 7 windows of 32 (each predicts one token past its end, as in prune).
    assert report["architecture"] == "decoder" and report["data"]["tokens"] == 7 * 32
    statistics = report["layers"][0]["heads"][0]["statistics"]
    assert statistics["next"] is None and statistics["previous"] is not None
    assert report["survival"]["50%"] and report["importance"] == {"method": "taylor"}
    assert "heads-data" in (tmp_path / "heads.html").read_text()
    # The table keeps to 80 columns; only the path a user types can be longer.
    monkeypatch.chdir(tmp_path)
    short = ["heads", "decoder", "--text", "text.txt", "--max-tokens", "64", "--seq-len", "32"]
    assert main(short) == 0  # the table
    table = capsys.readouterr().out
    assert "roles (layer x head)" in table and "heads per role" in table
    assert max(map(len, table.splitlines())) <= 80, table
    assert main([*short, "--format", "markdown"]) == 0
    markdown = capsys.readouterr().out
    assert "## roles (layer x head)" in markdown and "| layer | 0 | 1 | 2 | 3 |" in markdown


@pytest.mark.parametrize(
    "flags, code, message",
    [
        (["--revision", "../../x"], 11, "revision"),
        (["--token", "hf_abc\ndef"], 12, "token"),
        (["--offline"], 8, "offline mode is on"),
        (["--endpoint", "ftp://hub.example"], 2, "--endpoint"),
    ],
)
def test_hub_flags_follow_the_rules_of_the_other_commands(
    tmp_path, monkeypatch, capsys, flags, code, message
):
    """A Hub id with a bad revision, token or endpoint, or offline without the weights in
    the cache: one line, its exit code, no request made."""
    from tests.hub_server import hub_environment, world_with_deep_working_directory

    world = world_with_deep_working_directory(tmp_path, monkeypatch)
    text = world / "text.txt"
    text.write_text("A short text. It has two sentences.")
    repos = {"org/tiny": {"main": {"config.json": b"{}", "model.safetensors": b"x"}}}
    with hub_environment(world, monkeypatch, repos) as hub:
        capsys.readouterr()
        assert main(["heads", "org/tiny", "--text", str(text), *flags]) == code
        assert hub.requests == []
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and message in error[0] and "hf_abc" not in error[0]
