"""Syntactic heads: how well each head points from a word to its syntactic head.

The method of Clark et al. (2019, "What Does BERT Look At?", section 4.2): sub-word
attention becomes word-level attention (attention *to* a word is the sum over its
tokens, attention *from* a word the mean over its tokens); each head predicts, for
every word, the other word it attends to most; its accuracy for a dependency relation
is the share of that relation's dependents whose prediction is their syntactic head.
The baseline is the best fixed offset for the relation (always the word `k` positions
away). A head counts as syntactic for a relation when it is the best head for it and
beats that baseline by `SYNTAX_MARGIN` (Voita et al. 2019 use 10 points), over at
least `MIN_RELATION_WORDS` dependents.

The treebank is a CoNLL-U file (Universal Dependencies), parsed with the `conllu`
library. Each sentence's text is rebuilt from its word forms and `SpaceAfter=No`,
tokenised by the model's tokenizer, and every token is given to the word whose
characters it starts in; a multiword token's words share its tokens. Relations are
the universal part of `DEPREL` (`nsubj:pass` counts as `nsubj`); `root` is left out.

Example:
    >>> sentences = read_treebank("examples/data/heads/ewt-sample.conllu")  # doctest: +SKIP
    >>> aligned, skipped = align_treebank(sentences, tokenizer)  # doctest: +SKIP
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from keras_mha.errors import MissingDependencyError, UsageError

#: Accuracy a syntactic head must have above the best fixed-offset baseline.
SYNTAX_MARGIN = 0.10
#: Dependents a relation needs in the treebank before a head can be named for it.
MIN_RELATION_WORDS = 10
_BLOCK = re.compile(r"\n[ \t]*\n")


@dataclass
class TreebankSentence:
    """One sentence: words, 1-based heads (0 = root), relations, the rebuilt text.

    `units[i]` is the surface token (a word, or a multiword token) word `i` belongs to;
    `spans[u]` that unit's characters in `text`.
    """

    words: list
    heads: list
    relations: list
    text: str
    units: list
    spans: list
    line: int


def _parse_block(block, line, argument):
    import conllu

    try:
        parsed = conllu.parse(block)
    except conllu.exceptions.ParseException as error:
        raise UsageError(
            f"{argument}: the sentence at line {line} is not CoNLL-U ({error}); expected 10 "
            "tab-separated columns per word (ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC)",
            key=argument,
        ) from None
    return parsed


def _sentence(tokens, line, argument):
    words, heads, relations, units, spans = [], [], [], [], []
    text, range_end, range_unit = "", 0, None
    for token in tokens:
        identifier = token["id"]
        if isinstance(identifier, tuple) and identifier[1] == ".":
            continue  # an empty node of enhanced dependencies
        if isinstance(identifier, tuple):  # a multiword token: its words share its text
            range_end, range_unit = identifier[2], len(spans)
            spans.append((len(text), len(text) + len(token["form"])))
            text += token["form"] + _space_after(token)
            continue
        head, relation = token.get("head"), token.get("deprel")
        if not isinstance(identifier, int) or not isinstance(head, int) or not relation:
            raise UsageError(
                f"{argument}: the sentence at line {line} has word {token.get('form')!r} with "
                f"ID {identifier!r}, HEAD {head!r}, DEPREL {relation!r}; expected an integer "
                "ID and HEAD and a relation (10 tab-separated CoNLL-U columns)",
                key=argument,
            )
        if identifier <= range_end:
            units.append(range_unit)
        else:
            units.append(len(spans))
            spans.append((len(text), len(text) + len(token["form"])))
            text += token["form"] + _space_after(token)
        words.append(token["form"])
        heads.append(head)
        relations.append(relation.split(":")[0])
    for index, head in enumerate(heads):
        if not 0 <= head <= len(words) or head == index + 1:
            raise UsageError(
                f"{argument}: the sentence at line {line} has word {index + 1} "
                f"({words[index]!r}) with HEAD {head}; expected another word's ID in "
                f"1..{len(words)} or 0 (root)",
                key=argument,
            )
    return TreebankSentence(words, heads, relations, text.rstrip(), units, spans, line)


def _space_after(token):
    misc = token.get("misc") or {}
    return "" if misc.get("SpaceAfter") == "No" else " "


def read_treebank(path, *, argument="--conllu"):
    """The sentences of a CoNLL-U file (sentences of fewer than 2 words are left out).

    Raises:
        MissingDependencyError: the `conllu` package is not installed.
        PathError: the file cannot be read as UTF-8 text.
        UsageError: a sentence does not parse, or holds no sentence with a tree.

    Example:
        >>> len(read_treebank("examples/data/heads/ewt-sample.conllu"))  # doctest: +SKIP
        40
    """
    try:
        import conllu  # noqa: F401
    except ImportError as error:
        raise MissingDependencyError(
            f"{argument} needs the `conllu` package: pip install 'keras-mha[heads]'"
        ) from error
    from keras_mha.data.text import read_text

    text = read_text(path, argument=argument)
    check_not_binary(text, path, argument)
    sentences, line = [], 1
    for block, start in _blocks(text):
        line = start
        for tokens in _parse_block(block, line, argument):
            sentence = _sentence(tokens, line, argument)
            if len(sentence.words) >= 2:
                sentences.append(sentence)
    if not sentences:
        raise UsageError(
            f"{argument}: {str(path)!r} holds no CoNLL-U sentence of 2 words or more; expected "
            "a treebank (10 tab-separated columns per word, sentences separated by blank lines)",
            key=argument,
        )
    return sentences


def _blocks(text):
    """(block, first line number) for each blank-line separated block."""
    position, line = 0, 1
    for match in [*_BLOCK.finditer(text), None]:
        end = match.start() if match else len(text)
        block = text[position:end]
        if block.strip():
            skipped = len(block) - len(block.lstrip("\n"))
            yield block.strip("\n") + "\n", line + block[:skipped].count("\n")
        if match:
            line += text[position : match.end()].count("\n")
            position = match.end()


def check_not_binary(text, path, argument):
    """Refuse text holding NUL or other C0 control bytes (not tab, newline, CR, form feed).

    Example:
        >>> check_not_binary("plain text\\n", "notes.txt", "--text")
    """
    match = re.search(r"[\x00-\x08\x0e-\x1f]", text)
    if match:
        from keras_mha.errors import PathError

        raise PathError(
            f"{argument}: {str(path)!r} looks binary (control byte {match.group()!r} at "
            f"character {match.start()}); expected a plain text file",
            path=str(path),
        )


@dataclass
class AlignedSentence:
    """A treebank sentence tokenised: ids and, per token, its unit (-1: special token)."""

    sentence: TreebankSentence
    token_ids: np.ndarray
    token_units: np.ndarray


def align(sentence, tokenizer):
    """`(AlignedSentence, None)`, or `(None, reason)` when a word gets no token of its own.

    Example:
        >>> aligned, reason = align(sentences[0], tokenizer)  # doctest: +SKIP
    """
    encoding = tokenizer.encode(sentence.text, add_special_tokens=True)
    unit_of_character = np.full(len(sentence.text), -1)
    for unit, (start, stop) in enumerate(sentence.spans):
        unit_of_character[start:stop] = unit
    units = []
    for (start, stop), special in zip(encoding.offsets, encoding.special_tokens_mask, strict=True):
        covered = [
            unit_of_character[c]
            for c in range(start, min(stop, len(sentence.text)))
            if not sentence.text[c].isspace()
        ]
        units.append(-1 if special or not covered else int(covered[0]))
    units = np.array(units)
    missing = sorted(set(range(len(sentence.spans))) - set(units.tolist()))
    if missing:
        start, stop = sentence.spans[missing[0]]
        return None, (
            f"line {sentence.line}: {sentence.text[start:stop]!r} gets no token of its own "
            "from the tokenizer"
        )
    return AlignedSentence(sentence, np.array(encoding.ids, dtype="int32"), units), None


def align_treebank(sentences, tokenizer, *, max_tokens_per_sentence, argument="--conllu"):
    """`(aligned sentences, skipped reasons)`; raises when no sentence fits the tokenizer.

    Raises:
        UsageError: none of the sentences aligns (another language or script than the
            tokenizer's, or every sentence longer than `max_tokens_per_sentence`).
    """
    aligned, skipped = [], []
    for sentence in sentences:
        result, reason = align(sentence, tokenizer)
        if result is not None and len(result.token_ids) > max_tokens_per_sentence:
            result, reason = (
                None,
                (
                    f"line {sentence.line}: {len(result.token_ids)} tokens, over "
                    f"{max_tokens_per_sentence}"
                ),
            )
        if result is None:
            skipped.append(reason)
        else:
            aligned.append(result)
    if not aligned:
        raise UsageError(
            f"{argument}: none of its {len(sentences)} sentences matches the model's tokenizer "
            f"(first: {skipped[0]}); expected a treebank in the model's language and script",
            key=argument,
        )
    return aligned, skipped


def word_attention(attention, token_units, words_units):
    """Word-level attention `(heads, words, words)` from one sentence's `(heads, T, T)` map.

    To a word: the sum over its tokens; from a word: the mean over its tokens.

    Example:
        >>> attention = np.full((1, 3, 3), 1 / 3)  # tokens: [w0, w0, w1]
        >>> word_attention(attention, np.array([0, 0, 1]), [0, 1])[0].round(3).tolist()
        [[0.667, 0.333], [0.667, 0.333]]
    """
    num_units = int(max(words_units)) + 1
    membership = np.zeros((len(token_units), num_units))
    real = token_units >= 0
    membership[np.flatnonzero(real), token_units[real]] = 1.0
    to_units = attention @ membership  # (heads, T, units)
    from_units = (membership / np.maximum(membership.sum(axis=0), 1)).T @ to_units
    units = np.asarray(words_units)
    return from_units[:, units][:, :, units]


@dataclass
class SyntaxAccuracy:
    """Correct predictions per layer, head and relation, accumulated sentence by sentence."""

    layer_heads: list
    correct: dict = field(default_factory=dict)  # relation -> [np.ndarray(heads) per layer]
    words: Counter = field(default_factory=Counter)

    def update(self, layer_index, attention, aligned):
        """Add one sentence's `(heads, T, T)` map of layer `layer_index`."""
        sentence = aligned.sentence
        words = word_attention(attention, aligned.token_units, sentence.units)
        candidates = words.copy()
        diagonal = np.arange(len(sentence.words))
        candidates[:, diagonal, diagonal] = -np.inf
        predicted = candidates.argmax(axis=-1) + 1  # (heads, words), 1-based
        attended = candidates.max(axis=-1) > 0
        for index, (head, relation) in enumerate(
            zip(sentence.heads, sentence.relations, strict=True)
        ):
            if head == 0:
                continue
            per_layer = self.correct.setdefault(relation, [np.zeros(n) for n in self.layer_heads])
            per_layer[layer_index] += (predicted[:, index] == head) & attended[:, index]
            if layer_index == 0:
                self.words[relation] += 1


def fixed_offset_baselines(sentences):
    """`{relation: (offset, accuracy)}`: the best "the head is `offset` words away" rule.

    Ties go to the smaller distance, then to the left.

    Example:
        >>> s = TreebankSentence(["a", "b", "c"], [2, 0, 2], ["det", "root", "obj"], "a b c",
        ...                      [0, 1, 2], [(0, 1), (2, 3), (4, 5)], 1)
        >>> fixed_offset_baselines([s])
        {'det': (1, 1.0), 'obj': (-1, 1.0)}
    """
    offsets, totals = {}, Counter()
    for sentence in sentences:
        for index, (head, relation) in enumerate(
            zip(sentence.heads, sentence.relations, strict=True)
        ):
            if head == 0:
                continue
            offsets.setdefault(relation, Counter())[head - (index + 1)] += 1
            totals[relation] += 1
    return {
        relation: (
            (best := max(counts, key=lambda k, c=counts: (c[k], -abs(k), -k))),
            counts[best] / totals[relation],
        )
        for relation, counts in sorted(offsets.items())
    }


@dataclass
class SyntaxReport:
    """Per relation: dependents, the best head, its accuracy, the baseline; and the winners."""

    accuracy: dict  # relation -> [np.ndarray(heads) per layer]
    words: dict  # relation -> dependents
    baselines: dict  # relation -> (offset, accuracy)
    sentences: int
    skipped: list
    source: str = ""

    @classmethod
    def from_accuracy(cls, counts, aligned, skipped, source=""):
        accuracy = {
            relation: [values / counts.words[relation] for values in per_layer]
            for relation, per_layer in sorted(counts.correct.items())
        }
        baselines = fixed_offset_baselines([a.sentence for a in aligned])
        return cls(accuracy, dict(counts.words), baselines, len(aligned), skipped, source)

    def best(self, relation):
        """`(layer index, head, accuracy)` of the most accurate head for `relation`."""
        scores = self.accuracy[relation]
        layer = max(range(len(scores)), key=lambda i: (scores[i].max(), -i))
        head = int(np.argmax(scores[layer]))
        return layer, head, float(scores[layer][head])

    def is_syntactic(self, relation):
        """Whether the best head beats the baseline by `SYNTAX_MARGIN` on enough words."""
        _, _, accuracy = self.best(relation)
        return (
            self.words[relation] >= MIN_RELATION_WORDS
            and accuracy >= self.baselines[relation][1] + SYNTAX_MARGIN
        )

    def syntactic_heads(self):
        """`{layer index: {head: relation}}`; a head best at several keeps its widest margin."""
        winners = {}
        for relation in self.accuracy:
            if not self.is_syntactic(relation):
                continue
            layer, head, accuracy = self.best(relation)
            margin = accuracy - self.baselines[relation][1]
            if margin > winners.get((layer, head), (-1.0, ""))[0]:
                winners[(layer, head)] = (margin, relation)
        result = {}
        for (layer, head), (_, relation) in sorted(winners.items()):
            result.setdefault(layer, {})[head] = relation
        return result

    def to_dict(self):
        """`{"source", "sentences", "skipped", "relations": {relation: {"words", "best":
        {"layer", "head", "accuracy"}, "baseline": {"offset", "accuracy"}, "syntactic",
        "accuracy": [[per head] per layer]}}}`."""
        relations = {}
        for relation in self.accuracy:
            layer, head, accuracy = self.best(relation)
            offset, baseline = self.baselines[relation]
            relations[relation] = {
                "words": int(self.words[relation]),
                "best": {"layer": layer, "head": head, "accuracy": accuracy},
                "baseline": {"offset": int(offset), "accuracy": float(baseline)},
                "syntactic": self.is_syntactic(relation),
                "accuracy": [[float(v) for v in values] for values in self.accuracy[relation]],
            }
        return {
            "source": self.source,
            "sentences": self.sentences,
            "skipped": list(self.skipped),
            "relations": relations,
        }

    def section(self, layers):
        """The table section `(title, header, rows, notes)` of `HeadRoles.table`."""
        rows = []
        ordered = sorted(self.accuracy, key=lambda r: (-self.words[r], r))
        for relation in ordered:
            layer, head, accuracy = self.best(relation)
            offset, baseline = self.baselines[relation]
            rows.append(
                [
                    relation,
                    str(self.words[relation]),
                    f"L{layer} H{head}",
                    f"{accuracy:.2f}",
                    f"{baseline:.2f} ({offset:+d})",
                    "yes" if self.is_syntactic(relation) else "",
                ]
            )
        notes = [
            f"{self.sentences} sentences of {self.source or 'the treebank'}"
            + (f" ({len(self.skipped)} skipped: {self.skipped[0]})" if self.skipped else ""),
            f"syntactic = best head beats the best fixed offset by {SYNTAX_MARGIN:.2f} over "
            f"at least {MIN_RELATION_WORDS} dependents",
        ]
        header = ["relation", "words", "best head", "accuracy", "baseline (offset)", "syn"]
        return ("syntactic heads (dependent -> its head)", header, rows, notes)


__all__ = [
    "MIN_RELATION_WORDS",
    "SYNTAX_MARGIN",
    "AlignedSentence",
    "SyntaxAccuracy",
    "SyntaxReport",
    "TreebankSentence",
    "align",
    "align_treebank",
    "check_not_binary",
    "fixed_offset_baselines",
    "read_treebank",
    "word_attention",
]
