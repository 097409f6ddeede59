"""Scoring data that asks for unbounded work: a multi-megabyte text on one line.

Whatever the text, reading it for `--data` / `--text` costs at most `--max-tokens` tokens
and one window or sentence per `TOKENS_PER_EXAMPLE` of them (a text of tiny sentences
once gave 4,096 sentences for 16,384 tokens, and `prune` ran past 2 minutes); a
sentence is read only as far as `--seq-len` tokens can reach; the data says which cap
stopped it, and `keras-mha prune` prints that in its data line. The reference for the
counts is the definition: the text's own sentences / windows, counted here.
"""

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_mha.data import text as prune_data
from keras_mha.errors import UsageError

pytestmark = pytest.mark.backend_independent
pytest.importorskip("tokenizers")

WORDS = ("attention", "heads", "read", "the", "whole", "sequence", "in", "parallel")


@pytest.fixture(scope="module")
def tokenizers():
    from tests.cli.test_prune import TEXT, _bpe_tokenizer, _wordpiece_tokenizer

    return {"decoder": _bpe_tokenizer(TEXT), "encoder": _wordpiece_tokenizer(TEXT)}


@pytest.fixture(scope="module")
def one_line_files(tmp_path_factory):
    """5 MB on one line: two-word sentences, and no sentence end at all."""
    root = tmp_path_factory.mktemp("hostile_data")
    sentences = ". ".join(f"{WORDS[i % 8]} {WORDS[(i * 3) % 8]}" for i in range(400_000))
    files = {
        "tiny sentences": root / "sentences.txt",
        "no sentence end": root / "words.txt",
    }
    files["tiny sentences"].write_text(sentences[:5_000_000])
    files["no sentence end"].write_text(sentences.replace(".", "")[:5_000_000])
    assert all(path.stat().st_size >= 5_000_000 for path in files.values())
    return files


@pytest.mark.parametrize("kind", ["decoder", "encoder"])
def test_a_five_megabyte_line_is_read_within_the_caps(tokenizers, one_line_files, kind):
    max_tokens, seq_len = 4096, 8
    started = time.perf_counter()
    text = prune_data.read_text(
        one_line_files["tiny sentences"],
        max_characters=prune_data.characters_to_read(max_tokens),
    )
    data = prune_data.examples_of_text(
        tokenizers[kind], text, kind=kind, seq_len=seq_len, max_tokens=max_tokens
    )
    seconds = time.perf_counter() - started
    assert data.num_examples == max_tokens // prune_data.TOKENS_PER_EXAMPLE == 256
    assert data.num_tokens <= max_tokens
    unit = "windows" if kind == "decoder" else "sentences"
    assert data.limit == f"at most 256 {unit}: one per 16 tokens of --max-tokens 4096"
    assert len(prune_data.split_sentences(text)) > 4000  # what the text read holds
    print(f"{kind}: {seconds:.2f} s")  # measured in benchmarks, not asserted


def test_a_sentence_is_read_only_as_far_as_seq_len_reaches(tokenizers, one_line_files):
    text = one_line_files["no sentence end"].read_text()[:2_000_000]
    with pytest.raises(UsageError, match=r"1 sentence\(s\) within --max-tokens is too little"):
        prune_data.encoder_sentences(tokenizers["encoder"], text, seq_len=16)
    calls = []
    tokenizer = tokenizers["encoder"]

    class Recording:
        def encode(self, sentence, **kwargs):
            calls.append(len(sentence))
            return tokenizer.encode(sentence, **kwargs)

        def token_to_id(self, token):
            return tokenizer.token_to_id(token)

    data = prune_data.encoder_sentences(Recording(), text + ". One more.", seq_len=16)
    assert data.num_examples == 2 and data.token_ids.shape[1] == 16
    assert calls[0] == 16 * 16  # 2 MB of one sentence: only what 16 tokens can need


@settings(max_examples=8, deadline=None)
@given(
    kind=st.sampled_from(["decoder", "encoder"]),
    max_tokens=st.integers(32, 3000),
    seq_len=st.integers(3, 40),
    words_per_sentence=st.integers(1, 12),
)
def test_examples_never_exceed_the_caps(tokenizers, kind, max_tokens, seq_len, words_per_sentence):
    words = [WORDS[i % 8] for i in range(words_per_sentence)]
    text = ". ".join(" ".join(words) for _ in range(600)) + "."
    data = prune_data.examples_of_text(
        tokenizers[kind], text, kind=kind, seq_len=seq_len, max_tokens=max_tokens
    )
    most = max(2, max_tokens // prune_data.TOKENS_PER_EXAMPLE)
    assert data.num_examples <= most and data.num_tokens <= max_tokens
    available = len(prune_data.split_sentences(text))
    if kind == "encoder" and data.num_examples < min(most, available):
        assert data.limit is None  # stopped by --max-tokens: tokens, not sentences
    if data.limit is not None:
        assert data.num_examples == most
