"""Copies of weights that a decode path keeps in the layout it streams fastest.

A one-token decode step reads every weight once, so a weight laid out the way the
product streams slower costs the whole step. A tied LM head is the largest such weight:
the embedding table is `(V, D)`, and XLA's CPU dot streams one row against it
(contracting the table's last axis) at about two thirds of its rate against a `(D, V)`
matrix (docs/benchmarks.md). A backend that keeps a `(D, V)` copy puts it in scope
around the program it traces (`streamed_head`; JAX's compiled loop on the CPU,
`keras_mha.backends.jax.head_copy`), and `DecoderModel.logits` reads it there.

Copies cost memory beside the model's own weights, so a backend makes them only while
they fit in `DECODE_COPY_BYTES`.

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


__all__ = ["DECODE_COPY_BYTES", "current_head", "streamed_head"]
