"""TensorFlow's tensors and devices: KV caches of variables written by a scatter, one-row
products, run-time shape assertions in graphs, NumPy arrays adopted without a copy.

Example:
    >>> cache = cache_variables((1, 2, 8, 4), "float32")  # doctest: +SKIP
    >>> is_variable(cache[0])  # doctest: +SKIP
    True
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf
from keras import ops

from keras_mha.backends.common import kv_cache
from keras_mha.backends.common.linear import matmul_linear


def concrete_index(cache_index):
    """The int behind a cache index: in a graph, a constant known when the step is traced
    (so an overrun is refused there rather than NaN at run time)."""
    if tf.is_tensor(cache_index) and not tf.executing_eagerly():
        static = tf.get_static_value(cache_index)
        return None if static is None else int(static)
    return kv_cache.read_index(cache_index)


def cache_variables(shape, dtype):
    """Key and value buffers as two non-trainable `tf.Variable`s, written in place."""
    if not tf.executing_eagerly():
        raise ValueError(
            "`variables=True` creates tf.Variables, which a tf.function cannot create at "
            "every call: build the cache once, outside the traced function, and pass it in."
        )
    return tuple(
        tf.Variable(tf.zeros(shape, dtype), trainable=False, name=f"kv_cache_{part}")
        for part in ("key", "value")
    )


def is_variable(buffer):
    """Whether `buffer` is a TensorFlow variable (a cache buffer updated by `assign`)."""
    return isinstance(buffer, tf.Variable)


def variable_tensor(buffer):
    """The `tf.Variable` behind a `keras.Variable`, so that it is written in place."""
    return buffer.value if isinstance(buffer, keras.Variable) else buffer


def scatter_into_variable(variable, update, start, static_start, valid):
    """Write `update` `(B, Hkv, T, D)` into a variable at `start`, in place.

    A scatter, not a dynamic-update-slice: XLA's CPU compiler rewrites a
    reshape of a dynamic-update-slice (the batched matmuls of the attention
    read the cache as `(B * Hkv, S, D)`) into a second update of a copy of
    the cache, so that each step copied the whole cache three times; a
    scatter stays one in-place write and the matmuls read the variable's own
    buffer (checked on the compiled HLO in tests/layers/test_cache.py).
    """
    batch, heads, length, _ = update.shape
    batch = tf.shape(update)[0] if batch is None else batch
    if static_start is not None:
        index = tf.constant(static_start, tf.int32)
    else:
        index = tf.cast(start, tf.int32)
    if valid is not None:
        index, update = kv_cache.keep_old_when_invalid(variable, update, index, valid)
    # (B, Hkv, T, 3) indices [b, h, index + t] of each updated row.
    grid = tf.meshgrid(tf.range(batch), tf.range(heads), index + tf.range(length), indexing="ij")
    variable.scatter_nd_update(tf.stack(grid, axis=-1), update)


def linear(inputs, kernel, bias=None):
    """A single row as two: XLA's CPU compiler emits a one-row product with a reshaped
    kernel variable as a naive loop, 5x slower."""
    leading = inputs.shape[:-1]
    if not (all(isinstance(d, int) for d in leading) and math.prod(leading) == 1):
        return matmul_linear(inputs, kernel, bias)
    row = ops.reshape(inputs, (1, inputs.shape[-1]))
    outputs = ops.matmul(ops.concatenate([row, ops.zeros_like(row)], axis=0), kernel)[:1]
    if bias is not None:
        outputs = outputs + bias
    return ops.reshape(outputs, (*inputs.shape[:-1], kernel.shape[-1]))


def tied_logits(hidden, table):
    """`common.linear.tied_logits` as one 2-D product with the table transposed inside
    it (`transpose_b`): XLA's CPU compiler fused `einsum`'s batched product with an
    explicit transpose of the table into an elementwise loop (16% slower at 32000 x 512).

    Example:
        >>> tuple(tied_logits(ops.ones((2, 3, 4)), ops.ones((7, 4))).shape)
        (2, 3, 7)
    """
    batch, length, width = (hidden.shape[0], hidden.shape[1], hidden.shape[2])
    batch = tf.shape(hidden)[0] if batch is None else batch
    length = tf.shape(hidden)[1] if length is None else length
    rows = tf.reshape(hidden, (-1, width))
    logits = tf.matmul(rows, tf.convert_to_tensor(table), transpose_b=True)
    return tf.reshape(logits, (batch, length, -1))


def check_lengths_at_run_time(pairs):
    """In a graph, assert that each `(first, a, second, b, axis)` pair's sizes agree when it
    runs (`validation.check_call_inputs`); eagerly every size is known already."""
    if tf.executing_eagerly():
        return
    for first, a, second, b, axis in pairs:
        what = "batch size" if axis == 0 else "length"
        tf.debugging.assert_equal(
            tf.shape(a)[axis],
            tf.shape(b)[axis],
            message=f"`{first}` and `{second}` must have the same {what}",
        )


def has_value(tensor):
    """Whether tensors hold values now: eager execution, not a `tf.function` graph."""
    return tf.executing_eagerly()


def tensor_from_numpy(array):
    """A tensor sharing `array`'s memory through DLPack where it can."""
    if array.dtype.kind in "fiu":  # DLPack has no bfloat16 / float8 from NumPy
        return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
    return tf.convert_to_tensor(array)


def has_accelerator():
    return bool(tf.config.list_physical_devices("GPU"))


def device_memory(host_memory):
    """`(bytes, description)` of the memory this backend computes in, None on a GPU
    (TensorFlow does not say how much it may take)."""
    if tf.config.list_physical_devices("GPU"):
        return None
    return host_memory()
