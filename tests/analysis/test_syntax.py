"""Syntactic heads (Clark et al. 2019's word-level method) on the shipped EWT sample.

A head is planted that attends, from every word's tokens, to the tokens of its
syntactic head in the real treebank, tokenised by the real all-MiniLM-L6-v2
tokenizer (so sub-words, punctuation and `[CLS]`/`[SEP]` are as in use): its accuracy
must be 1 for every relation, and it must win each relation whose fixed-offset baseline
leaves room. The baseline, the word-level conversion and the CoNLL-U refusals are
checked against hand-worked values. NumPy only.
"""

from pathlib import Path

import numpy as np
import pytest

from keras_mha.analysis.syntax import (
    MIN_RELATION_WORDS,
    SYNTAX_MARGIN,
    SyntaxAccuracy,
    SyntaxReport,
    align_treebank,
    fixed_offset_baselines,
    read_treebank,
    word_attention,
)
from keras_mha.errors import PathError, UsageError
from tests.cards.test_rebuild_minilm import minilm_directory

pytestmark = pytest.mark.backend_independent

TREEBANK = Path(__file__).parents[2] / "examples" / "data" / "heads" / "ewt-sample.conllu"


@pytest.fixture(scope="module")
def tokenizer():
    from keras_mha.data.text import load_tokenizer

    return load_tokenizer(minilm_directory())


def test_the_shipped_treebank_reads_whole():
    sentences = read_treebank(TREEBANK)
    assert len(sentences) == 27 and sum(len(s.words) for s in sentences) == 265
    first = sentences[0]
    assert first.text == "Waterproof clothing and footwear are essential plus an umbrella.."
    assert first.heads[:3] == [2, 6, 4] and first.relations[:3] == ["amod", "nsubj", "cc"]
    # "He's": a multiword token whose two words share its characters.
    second = sentences[1]
    assert second.words[:2] == ["He", "'s"] and second.units[:2] == [0, 0]


def test_word_attention_sums_to_a_word_and_averages_from_it():
    attention = np.array([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8], [0.0, 1.0, 0.0]]])
    words = word_attention(attention, np.array([0, 0, 1]), [0, 1])
    # from word 0 = mean of token rows 0 and 1; to word 0 = sum of columns 0 and 1
    np.testing.assert_allclose(words[0], [[(0.75 + 0.2) / 2, (0.25 + 0.8) / 2], [1.0, 0.0]])


def test_fixed_offset_baselines_pick_the_commonest_offset():
    baselines = fixed_offset_baselines(read_treebank(TREEBANK))
    # det: "an umbrella", "some muscle atrophy" (+2), ...: the noun is mostly next.
    offset, accuracy = baselines["det"]
    assert offset == 1 and 0.5 < accuracy < 1.0
    assert "root" not in baselines


def test_a_planted_syntactic_head_is_perfect_and_wins_where_the_baseline_leaves_room(tokenizer):
    aligned, skipped = align_treebank(
        read_treebank(TREEBANK), tokenizer, max_tokens_per_sentence=128
    )
    assert not skipped and len(aligned) == 27
    counts = SyntaxAccuracy([2])
    for item in aligned:
        sentence, units = item.sentence, item.token_units
        length = len(item.token_ids)
        oracle = np.full((length, length), 1.0 / length)  # head 1: uniform
        planted = np.zeros((length, length))
        for token, unit in enumerate(units):
            words = [w for w, u in enumerate(sentence.units) if u == unit]
            target = sentence.heads[words[0]] if words else 0
            if unit < 0 or target == 0:
                planted[token, token] = 1.0
            else:
                keys = np.flatnonzero(units == sentence.units[target - 1])
                planted[token, keys] = 1.0 / len(keys)
        counts.update(0, np.stack([planted, oracle]), item)
    report = SyntaxReport.from_accuracy(counts, aligned, [], source="ewt-sample.conllu")
    for relation, per_layer in report.accuracy.items():
        # Multiword tokens share one unit, so their words' own arcs are not observable.
        if relation not in ("aux", "nsubj", "cop", "expl"):
            assert per_layer[0][0] == pytest.approx(1.0), relation
    winners = report.syntactic_heads()
    for relation in report.accuracy:
        if report.is_syntactic(relation):
            assert report.best(relation)[:2] == (0, 0)
    expected = {
        r
        for r, (_, baseline) in report.baselines.items()
        if report.words[r] >= MIN_RELATION_WORDS and report.best(r)[2] >= baseline + SYNTAX_MARGIN
    }
    assert expected and winners == {0: {0: winners[0][0]}} and winners[0][0] in expected
    assert set(report.to_dict()["relations"]) == set(report.accuracy)


@pytest.mark.parametrize(
    "content, error, message",
    [
        ("just some text\nwith lines\n", UsageError, r"line 1 is not CoNLL-U"),
        ("1\tThe\tthe\tDET\t_\t_\tx\tdet\t_\t_\n", UsageError, r"line 1 is not CoNLL-U"),
        ("1\tA\ta\tDET\n2\tB\tb\tNOUN\n", UsageError, r"HEAD None, DEPREL None"),
        ("1\tA\ta\tX\t_\t_\t5\tdep\t_\t_\n2\tB\tb\tX\t_\t_\t0\troot\t_\t_\n", UsageError, "HEAD 5"),
        ("", UsageError, "holds no CoNLL-U sentence"),
        ("1\tA\x00", PathError, "looks binary"),
    ],
)
def test_a_file_that_is_not_a_treebank_gets_one_line(tmp_path, content, error, message):
    path = tmp_path / "bad.conllu"
    path.write_text(content)
    with pytest.raises(error, match=message) as caught:
        read_treebank(path)
    assert "\n" not in str(caught.value) and "--conllu" in str(caught.value)


def test_a_treebank_the_tokenizer_cannot_read_is_refused(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    # A BPE without an unknown token drops characters it never saw: Greek words vanish.
    english = Tokenizer(models.BPE())
    english.pre_tokenizer = pre_tokenizers.Whitespace()
    english.train_from_iterator(["the cat sat on the mat"], trainers.BpeTrainer(vocab_size=60))
    path = tmp_path / "greek.conllu"
    path.write_text(
        "1\tγάτα\t_\tNOUN\t_\t_\t2\tnsubj\t_\t_\n2\tκάθεται\t_\tVERB\t_\t_\t0\troot\t_\t_\n"
    )
    with pytest.raises(UsageError, match=r"none of its 1 sentences matches the model's tokenizer"):
        align_treebank(read_treebank(path), english, max_tokens_per_sentence=128)
