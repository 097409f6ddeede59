"""TensorFlow on the CPU: a tied LM head kept as a `(D, V)` copy for the compiled loop.

XLA's one-row product streams a `(D, V)` matrix about 1.3 times as fast as the tied
table `(V, D)` on TensorFlow (docs/benchmarks.md, "The tied head's layout on JAX").
A TensorFlow variable changes in place, so the copy keeps a read of the table beside it:
a read value never changes (TensorFlow's tensors are immutable), so any later write
(an assignment, a scatter, an optimizer step, compiled or not) puts the variable in
another buffer, and the copy is made again when the table's buffer is no longer the
read's. The read holds the table's old buffer until then: at most one more table.

Example:
    >>> copy = head_copy(model)  # doctest: +SKIP
    >>> copy.table().shape  # doctest: +SKIP
    TensorShape([64, 1000])
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from keras_mha.backends.common import decode_copies


def _address(tensor):
    """The address of a CPU tensor's buffer (DLPack shares it without a copy)."""
    return np.from_dlpack(tensor).__array_interface__["data"][0]


class TensorFlowHeadCopy(decode_copies.HeadCopy):
    """A read of the table is its token: a write moves the table to another buffer."""

    def _read(self, variable):
        return variable.value.read_value()  # keras.Variable -> tf.Variable -> a read

    def _unchanged(self, source, earlier):
        return _address(source) == _address(earlier)

    def _transpose(self, source):
        return tf.transpose(source)


def head_copy(model):
    """`model`'s `TensorFlowHeadCopy`, or None where it does not serve (see
    `decode_copies.head_copy`; and beside a GPU, where it was not measured)."""
    if tf.config.list_logical_devices("GPU"):
        return None
    return decode_copies.head_copy(model, TensorFlowHeadCopy)


__all__ = ["TensorFlowHeadCopy", "head_copy"]
