"""The self-attention KV cache: its layout, its checks and its in-place update.

A cache is a `KVCache(key, value)` pair of buffers, each `(batch, num_key_value_heads,
max_length, head_dim)`, or a `QuantizedKVCache(key, value, key_scale, value_scale)` of
int8 / float8 codes and one scale per token and KV head (`kv_quantization.py`), made by
`GroupedQueryAttention.init_cache` and written by the layer at `cache_index`: in place
on PyTorch (outside autograd); by a `dynamic_update_slice` that XLA performs in place
when the step donates the cache on JAX; by a scatter into `tf.Variable`s from
`init_cache(..., variables=True)` on TensorFlow (create them outside the `tf.function`
and keep your handle: a variable returned from a `tf.function` comes back as a copy).
Writing past `max_length` raises a `ValueError` when the index is known when the step
is built; a traced index that overruns leaves the cache unchanged and turns the call's
outputs into NaN. Why this layout and these writes: docs/concepts/attention-paths.md.

Example:
    >>> cache = KVCache.zeros(batch_size=1, num_key_value_heads=2, max_length=8,
    ...                       head_dim=4, dtype="float32")
    >>> tuple(cache.key.shape)
    (1, 2, 8, 4)
    >>> cache = KVCache.variables(1, 2, 8, 4, "float32")  # TensorFlow  # doctest: +SKIP
    >>> cache.in_place  # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
from typing import Any, NamedTuple

import keras
import numpy as np
from keras import ops

from keras_mha import backends

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

    @classmethod
    def variables(cls, batch_size, num_key_value_heads, max_length, head_dim, dtype):
        """A zero cache of two non-trainable `tf.Variable`s, written in place (TensorFlow).

        Raises `ValueError` on other backends (see the module docstring) and
        inside a `tf.function` (create the variables once, outside it).

        Example:
            >>> cache = KVCache.variables(1, 2, 8, 4, "float32")  # doctest: +SKIP
            >>> cache.key.trainable, cache.in_place  # doctest: +SKIP
            (False, True)
        """
        shape = (batch_size, num_key_value_heads, max_length, head_dim)
        return cls(*backends.current().cache_variables(shape, dtype))

    @property
    def max_length(self):
        return self.key.shape[_LENGTH_AXIS]

    @property
    def in_place(self):
        """Whether the buffers are variables that a step updates in place (TensorFlow)."""
        return is_variable(self.key)


class QuantizedKVCache(NamedTuple):
    """An int8 or float8 KV cache: codes `(batch, kv_heads, max_length, head_dim)` and one
    scale per token and KV head `(batch, kv_heads, max_length, 1)`, for keys and values.

    Codes are `int8` for int8, and the bits of float8 e4m3fn as `uint8` for float8 (Keras
    converts every floating tensor a layer receives to its compute dtype, which would
    turn float8 buffers into float copies); the scales are in the layer's compute dtype.
    A pytree / nest of four tensors on every backend, made by `init_cache(batch_size,
    max_length, dtype="int8")`; see `kv_quantization.py`.

    Example:
        >>> cache = QuantizedKVCache.zeros(1, 2, 8, 4, "int8", "float32")
        >>> tuple(cache.key_scale.shape), kv_dtype(cache)
        ((1, 2, 8, 1), 'int8')
    """

    key: Any
    value: Any
    key_scale: Any
    value_scale: Any

    @classmethod
    def zeros(cls, batch_size, num_key_value_heads, max_length, head_dim, dtype, scale_dtype):
        shape = (batch_size, num_key_value_heads, max_length, head_dim)
        scale_shape = (*shape[:3], 1)
        codes = _CODE_DTYPES[dtype]
        return cls(
            ops.zeros(shape, dtype=codes),
            ops.zeros(shape, dtype=codes),
            ops.zeros(scale_shape, dtype=scale_dtype),
            ops.zeros(scale_shape, dtype=scale_dtype),
        )

    @classmethod
    def variables(cls, batch_size, num_key_value_heads, max_length, head_dim, dtype, scale_dtype):
        """The zero cache as four non-trainable `tf.Variable`s (TensorFlow), as `KVCache`'s."""
        shape = (batch_size, num_key_value_heads, max_length, head_dim)
        make = backends.current().cache_variables
        return cls(*make(shape, _CODE_DTYPES[dtype]), *make((*shape[:3], 1), scale_dtype))

    max_length = KVCache.max_length
    in_place = KVCache.in_place


# The buffer dtype of each quantized KV dtype's codes (float8: its bits, see above).
_CODE_DTYPES = {"int8": "int8", "float8_e4m3fn": "uint8"}
_KV_DTYPES = {code: name for name, code in _CODE_DTYPES.items()}


def kv_dtype(cache):
    """The `init_cache` dtype of a cache: `"int8"`, `"float8_e4m3fn"` or its float dtype.

    Example:
        >>> kv_dtype(KVCache.zeros(1, 2, 8, 4, "float32"))
        'float32'
    """
    name = dtype_name(cache[0].dtype)
    return _KV_DTYPES.get(name, name) if isinstance(cache, QuantizedKVCache) else name


def is_variable(buffer):
    """Whether `buffer` is a TensorFlow variable (a cache buffer updated by `assign`)."""
    return backends.current().is_variable(buffer)


def all_in_place(caches):
    """Whether every buffer of `caches` (a `KVCache`, or a list of them) is a variable.

    Example:
        >>> all_in_place([KVCache.zeros(1, 2, 8, 4, "float32")])
        False
    """
    buffers = keras.tree.flatten(caches)
    return bool(buffers) and all(is_variable(buffer) for buffer in buffers)


def _unwrap(buffer):
    """The `tf.Variable` behind a TensorFlow `keras.Variable`, so that it is written in place."""
    return backends.current().variable_tensor(buffer)


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

    def expected():  # formatted for an error only
        return (
            f"the (key, value) pair from `init_cache`, each (batch={batch_size}, "
            f"num_key_value_heads={num_key_value_heads}, max_length, head_dim={head_dim})"
        )

    if not isinstance(cache, (tuple, list)) or len(cache) not in (2, 4):
        raise ValueError(f"`cache` must be {expected()}; received {_describe(cache)}.")
    buffers = [_unwrap(buffer) for buffer in cache]
    if len({is_variable(buffer) for buffer in buffers}) > 1:
        raise ValueError(
            "`cache` buffers must all be variables (`init_cache(..., variables=True)`) or "
            f"all tensors; received {_describe(cache)}."
        )
    if len(buffers) == 4:
        _check_shape(buffers[0], "key", expected, batch_size, num_key_value_heads, head_dim)
        return _as_quantized(cache, buffers, layer_dtype)
    key, value = buffers
    for name, buffer in (("key", key), ("value", value)):
        _check_shape(buffer, name, expected, batch_size, num_key_value_heads, head_dim)
    if tuple(key.shape) != tuple(value.shape):
        raise ValueError(
            f"`cache` key and value buffers must have the same shape; received "
            f"{tuple(key.shape)} and {tuple(value.shape)}."
        )
    for name, buffer in (("key", key), ("value", value)):
        dtype = dtype_name(buffer.dtype)
        if dtype != layer_dtype:
            raise ValueError(
                f"`cache` {name} buffer has dtype {dtype}, but the layer computes in "
                f"{layer_dtype}: the cache must have the layer's floating dtype (it stores "
                f"keys and values); build it with `init_cache(batch_size, max_length)`."
            )
    if isinstance(cache, KVCache) and key is cache.key and value is cache.value:
        return cache
    return KVCache(key, value)


def _as_quantized(cache, buffers, layer_dtype):
    """`as_kv_cache` for a `QuantizedKVCache` (four buffers) whose key buffer was checked."""
    key, value, key_scale, value_scale = buffers
    shape = tuple(key.shape)
    for name, buffer, want in (
        ("value", value, shape),
        ("key_scale", key_scale, (*shape[:3], 1)),
        ("value_scale", value_scale, (*shape[:3], 1)),
    ):
        if tuple(buffer.shape) != want:
            raise ValueError(
                f"`cache` {name} buffer has shape {tuple(buffer.shape)}; the quantized cache "
                f"from `init_cache` has {want} (its key buffer is {shape})."
            )
    codes = {dtype_name(key.dtype), dtype_name(value.dtype)}
    if len(codes) != 1 or not codes <= set(_KV_DTYPES):
        raise ValueError(
            f"`cache` codes have dtypes {sorted(codes)}; a quantized cache from `init_cache` "
            f"holds {' or '.join(sorted(_KV_DTYPES))} codes (int8, float8_e4m3fn)."
        )
    for name, buffer in (("key_scale", key_scale), ("value_scale", value_scale)):
        if dtype_name(buffer.dtype) != layer_dtype:
            raise ValueError(
                f"`cache` {name} buffer has dtype {dtype_name(buffer.dtype)}, but the layer "
                f"computes in {layer_dtype}: build the cache with `init_cache`."
            )
    if isinstance(cache, QuantizedKVCache) and all(
        mine is theirs for mine, theirs in zip(buffers, cache, strict=True)
    ):
        return cache
    return QuantizedKVCache(*buffers)


def _check_shape(buffer, name, expected, batch_size, num_key_value_heads, head_dim):
    shape = tuple(getattr(buffer, "shape", ()))
    if len(shape) != 4 or (
        (shape[1], shape[3]) != (num_key_value_heads, head_dim)
        or shape[0] not in (None, batch_size)
        and batch_size is not None
    ):
        raise ValueError(f"`cache` must be {expected()}; its {name} buffer has shape {shape}.")


def static_index(cache_index):
    """The Python int behind `cache_index`, or None when it is traced / symbolic.

    An eager tensor on the CPU is read; a CUDA tensor is not (reading it back
    would stall the device's queue every step), nor anything under `torch.compile`
    (it would break the graph). In a TensorFlow graph a constant is known when
    the step is traced, so an overrun is refused there rather than NaN at run time.

    Example:
        >>> static_index(np.int64(7)), static_index(None)
        (7, None)
    """
    if cache_index is None or isinstance(cache_index, (int, np.integer)):
        return None if cache_index is None else int(cache_index)
    return backends.current().concrete_index(cache_index)


def read_index(cache_index):
    """The int value of an index tensor, or None for a tracer (`jax.jit`, `tf.function`)."""
    try:
        return int(ops.convert_to_numpy(cache_index))
    except Exception:  # A tracer has no value yet.
        return None


_DTYPE_NAMES = {}  # a backend's dtype object -> Keras's name for it, filled on first use


def dtype_name(dtype):
    """Keras's name of a backend dtype (`torch.float32` -> "float32"), remembered.

    Example:
        >>> dtype_name(np.dtype("float16"))
        'float16'
    """
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = keras.backend.standardize_dtype(dtype)
    return name


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


def _write_buffer(buffer, update, start, static_start, valid):
    """Write `update` `(B, Hkv, T, D)` into `buffer` at length position `start`.

    `valid` is None when `start` is known to be in range; otherwise a boolean
    scalar tensor, and an out-of-range write leaves the buffer unchanged.
    """
    write = backends.current().write_cache_buffer  # PyTorch's, in place
    if write is not None:
        return write(buffer, update, start, static_start, valid)
    index = static_start if static_start is not None else ops.cast(start, "int32")
    if valid is not None:
        index, update = keep_old_when_invalid(buffer, update, index, valid)
    return ops.slice_update(buffer, [0, 0, index, 0], update)


def keep_old_when_invalid(buffer, update, index, valid):
    """`(index, update)` made safe for a write that may overrun (`valid` False).

    Clamp so the write stays inside the buffer, and write the old values back
    when the index was out of range.
    """
    index = ops.clip(index, 0, buffer.shape[_LENGTH_AXIS] - update.shape[_LENGTH_AXIS])
    old = ops.slice(buffer, [0, 0, index, 0], ops.shape(update))
    return index, ops.where(valid, update, old)


# True within `index_checked_by_caller`, which a compiled step enters while it is traced.
_INDEX_CHECKED = [False]


@contextlib.contextmanager
def index_checked_by_caller():
    """Within it, `write` trusts a traced start: its caller checked it, so no overrun guard.

    For a `torch.compile`d decode step whose Python wrapper checked the int index
    (`check_static_write`): the guard's reads and selects would run at every step.
    Entered inside the compiled function, so that Dynamo traces it with the step.
    """
    previous = _INDEX_CHECKED[0]
    _INDEX_CHECKED[0] = True
    try:
        yield
    finally:
        _INDEX_CHECKED[0] = previous


def write(cache, key, value, start, static_start):
    """Write new keys/values `(B, T, Hkv, D)` at `start`; return `(cache, valid)`.

    For a `QuantizedKVCache`, `key` and `value` are `(codes, scale)` pairs from
    `kv_quantization.quantize`, each `(B, T, Hkv, D | 1)`.

    `valid` is None when `static_start` (the Python int behind `start`, or
    None when traced) is known, or within `index_checked_by_caller`; otherwise
    a boolean scalar tensor that is False when the write would overrun and was
    skipped. A variable cache is assigned its new contents and returned as it is
    (the same variables).
    """
    new_parts = (key, value)
    if isinstance(cache, QuantizedKVCache):
        (key, key_scale), (value, value_scale) = key, value
        new_parts = (key, value, key_scale, value_scale)
    max_length = cache.key.shape[_LENGTH_AXIS]
    query_length = key.shape[1]
    valid = None
    if static_start is None:
        start = ops.cast(start, "int32")
        if not _INDEX_CHECKED[0]:
            valid = ops.logical_and(
                ops.greater_equal(start, 0), ops.less_equal(start + query_length, max_length)
            )
    updated = []
    for buffer, new in zip(cache, new_parts, strict=True):
        new = ops.transpose(new, (0, 2, 1, 3))
        if new.dtype != buffer.dtype:
            new = ops.cast(new, buffer.dtype)
        if is_variable(buffer):
            backends.current().scatter_into_variable(buffer, new, start, static_start, valid)
            written = buffer
        else:
            written = _write_buffer(buffer, new, start, static_start, valid)
        updated.append(written)
    if all(mine is theirs for mine, theirs in zip(updated, cache, strict=True)):
        return cache, valid
    return type(cache)(*updated), valid
