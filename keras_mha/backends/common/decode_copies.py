"""Copies of weights that a decode path keeps in the layout it streams fastest.

A one-token decode step reads every weight once, so a weight laid out the way the
product streams slower costs the whole step. A tied LM head is the largest such weight:
the embedding table is `(V, D)`, and XLA's CPU dot streams one row against it
(contracting the table's last axis) at about two thirds of its rate against a `(D, V)`
matrix (docs/benchmarks.md). A backend that keeps a `(D, V)` copy (`HeadCopy`; the
compiled loops of JAX and TensorFlow on the CPU) puts it in scope around the program it
traces (`streamed_head`), and `DecoderModel.logits` reads it there.

Copies cost memory beside the model's own weights, so a backend makes them only while
they fit in `DECODE_COPY_BYTES`, and makes them again whenever the weight changes: a
stale copy would give wrong tokens without a sign.

Example:
    >>> import numpy as np
    >>> with streamed_head(np.zeros((4, 7))):
    ...     current_head().shape
    (4, 7)
    >>> current_head() is None
    True
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import weakref

import numpy as np

#: The most bytes of weight copies a decode path keeps for one model.
DECODE_COPY_BYTES = 256 << 20

_HEAD = contextvars.ContextVar("keras_mha_streamed_head", default=None)


@contextlib.contextmanager
def streamed_head(head):
    """Within the block, a tied LM head reads `head` `(D, V)` (the table's transpose), or
    the table itself when `head` is None."""
    token = _HEAD.set(head)
    try:
        yield
    finally:
        _HEAD.reset(token)


def current_head():
    """The `(D, V)` head in scope (`streamed_head`), or None."""
    return _HEAD.get()


class HeadCopy:
    """A tied table's `(D, V)` copy, made again when the table changes.

    A backend subclass says how: `_read(variable)` gives the table's current value as
    a token that tells whether it changed (`_unchanged(token, earlier)`), and
    `_transpose(token)` makes the copy. `head_copy(model, Subclass)` gives the copy that
    serves `model`, if one does.
    """

    def __init__(self, embedding):
        self.embedding = embedding
        self.made = 0  # copies made so far
        self._source = None
        self._copy = None

    def table(self):
        """The copy of the table's current value."""
        source = self._read(self.embedding.embeddings)
        if self._source is None or not self._unchanged(source, self._source):
            self._source = self._copy = None  # the old copy's memory first
            self._copy = self._transpose(source)
            self._source = source
            self.made += 1
        return self._copy

    def _read(self, variable):
        raise NotImplementedError

    def _unchanged(self, source, earlier):
        raise NotImplementedError

    def _transpose(self, source):
        raise NotImplementedError


_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def head_copy(model, kind):
    """`model`'s `kind` (a `HeadCopy` subclass; one per model), or None where no copy
    serves: an untied head, a quantized or LoRA table (not one array), or a table over
    `DECODE_COPY_BYTES`."""
    if getattr(model, "lm_head", True) is not None:
        return None
    embedding = model.token_embedding
    if embedding.quantization_mode is not None or embedding.lora_enabled:
        return None
    table = embedding.embeddings
    if math.prod(table.shape) * np.dtype(table.dtype).itemsize > DECODE_COPY_BYTES:
        return None
    copy = _COPIES.get(model)
    if not isinstance(copy, kind) or copy.embedding is not embedding:
        copy = _COPIES[model] = kind(embedding)
    return copy


def kept_head_copy(model):
    """The `HeadCopy` kept for `model`, if a loop has made one."""
    return _COPIES.get(model)


__all__ = [
    "DECODE_COPY_BYTES",
    "HeadCopy",
    "current_head",
    "head_copy",
    "kept_head_copy",
    "streamed_head",
]
