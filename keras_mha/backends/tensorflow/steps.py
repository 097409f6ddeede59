"""TensorFlow's decode step: `tf.function(jit_compile=True)` over variable caches.

Variable caches (`init_cache(..., variables=True)`) are assigned in place by the step and
kept out of the function's outputs: a variable returned from a `tf.function` comes back
as a copy.

Example:
    >>> step = compile_decode_step(layer, forward)  # doctest: +SKIP
    >>> outputs, caches = step(token, None, caches, 7)  # doctest: +SKIP
"""

from __future__ import annotations

import tensorflow as tf

from keras_mha.backends import steps
from keras_mha.backends.common import kv_cache


def compile_decode_step(
    owner,
    forward,
    *,
    static_index=False,
    compile_torch=False,
    jit_compile=True,
    eager_forward=None,
    on_trace=None,
    guard_tensors_only=False,
    one_signature=False,
):
    """`forward` under `tf.function` (XLA unless `jit_compile=False`)."""
    traced = steps.traced(forward, static_index, on_trace or (lambda: None))

    def function(inputs, mask, caches, index):
        outputs, new_caches = traced(inputs, mask, caches, index)
        # Variable caches were written in place: returned, they would be copied out.
        return outputs, () if kv_cache.all_in_place(caches) else new_caches

    compiled = tf.function(function, jit_compile=jit_compile, reduce_retracing=False)

    def step(inputs, mask, caches, index):
        mask = None if mask is None else tf.convert_to_tensor(mask)
        index = tf.constant(index, tf.int32) if steps.is_int(index) else index
        outputs, new_caches = compiled(tf.convert_to_tensor(inputs), mask, caches, index)
        return outputs, caches if kv_cache.all_in_place(caches) else new_caches

    return step


def decode_function(layer, *, compile_torch=False, jit_compile=True):
    """`GroupedQueryAttention.make_decode_function` on TensorFlow: a compiled prefill and
    step."""
    return steps.layer_decode_function(
        layer, compile_decode_step, compile_torch=compile_torch, jit_compile=jit_compile
    )
