"""The token batches heads are classified on, and what the statistics need to know of them.

Data comes as `head_importance` and `keras-mha prune --data` take it:

- text (a `str`) with the model's tokenizer: encoders read it as sentences, each
  `[CLS] ... [SEP]`, padded per batch; decoders as windows of `seq_len` tokens of the
  running text, each starting with the tokenizer's BOS if it has one
  (`keras_mha.data.text`);
- token ids: `{"token_ids": (N, T), "padding_mask": (N, T)}`, a bare `(N, T)` array,
  an `(x, y)` tuple (the labels are ignored), or an iterable of such batches
  (`keras_mha.pruning.batches.Batches`).

Besides the batches, the statistics need the ids of the special tokens, of punctuation
(`delimiter_ids`) and how often each token occurs in the data (`token_counts`).

Example:
    >>> data = token_data(model, "One sentence. Another one.", tokenizer=tokenizer,
    ...                   batch_size=8, max_tokens=1000, seq_len=64)  # doctest: +SKIP
    >>> data.num_tokens  # doctest: +SKIP
    12
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from keras_mha.errors import UsageError


@dataclass
class TokenData:
    """Batches `[{"token_ids", "padding_mask"} or the caller's own inputs]` and their tokens.

    Attributes:
        inputs: what the model is called with, one entry per batch.
        token_ids, padding_masks: NumPy `(batch, T)` per batch.
        special_ids, delimiter_ids: sets of ids (empty when unknown).
        token_counts: `{id: occurrences among the real, non-special tokens}`.
        tokenizer: the `tokenizers.Tokenizer` used, if any (to show tokens).
    """

    inputs: list
    token_ids: list
    padding_masks: list
    special_ids: set = field(default_factory=set)
    delimiter_ids: set = field(default_factory=set)
    token_counts: dict = field(default_factory=dict)
    tokenizer: object = None

    @property
    def num_tokens(self):
        return int(sum(mask.sum() for mask in self.padding_masks))

    @property
    def num_sequences(self):
        return int(sum(len(mask) for mask in self.padding_masks))

    def batch_tokens(self):
        return [int(mask.sum()) for mask in self.padding_masks]


def is_causal(layers):
    """Whether the model reads text left to right (any causal attention layer)."""
    return any(layer.causal or layer.sliding_window is not None for layer in layers.values())


def model_tokenizer(model, tokenizer, argument="tokenizer"):
    """`tokenizer` (a `tokenizers.Tokenizer`, a tokenizer.json or its folder), or the model's own.

    Raises:
        UsageError: no tokenizer given and the model was not loaded from a folder with one.
    """
    from keras_mha.data.text import TOKENIZER_FILE_NAME, load_tokenizer

    if tokenizer is not None and not isinstance(tokenizer, (str, Path)):
        return tokenizer
    if tokenizer is None:
        directory = getattr(model, "source_directory", None)
        if directory is None:
            raise UsageError(
                f"`{argument}` is None and the model carries no checkpoint folder to read a "
                f"{TOKENIZER_FILE_NAME} from; pass the tokenizer (a tokenizers.Tokenizer or "
                "the path of a tokenizer.json) to read text",
                key=argument,
            )
        return load_tokenizer(directory, **_reading_text(argument))
    path = Path(tokenizer)
    folder = path.parent if path.name == TOKENIZER_FILE_NAME else path
    return load_tokenizer(folder, argument=argument, **_reading_text(argument))


def _reading_text(argument: str) -> dict:
    """How `load_tokenizer`'s errors name what it reads: `heads --text`, or `head_roles`'s
    `data` (the flag or argument that names the tokenizer tells which)."""
    if argument.startswith("--"):
        return {"reads": "--text", "extra": "heads", "instead": f"pass {argument} FILE"}
    return {"reads": "data", "extra": "heads", "instead": f"pass {argument}="}


def checkpoint_tokenizer(model):
    """The tokenizer beside the checkpoint `model` was loaded from, or None (no error).

    Example:
        >>> checkpoint_tokenizer(keras.Sequential()) is None  # doctest: +SKIP
        True
    """
    from keras_mha.data.text import TOKENIZER_FILE_NAME, load_tokenizer

    directory = getattr(model, "source_directory", None)
    if directory is None or not (Path(directory) / TOKENIZER_FILE_NAME).is_file():
        return None
    try:
        return load_tokenizer(directory)
    except (ImportError, ValueError):
        return None  # tokenizers missing or an unreadable file: the ids go without names


def special_token_ids(tokenizer):
    """Ids of the tokenizer's special tokens ([CLS], [SEP], [PAD], BOS, EOS, ...).

    Example:
        >>> sorted(special_token_ids(tokenizer))  # doctest: +SKIP
        [0, 100, 101, 102, 103]
    """
    return {int(i) for i, token in tokenizer.get_added_tokens_decoder().items() if token.special}


def is_punctuation(text):
    """Whether `text` (one decoded token) is punctuation only (Unicode category P*).

    Example:
        >>> is_punctuation(" ,"), is_punctuation("--"), is_punctuation("a.")
        (True, True, False)
    """
    text = text.strip()
    if text.startswith("##"):  # WordPiece continuation marker
        text = text[2:]
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


def delimiter_token_ids(tokenizer, token_ids):
    """Ids among `token_ids` whose token decodes to punctuation only."""
    return {
        int(i)
        for i in np.unique(np.concatenate([np.ravel(ids) for ids in token_ids]))
        if is_punctuation(tokenizer.decode([int(i)], skip_special_tokens=False))
    }


def count_tokens(token_ids, padding_masks, special_ids):
    """`{id: occurrences}` over real, non-special tokens of every batch."""
    counts = Counter()
    for ids, mask in zip(token_ids, padding_masks, strict=True):
        real = np.asarray(ids)[np.asarray(mask, dtype=bool)]
        counts.update(int(i) for i in real if int(i) not in special_ids)
    return dict(counts)


def text_batches(
    tokenizer, text, *, causal, batch_size, max_tokens, seq_len, pads=True, argument="data"
):
    """`[(token_ids, padding_mask)]` of `text`: sentences for encoders, `seq_len` windows for
    decoders. Without `pads` (a model that takes no padding mask) every encoder batch is
    one sentence, unpadded."""
    from keras_mha.data import text as text_data

    if not text.strip():
        raise UsageError(
            f"{argument}: the text is empty; expected plain text to run the model on",
            key=argument,
        )
    if causal:
        ids = text_data.decoder_windows(
            tokenizer, text, seq_len, max_tokens, argument=argument
        ).inputs
        masks = np.ones_like(ids, dtype=bool)
        bounds = [(s, s + batch_size) for s in range(0, len(ids), batch_size)]
        return [(ids[a:b], masks[a:b]) for a, b in bounds]
    sentences = text_data.encoder_sentences(
        tokenizer, text, seq_len, max_tokens, argument=argument, min_sentences=1
    )
    if not pads:
        lengths = sentences.padding_mask.sum(axis=1)
        return [
            (sentences.token_ids[i : i + 1, :n], sentences.padding_mask[i : i + 1, :n])
            for i, n in enumerate(lengths)
        ]
    batches = []
    for start in range(0, sentences.num_examples, batch_size):
        inputs = sentences.inputs(start, start + batch_size)
        batches.append((inputs["token_ids"], inputs["padding_mask"]))
    return batches


def _ids_and_mask(x, argument):
    if isinstance(x, dict):
        if "token_ids" not in x:
            raise UsageError(
                f"`{argument}` batches are dicts without 'token_ids' (keys {sorted(x)}); "
                "expected {'token_ids', 'padding_mask'}",
                key=argument,
            )
        ids = np.asarray(x["token_ids"])
        mask = x.get("padding_mask")
    else:
        ids, mask = np.asarray(x), None
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise UsageError(
            f"`{argument}` token ids have shape {ids.shape} and dtype {ids.dtype}; expected "
            "integers of shape (batch, length)",
            key=argument,
        )
    mask = np.ones(ids.shape, dtype=bool) if mask is None else np.asarray(mask).astype(bool)
    if mask.shape != ids.shape:
        raise UsageError(
            f"`{argument}` padding_mask has shape {mask.shape}; expected {ids.shape}",
            key=argument,
        )
    return ids, mask


def token_data(
    model_inputs_from_ids,
    data,
    *,
    tokenizer,
    causal,
    batch_size,
    max_tokens,
    seq_len,
    special_ids=None,
    delimiter_ids=None,
    pads=True,
    argument="data",
):
    """A `TokenData` from text (with `tokenizer`) or token-id batches.

    Args:
        model_inputs_from_ids: `(token_ids, padding_mask) -> model inputs`, for text.
        data: text or token ids, see the module docstring.
        tokenizer: a `tokenizers.Tokenizer` or None (then token ids are needed, and
            special / punctuation tokens are known only from `special_ids` /
            `delimiter_ids`).
        causal: the model is a decoder (text is cut into windows, not sentences).
        batch_size, max_tokens, seq_len: as in `head_roles`.
        pads: the model takes a padding mask (else text is fed unpadded, see
            `text_batches`).
    """
    from keras_mha.pruning.batches import Batches

    if isinstance(data, str):
        if tokenizer is None:
            raise UsageError(
                f"`{argument}` is text but no tokenizer is known; pass tokenizer=",
                key=argument,
            )
        pairs = text_batches(
            tokenizer,
            data,
            causal=causal,
            batch_size=batch_size,
            max_tokens=max_tokens,
            seq_len=seq_len,
            pads=pads,
            argument=argument,
        )
        inputs = [model_inputs_from_ids(ids, mask) for ids, mask in pairs]
    else:
        try:
            batches = Batches(data, batch_size=batch_size, argument=argument)
        except ValueError as error:
            raise UsageError(str(error), key=argument) from None
        pairs, inputs, total = [], [], 0
        for x, _, _ in batches:
            if max_tokens is not None and total >= max_tokens:
                break
            ids, mask = _ids_and_mask(x, argument)
            pairs.append((ids, mask))
            inputs.append(x)
            total += int(mask.sum())
    ids = [pair[0] for pair in pairs]
    masks = [pair[1] for pair in pairs]
    if tokenizer is not None:
        special = special_token_ids(tokenizer) if special_ids is None else set(special_ids)
        delimiters = (
            delimiter_token_ids(tokenizer, ids) if delimiter_ids is None else set(delimiter_ids)
        )
    else:
        special, delimiters = set(special_ids or ()), set(delimiter_ids or ())
    return TokenData(
        inputs=inputs,
        token_ids=ids,
        padding_masks=masks,
        special_ids=special,
        delimiter_ids=delimiters - special,
        token_counts=count_tokens(ids, masks, special),
        tokenizer=tokenizer,
    )


__all__ = [
    "TokenData",
    "checkpoint_tokenizer",
    "count_tokens",
    "delimiter_token_ids",
    "is_causal",
    "is_punctuation",
    "model_tokenizer",
    "special_token_ids",
    "text_batches",
    "token_data",
]
