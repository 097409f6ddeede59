"""JAX on the CPU: a tied LM head kept as a `(D, V)` copy for the compiled decode loop.

XLA's CPU dot streams one row against a `(D, V)` matrix about 1.5 times as fast as
against the tied table `(V, D)` (docs/benchmarks.md, "The tied head's layout on JAX"),
and the head is a large part of a small model's step. `HeadCopy.table()` makes the copy
on first use and again whenever the embedding variable holds another array (JAX arrays
never change in place: assigning, training or pruning the table replaces it). The copy
is made only on the CPU, for a float table within `decode_copies.DECODE_COPY_BYTES`.

Example:
    >>> copy = head_copy(model)  # doctest: +SKIP
    >>> copy.table().shape  # doctest: +SKIP
    (64, 1000)
"""

from __future__ import annotations

import weakref

import jax

from keras_mha.backends.common import decode_copies

_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_transpose = jax.jit(jax.numpy.transpose)


class HeadCopy:
    """The `(D, V)` transpose of `embedding`'s table, remade when the table changes."""

    def __init__(self, embedding):
        self.embedding = embedding
        self._source = None
        self._copy = None

    def table(self):
        """The copy of the table's current value."""
        source = self.embedding.embeddings.value
        if source is not self._source:
            self._copy = None  # the old copy's memory first
            self._copy = _transpose(source)
            self._source = source
        return self._copy


def head_copy(model):
    """`model`'s `HeadCopy` (one per model), or None where the copy does not serve: an
    untied head, a quantized or LoRA table (not one array), a table over the budget, or
    not the CPU."""
    if jax.default_backend() != "cpu" or getattr(model, "lm_head", True) is not None:
        return None
    embedding = model.token_embedding
    if embedding.quantization_mode is not None or embedding.lora_enabled:
        return None
    table = embedding.embeddings
    size = jax.numpy.dtype(table.dtype).itemsize
    for length in table.shape:
        size *= length
    if size > decode_copies.DECODE_COPY_BYTES:
        return None
    copy = _COPIES.get(model)
    if copy is None or copy.embedding is not embedding:
        copy = _COPIES[model] = HeadCopy(embedding)
    return copy


__all__ = ["HeadCopy", "head_copy"]
