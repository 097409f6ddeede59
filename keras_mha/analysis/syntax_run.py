"""Running a model over a treebank's sentences to score each head's syntax (`syntax`).

Example:
    >>> report = treebank_accuracy(model, layers, "ewt-sample.conllu", tokenizer,
    ...                            batch_size=8, seq_len=128)  # doctest: +SKIP
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


def treebank_accuracy(model, layers, path, tokenizer, *, batch_size, seq_len, argument="--conllu"):
    """A `SyntaxReport` of every head of `layers` on the CoNLL-U file at `path`.

    Sentences of more than `seq_len` tokens are skipped (and listed in the report).
    """
    from keras_mha.analysis.data import TokenData
    from keras_mha.analysis.run import model_inputs, run_model, takes_padding_mask
    from keras_mha.layers.attention_probe import record_attention

    sentences = read_treebank(path, argument=argument)
    aligned, skipped = align_treebank(
        sentences, tokenizer, max_tokens_per_sentence=seq_len, argument=argument
    )
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
    return SyntaxReport.from_accuracy(counts, aligned, skipped, source=Path(path).name)


__all__ = ["treebank_accuracy"]
