"""Running a model over a treebank's sentences to score each head's syntax (`syntax`).

Example:
    >>> prepared = prepare_treebank("ewt-sample.conllu", tokenizer, seq_len=128)  # doctest: +SKIP
    >>> report = treebank_accuracy(model, layers, prepared, batch_size=8)  # doctest: +SKIP
    >>> report.best("det")  # doctest: +SKIP
    (3, 7, 0.95)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from keras_mha.analysis.syntax import (
    SyntaxAccuracy,
    SyntaxReport,
    align_treebank,
    read_treebank,
)


def prepare_treebank(treebank, tokenizer, *, seq_len, argument="--conllu"):
    """`(aligned sentences, skipped reasons, source name)` of a CoNLL-U path or of
    `TreebankSentence`s, tokenised; raises before any model runs when nothing aligns."""
    if isinstance(treebank, (str, Path)):
        sentences, source = read_treebank(treebank, argument=argument), Path(treebank).name
    else:
        sentences, source = list(treebank), "the treebank"
    aligned, skipped = align_treebank(
        sentences, tokenizer, max_tokens_per_sentence=seq_len, argument=argument
    )
    return aligned, skipped, source


def treebank_accuracy(model, layers, prepared, *, batch_size):
    """A `SyntaxReport` of every head of `layers` on `prepared` (from `prepare_treebank`)."""
    from keras_mha.analysis.calls import model_inputs, run_model, takes_padding_mask
    from keras_mha.analysis.data import TokenData
    from keras_mha.analysis.recording import record_attention

    aligned, skipped, source = prepared
    if not takes_padding_mask(model):
        batch_size = 1  # the model would see the padding
    to_inputs = model_inputs(model)
    groups, inputs, masks = [], [], []
    for start in range(0, len(aligned), batch_size):
        group = aligned[start : start + batch_size]
        length = max(len(item.token_ids) for item in group)
        ids = np.zeros((len(group), length), dtype="int32")
        mask = np.zeros((len(group), length), dtype=bool)
        for row, item in enumerate(group):
            ids[row, : len(item.token_ids)] = item.token_ids
            mask[row, : len(item.token_ids)] = True
        groups.append(group)
        inputs.append(to_inputs(ids, mask))
        masks.append(mask)
    data = TokenData(inputs=inputs, token_ids=[], padding_masks=masks)
    counts = SyntaxAccuracy([layer.num_heads for layer in layers.values()])
    index_of = {path: index for index, path in enumerate(layers)}
    current = {}

    def on_attention(path, probabilities):
        for row, item in enumerate(groups[current["batch"]]):
            length = len(item.token_ids)
            attention = probabilities[row, :, :length, :length].astype("float64")
            counts.update(index_of[path], attention, item)

    with record_attention(model, on_attention):
        run_model(model, data, lambda i: current.update(batch=i))
    return SyntaxReport.from_accuracy(counts, aligned, skipped, source=source)


__all__ = ["prepare_treebank", "treebank_accuracy"]
