"""`head_roles`: run a model over data, accumulate every head's statistics, classify them.

The model runs eagerly, batch by batch, inside `record_attention`; each layer's
probabilities go straight into its `HeadStatistics` and are dropped, so no attention
map outlives its layer's call. Peak memory beyond the model's own forward pass: one
layer's map as float32 on the host, `batch * heads * T * T * 4` bytes, plus masks and
float64 temporaries of one head at a time, about `4 * batch * T * T * 8` bytes (batch 8,
12 heads, T = 128: 6 MiB, and 3.7 MiB measured by tracemalloc). The fused attention
kernels are off while recording, so each layer's forward pass also holds its logits and
probabilities on the device, as `return_attention_scores=True` does.

Example:
    >>> from keras_mha.models import from_pretrained
    >>> model = from_pretrained("path/to/all-MiniLM-L6-v2")  # doctest: +SKIP
    >>> result = head_roles(model, open("text.txt").read())  # doctest: +SKIP
    >>> result.roles["blocks_0/attention"][:3]  # doctest: +SKIP
    ['broad', 'previous-token', 'mixed']
"""

from __future__ import annotations

import numpy as np

from keras_mha import backends
from keras_mha.analysis.calls import model_inputs, run_model, takes_padding_mask
from keras_mha.analysis.data import checkpoint_tokenizer, is_causal, model_tokenizer, token_data
from keras_mha.analysis.result import HeadRoles
from keras_mha.analysis.roles import LayerRoles, assign_roles
from keras_mha.analysis.statistics import HeadStatistics
from keras_mha.data import DEFAULT_BATCH_SIZE, DEFAULT_MAX_TOKENS, DEFAULT_SEQ_LEN
from keras_mha.errors import UsageError


def _check_positive(name, value, allow_none=False):
    if allow_none and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        expected = "a positive integer" + (" or None" if allow_none else "")
        raise UsageError(f"`{name}` must be {expected}; received {value!r}", key=name)
    return int(value)


def head_roles(
    model,
    data,
    *,
    tokenizer=None,
    batch_size=DEFAULT_BATCH_SIZE,
    max_tokens=DEFAULT_MAX_TOKENS,
    seq_len=DEFAULT_SEQ_LEN,
    special_ids=None,
    delimiter_ids=None,
    treebank=None,
    importance=None,
    importance_method=None,
    progress=False,
    name=None,
):
    """Statistics and a role for every head of every keras-mha attention layer of `model`.

    Args:
        model: from `keras_mha.models.from_pretrained`, or any built Keras model of
            keras-mha attention layers (called eagerly on each batch).
        data: text (a `str`, read with `tokenizer`), or token ids:
            `{"token_ids", "padding_mask"}` arrays, an `(N, T)` array, `(x, y)`, or an
            iterable of such batches (see `keras_mha.analysis.data`).
        tokenizer: a `tokenizers.Tokenizer`, a `tokenizer.json` path or its folder;
            None uses the checkpoint's own (`from_pretrained` models). Needed for text
            and a treebank; with token ids it names the special and punctuation tokens.
        batch_size: sequences per forward pass.
        max_tokens: read at most this many real tokens (None: all).
        seq_len: tokens per decoder window / at most per encoder sentence.
        special_ids: override the tokenizer's special-token ids (with token ids and no
            tokenizer, the only source of them).
        delimiter_ids: override the tokenizer's punctuation ids, likewise.
        treebank: a CoNLL-U file path (or `syntax.TreebankSentence`s), for syntactic heads
            (`keras_mha.analysis.syntax`); read and tokenised before the model runs.
        importance: `{path: scores}` from `keras_mha.pruning.head_importance`, to
            report which roles survive 25% / 50% pruning; `importance_method` names it.
        progress: draw a progress bar on stderr (True), never (False), or only on a
            terminal (None).
        name: the model's name in the report (default `model.name`).

    Returns:
        A `HeadRoles`.

    Raises:
        ValueError: `model` has no keras-mha attention layer, or it is not built.
        UsageError: bad data, arguments, or a treebank that does not match the tokenizer.

    Example:
        >>> result = head_roles(model, {"token_ids": ids, "padding_mask": mask})  # doctest: +SKIP
        >>> result.to_dict()["role_counts"]  # doctest: +SKIP
        {'previous-token': 2, 'first-token': 9, 'broad': 13, 'mixed': 48}
    """
    from keras_mha.analysis.recording import record_attention
    from keras_mha.progress import ProgressBar
    from keras_mha.pruning.discovery import require_attention_layers

    layers = require_attention_layers(model)
    batch_size = _check_positive("batch_size", batch_size)
    max_tokens = _check_positive("max_tokens", max_tokens, allow_none=True)
    seq_len = _check_positive("seq_len", seq_len)
    causal = is_causal(layers)
    if isinstance(data, str) or treebank is not None or tokenizer is not None:
        tokenizer = model_tokenizer(model, tokenizer)
    else:
        tokenizer = checkpoint_tokenizer(model)  # names special and punctuation ids, if any
    treebank_data = None
    if treebank is not None:
        from keras_mha.analysis.syntax_run import prepare_treebank

        treebank_data = prepare_treebank(treebank, tokenizer, seq_len=seq_len)
    prepared = token_data(
        model_inputs(model),
        data,
        tokenizer=tokenizer,
        causal=causal,
        batch_size=batch_size,
        max_tokens=max_tokens,
        seq_len=seq_len,
        special_ids=special_ids,
        delimiter_ids=delimiter_ids,
        pads=takes_padding_mask(model),
    )
    statistics = {
        path: HeadStatistics(
            layer.num_heads, causal=layer.causal, sliding_window=layer.sliding_window
        )
        for path, layer in layers.items()
    }
    current = {}

    def on_attention(path, probabilities):
        index = current["batch"]
        statistics[path].update(
            probabilities,
            padding_mask=prepared.padding_masks[index],
            token_ids=prepared.token_ids[index],
            special_ids=prepared.special_ids,
            delimiter_ids=prepared.delimiter_ids,
            token_counts=prepared.token_counts,
        )

    with (
        ProgressBar(
            total=len(prepared.inputs),
            unit="batches",
            total_tokens=prepared.num_tokens,
            label="recording attention",
            enabled=progress,
        ) as bar,
        record_attention(model, on_attention),
    ):
        run_model(model, prepared, lambda i: current.update(batch=i), bar)

    syntax = None
    if treebank_data is not None:
        from keras_mha.analysis.syntax_run import treebank_accuracy

        syntax = treebank_accuracy(model, layers, treebank_data, batch_size=batch_size)
    winners = syntax.syntactic_heads() if syntax is not None else {}
    layer_roles = []
    for index, stats in enumerate(statistics.values()):
        means = stats.means()
        layer_roles.append(
            LayerRoles(means, assign_roles(means, winners.get(index)), stats.queries)
        )
    result = HeadRoles(
        layers=list(layers),
        layer_roles=layer_roles,
        model=name or getattr(model, "name", type(model).__name__),
        architecture="decoder" if causal else "encoder",
        backend=backends.name(),
        tokens=prepared.num_tokens,
        sequences=prepared.num_sequences,
        syntax=syntax,
    )
    if importance is not None:
        from keras_mha.analysis.survival import roles_surviving

        result.survival = roles_surviving(model, result.roles, importance)
        result.importance = {path: np.asarray(importance[path]) for path in layers}
        result.importance_method = importance_method
    return result


__all__ = ["DEFAULT_BATCH_SIZE", "DEFAULT_MAX_TOKENS", "DEFAULT_SEQ_LEN", "head_roles"]
