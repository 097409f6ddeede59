"""JAX on the CPU: a tied LM head kept as a `(D, V)` copy for the compiled decode loop.

XLA's CPU dot streams one row against a `(D, V)` matrix about 1.5 times as fast as
against the tied table `(V, D)` (docs/benchmarks.md, "The tied head's layout on JAX"),
and the head is a large part of a small model's step. The copy is made on first use and
again whenever the embedding variable holds another array: JAX arrays never change in
place, so assigning, training or pruning the table replaces it
(`keras_mha.backends.common.decode_copies` has the rules that every backend shares).

Example:
    >>> copy = head_copy(model)  # doctest: +SKIP
    >>> copy.table().shape  # doctest: +SKIP
    (64, 1000)
"""

from __future__ import annotations

import jax

from keras_mha.backends.common import decode_copies

_transpose = jax.jit(jax.numpy.transpose)


class JaxHeadCopy(decode_copies.HeadCopy):
    """The table's array is its own token: a change replaces it."""

    def _read(self, variable):
        return variable.value

    def _unchanged(self, source, earlier):
        return source is earlier

    def _transpose(self, source):
        return _transpose(source)


def head_copy(model):
    """`model`'s `JaxHeadCopy`, or None where it does not serve (see
    `decode_copies.head_copy`; and off the CPU, where it was not measured)."""
    if jax.default_backend() != "cpu":
        return None
    return decode_copies.head_copy(model, JaxHeadCopy)


__all__ = ["JaxHeadCopy", "head_copy"]
