"""PyTorch's tensors and devices: cache writes in place, one-call linear layers, the
cache index's value, NumPy arrays adopted without a copy, the device's memory.

Example:
    >>> tuple(linear(torch.ones(2, 3, 4), torch.ones(4, 5), torch.zeros(5)).shape)
    (2, 3, 5)
"""

from __future__ import annotations

import keras
import numpy as np
import torch
from keras import ops

from keras_mha.backends.common import kv_cache

_LENGTH_AXIS = 2


def concrete_index(cache_index):
    """The int behind a cache index tensor, or None: nothing under `torch.compile` (it would
    break the graph), nor a CUDA tensor (reading it back would stall the device's queue
    every step)."""
    if torch.compiler.is_compiling():
        return None
    if isinstance(cache_index, torch.Tensor) and cache_index.device.type != "cpu":
        return None
    return kv_cache.read_index(cache_index)


def _in_place_allowed(buffer, update):
    return not (torch.is_grad_enabled() and (update.requires_grad or buffer.requires_grad))


def write_cache_buffer(buffer, update, start, static_start, valid):
    """Write `update` `(B, Hkv, T, D)` into `buffer` at length position `start`, in place
    outside autograd (see `kv_cache.write`)."""
    length = update.shape[_LENGTH_AXIS]
    if static_start is not None:
        if _in_place_allowed(buffer, update):
            buffer[:, :, static_start : static_start + length] = update
            return buffer
        return torch.cat(
            [buffer[:, :, :static_start], update, buffer[:, :, static_start + length :]],
            dim=_LENGTH_AXIS,
        )
    start = torch.as_tensor(start, device=buffer.device)
    positions = start + torch.arange(length, device=buffer.device)
    if valid is not None:
        # Clamp so the write stays inside the buffer, and write the old values back
        # when the index was out of range.
        positions = positions.clamp(0, buffer.shape[_LENGTH_AXIS] - 1)
        old = buffer.index_select(_LENGTH_AXIS, positions)
        update = torch.where(valid, update, old)
    if _in_place_allowed(buffer, update):
        return buffer.index_copy_(_LENGTH_AXIS, positions, update)
    return buffer.index_copy(_LENGTH_AXIS, positions, update)


def linear(inputs, kernel, bias=None):
    """`inputs @ kernel + bias` as one `torch.addmm` where the dtypes agree (no Keras
    dispatch); else as `keras.ops` (`common.linear.matmul_linear`)."""
    if bias is None:
        return ops.matmul(inputs, kernel)
    inputs, kernel, bias = (ops.convert_to_tensor(t) for t in (inputs, kernel, bias))
    if not (inputs.dtype == kernel.dtype == bias.dtype) or inputs.ndim < 2:
        # Mixed dtypes follow Keras's type promotion in ops.matmul.
        return ops.matmul(inputs, kernel) + bias
    return torch_linear(inputs, kernel, bias)


def torch_linear(inputs, kernel, bias):
    """`linear` on torch tensors of one dtype, as one `torch.addmm` (no Keras dispatch).

    Example:
        >>> tuple(torch_linear(torch.ones(2, 3, 4), torch.ones(4, 5), torch.zeros(5)).shape)
        (2, 3, 5)
    """
    if inputs.ndim == 2:  # Already rows: no reshape and view dispatched.
        return bias.addmm(inputs, kernel)
    flat = inputs.reshape(-1, inputs.shape[-1])
    return bias.addmm(flat, kernel).view(*inputs.shape[:-1], kernel.shape[-1])


def rows_linear(rows, matrix, bias):
    """`rows` `(N, features)` times `matrix` `(features, units)`, plus `bias` (or None) in
    one `addmm`: the eager decode steps' linear layer on plain torch tensors.

    Example:
        >>> tuple(rows_linear(torch.ones(2, 4), torch.ones(4, 5), None).shape)
        (2, 5)
    """
    return rows @ matrix if bias is None else bias.reshape(-1).addmm(rows, matrix)


def has_value(tensor):
    """Whether `tensor` holds values now: not while `torch.compile` traces."""
    return not torch.compiler.is_compiling()


def tensor_from_numpy(array):
    """A tensor sharing `array`'s memory (`models.deferred.backend_tensor`)."""
    if array.dtype.kind not in "fiub":  # ml_dtypes' bfloat16: same bits, torch's type
        if array.dtype.name == "bfloat16":
            return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        return keras.ops.convert_to_tensor(array)
    return torch.from_numpy(array)


def has_accelerator():
    return torch.cuda.is_available()


def device_memory(host_memory):
    """`(bytes, description)` of the memory this backend computes in."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory, "the GPU"
    return host_memory()


def no_gradient_tracking():
    return torch.no_grad()
