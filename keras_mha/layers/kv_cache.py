"""The self-attention KV cache: its layout, its checks and its in-place update.

A cache is a `KVCache(key, value)` pair of buffers, each
`(batch, num_key_value_heads, max_length, head_dim)`:

- two buffers, not one stacked tensor, so that attention reads each of them
  as it lies in memory (slicing K and V back out of a stacked
  `(batch, 2, ...)` tensor made XLA copy them every step);
- heads first, so that each KV head's keys are contiguous: the layout the
  fused kernels (`torch.nn.functional.scaled_dot_product_attention`) and a
  batched grouped matmul read without a transpose.

A decode step writes its new keys and values in place where the backend
allows it: slice assignment / `index_copy_` on PyTorch (outside autograd),
`dynamic_update_slice` on JAX and TensorFlow, which XLA performs in place
when the cache buffers are donated (`jax.jit(..., donate_argnums=...)`).

Writing past `max_length` is refused with a `ValueError` whenever the index
is known when the step is built (a Python int, an eager tensor, or any index
under eager PyTorch on CPU). A traced index that overruns (inside `jax.jit`,
`tf.function` or `torch.compile`, or a CUDA tensor in eager PyTorch, which is
not read back to keep the step asynchronous) leaves the cache unchanged and
turns every output row of that call into NaN, so the overrun cannot pass for
a good result.

Example:
    >>> cache = KVCache.zeros(batch_size=1, num_key_value_heads=2, max_length=8,
    ...                       head_dim=4, dtype="float32")
    >>> tuple(cache.key.shape)
    (1, 2, 8, 4)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import keras
from keras import ops

_LENGTH_AXIS = 2


class KVCache(NamedTuple):
    """Keys and values of every cached position, each `(batch, kv_heads, max_length, head_dim)`.

    A NamedTuple, hence a pytree / nest on every backend: it passes through
    `jax.jit` (donate it with `donate_argnums`), `tf.function` and
    `torch.compile` as two tensors. Treat it as opaque: build it with
    `GroupedQueryAttention.init_cache` and hand back what the layer returns.
    To map a function over both buffers use `keras.tree.map_structure`.
    """

    key: Any
    value: Any

    @classmethod
    def zeros(cls, batch_size, num_key_value_heads, max_length, head_dim, dtype):
        shape = (batch_size, num_key_value_heads, max_length, head_dim)
        return cls(ops.zeros(shape, dtype=dtype), ops.zeros(shape, dtype=dtype))

    @property
    def max_length(self):
        return self.key.shape[_LENGTH_AXIS]


def _describe(cache):
    if isinstance(cache, (tuple, list)):
        parts = ", ".join(
            f"{type(part).__name__} {tuple(getattr(part, 'shape', ()))}" for part in cache
        )
        return f"a {type(cache).__name__} of {len(cache)} ({parts})"
    return f"{type(cache).__name__} of shape {tuple(getattr(cache, 'shape', ()))}"


def as_kv_cache(cache, *, batch_size, num_key_value_heads, head_dim, layer_dtype):
    """Check `cache` against the layer and the call; return it as a `KVCache`.

    Raises `ValueError` naming what was received and what the layer expects:
    not a (key, value) pair (e.g. the stacked tensor of keras-mha 0.1), a
    buffer of another rank, shape, batch, KV-head count or head size, or a
    dtype other than the layer's compute dtype (an integer cache would
    truncate K/V; Keras already converts floating arguments to that dtype).
    """
    expected = (
        f"the (key, value) pair from `init_cache`, each (batch={batch_size}, "
        f"num_key_value_heads={num_key_value_heads}, max_length, head_dim={head_dim})"
    )
    if not isinstance(cache, (tuple, list)) or len(cache) != 2:
        raise ValueError(f"`cache` must be {expected}; received {_describe(cache)}.")
    key, value = cache
    for name, buffer in (("key", key), ("value", value)):
        shape = tuple(getattr(buffer, "shape", ()))
        if len(shape) != 4 or (
            (shape[1], shape[3]) != (num_key_value_heads, head_dim)
            or shape[0] not in (None, batch_size)
            and batch_size is not None
        ):
            raise ValueError(f"`cache` must be {expected}; its {name} buffer has shape {shape}.")
    if tuple(key.shape) != tuple(value.shape):
        raise ValueError(
            f"`cache` key and value buffers must have the same shape; received "
            f"{tuple(key.shape)} and {tuple(value.shape)}."
        )
    for name, buffer in (("key", key), ("value", value)):
        dtype = keras.backend.standardize_dtype(buffer.dtype)
        if dtype != layer_dtype:
            raise ValueError(
                f"`cache` {name} buffer has dtype {dtype}, but the layer computes in "
                f"{layer_dtype}: the cache must have the layer's floating dtype (it stores "
                f"keys and values); build it with `init_cache(batch_size, max_length)`."
            )
    return cache if isinstance(cache, KVCache) else KVCache(key, value)


def check_static_write(start, query_length, max_length):
    """Raise when writing `query_length` tokens at a known `start` overruns the cache."""
    if query_length is not None and max_length is not None and query_length > max_length:
        raise ValueError(
            f"The query has {query_length} tokens but the cache holds only max_length="
            f"{max_length}; allocate a longer cache with `init_cache(batch_size, max_length)`."
        )
    if start is None or query_length is None or max_length is None:
        return
    if start < 0 or start + query_length > max_length:
        raise ValueError(
            f"Writing {query_length} token(s) at `cache_index`={start} overruns the "
            f"cache: its max_length is {max_length}. Allocate a longer cache with "
            "`init_cache(batch_size, max_length)`."
        )


def _torch_in_place_allowed(buffer, update):
    import torch

    return not (torch.is_grad_enabled() and (update.requires_grad or buffer.requires_grad))


def _write_buffer(buffer, update, start, static_start, valid):
    """Write `update` `(B, Hkv, T, D)` into `buffer` at length position `start`.

    `valid` is None when `start` is known to be in range; otherwise a boolean
    scalar tensor, and an out-of-range write leaves the buffer unchanged.
    """
    length = update.shape[_LENGTH_AXIS]
    if keras.backend.backend() == "torch":
        import torch

        if static_start is not None:
            if _torch_in_place_allowed(buffer, update):
                buffer[:, :, static_start : static_start + length] = update
                return buffer
            return torch.cat(
                [
                    buffer[:, :, :static_start],
                    update,
                    buffer[:, :, static_start + length :],
                ],
                dim=_LENGTH_AXIS,
            )
        start = torch.as_tensor(start, device=buffer.device)
        positions = start + torch.arange(length, device=buffer.device)
        if valid is not None:
            # Clamp so the write stays inside the buffer, and write the old
            # values back when the index was out of range.
            positions = positions.clamp(0, buffer.shape[_LENGTH_AXIS] - 1)
            old = buffer.index_select(_LENGTH_AXIS, positions)
            update = torch.where(valid, update, old)
        if _torch_in_place_allowed(buffer, update):
            return buffer.index_copy_(_LENGTH_AXIS, positions, update)
        return buffer.index_copy(_LENGTH_AXIS, positions, update)
    index = static_start if static_start is not None else ops.cast(start, "int32")
    if valid is not None:
        # Clamp so the write stays inside the buffer, and write the old values
        # back when the index was out of range.
        index = ops.clip(index, 0, buffer.shape[_LENGTH_AXIS] - length)
        old = ops.slice(buffer, [0, 0, index, 0], ops.shape(update))
        update = ops.where(valid, update, old)
    return ops.slice_update(buffer, [0, 0, index, 0], update)


def write(cache, key, value, start, static_start):
    """Write new keys/values `(B, T, Hkv, D)` at `start`; return `(cache, valid)`.

    `valid` is None when `static_start` (the Python int behind `start`, or
    None when traced) is known; otherwise a boolean scalar tensor that is
    False when the write would overrun and was skipped.
    """
    max_length = cache.key.shape[_LENGTH_AXIS]
    query_length = key.shape[1]
    valid = None
    if static_start is None:
        start = ops.cast(start, "int32")
        valid = ops.logical_and(
            ops.greater_equal(start, 0), ops.less_equal(start + query_length, max_length)
        )
    updated = []
    for buffer, new in ((cache.key, key), (cache.value, value)):
        new = ops.transpose(new, (0, 2, 1, 3))
        if new.dtype != buffer.dtype:
            new = ops.cast(new, buffer.dtype)
        updated.append(_write_buffer(buffer, new, start, static_start, valid))
    return KVCache(*updated), valid
