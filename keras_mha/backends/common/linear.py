"""`inputs @ kernel + bias`, as each backend computes it fastest.

Eager PyTorch adds the bias inside the matmul (`torch.addmm`) instead of in a second
pass over the output; TensorFlow computes a single row as two (XLA's CPU compiler emits
a one-row product with a reshaped kernel variable as a naive loop, 5x slower); JAX's
XLA fuses the bias by itself (each backend's `linear`, in `keras_mha/backends/`).
Measurements: docs/concepts/attention-paths.md.

Example:
    >>> tuple(linear(ops.ones((2, 3, 4)), ops.ones((4, 5)), ops.zeros((5,))).shape)
    (2, 3, 5)
"""

from __future__ import annotations

from keras import ops

from keras_mha import backends


def linear(inputs, kernel, bias=None):
    """`inputs (..., features) @ kernel (features, units) [+ bias (units,)]`.

    `kernel` and `bias` may be Keras variables (read in the layer's compute
    dtype under mixed precision, as `ops.matmul` would read them).

    Example:
        >>> tuple(linear(ops.ones((2, 3, 4)), ops.ones((4, 5)), ops.zeros((5,))).shape)
        (2, 3, 5)
    """
    return backends.current().linear(inputs, kernel, bias)


def tied_logits(hidden, table):
    """`hidden (B, T, D)` against a tied embedding `table (V, D)`: `(B, T, V)` logits.

    Contracts the table's own last axis: under XLA a transposed table became an
    elementwise loop fused into the head (6% of a JAX decode step at scale 4).

    Example:
        >>> tuple(tied_logits(ops.ones((2, 3, 4)), ops.ones((7, 4))).shape)
        (2, 3, 7)
    """
    return ops.einsum("btd,vd->btv", hidden, table)


def matmul_linear(inputs, kernel, bias=None):
    """`linear` as `keras.ops`: a matmul, then the bias (what XLA fuses by itself).

    Example:
        >>> tuple(matmul_linear(ops.ones((2, 3, 4)), ops.ones((4, 5))).shape)
        (2, 3, 5)
    """
    outputs = ops.matmul(inputs, kernel)
    return outputs if bias is None else outputs + bias
