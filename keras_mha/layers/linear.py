"""`inputs @ kernel + bias`, as each backend computes it fastest.

Eager PyTorch adds the bias inside the matmul (`torch.addmm`) instead of in a second
pass over the output; TensorFlow computes a single row as two (XLA's CPU compiler emits
a one-row product with a reshaped kernel variable as a naive loop, 5x slower); JAX's
XLA fuses the bias by itself. Measurements: docs/concepts/attention-paths.md.

Example:
    >>> tuple(linear(ops.ones((2, 3, 4)), ops.ones((4, 5)), ops.zeros((5,))).shape)
    (2, 3, 5)
"""

from __future__ import annotations

import math

import keras
from keras import ops


def linear(inputs, kernel, bias=None):
    """`inputs (..., features) @ kernel (features, units) [+ bias (units,)]`.

    `kernel` and `bias` may be Keras variables (read in the layer's compute
    dtype under mixed precision, as `ops.matmul` would read them).

    Example:
        >>> tuple(linear(ops.ones((2, 3, 4)), ops.ones((4, 5)), ops.zeros((5,))).shape)
        (2, 3, 5)
    """
    backend = keras.backend.backend()
    if backend == "tensorflow" and _is_one_row(inputs):
        return _one_row(inputs, kernel, bias)
    if bias is None or backend != "torch":
        outputs = ops.matmul(inputs, kernel)
        return outputs if bias is None else outputs + bias

    inputs, kernel, bias = (ops.convert_to_tensor(t) for t in (inputs, kernel, bias))
    if not (inputs.dtype == kernel.dtype == bias.dtype) or inputs.ndim < 2:
        # Mixed dtypes follow Keras's type promotion in ops.matmul.
        return ops.matmul(inputs, kernel) + bias
    return torch_linear(inputs, kernel, bias)


def _is_one_row(inputs):
    leading = inputs.shape[:-1]
    return all(isinstance(d, int) for d in leading) and math.prod(leading) == 1


def _one_row(inputs, kernel, bias):
    """The single row of `inputs` times `kernel`, computed as two rows (see above)."""
    row = ops.reshape(inputs, (1, inputs.shape[-1]))
    outputs = ops.matmul(ops.concatenate([row, ops.zeros_like(row)], axis=0), kernel)[:1]
    if bias is not None:
        outputs = outputs + bias
    return ops.reshape(outputs, (*inputs.shape[:-1], kernel.shape[-1]))


def torch_linear(inputs, kernel, bias):
    """`linear` on torch tensors of one dtype, as one `torch.addmm` (no Keras dispatch).

    Example:
        >>> import torch
        >>> tuple(torch_linear(torch.ones(2, 3, 4), torch.ones(4, 5), torch.zeros(5)).shape)
        (2, 3, 5)
    """
    if inputs.ndim == 2:  # Already rows: no reshape and view dispatched.
        return bias.addmm(inputs, kernel)
    flat = inputs.reshape(-1, inputs.shape[-1])
    return bias.addmm(flat, kernel).view(*inputs.shape[:-1], kernel.shape[-1])
