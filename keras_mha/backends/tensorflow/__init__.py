"""TensorFlow's fast paths: decode steps under `tf.function(jit_compile=True)` over KV
caches of variables written by a scatter, the flat matmuls that read them in place,
blockwise causal attention (`keras_mha.backends.INTERFACE` lists what every backend
module defines).

- `steps`: the compiled decode step and a layer's decode function;
- `attention`: Keras's fused attention for MHA, the grouped einsum, the cache kernel;
- `tensors`: variable caches, one-row products, graph assertions, devices.

Example:
    >>> from keras_mha.backends import tensorflow as tf_backend  # doctest: +SKIP
    >>> tf_backend.variable_caches  # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib

from keras_mha.backends.tensorflow import attention, generation, gradients, steps, tensors

compile_decode_step = steps.compile_decode_step
decode_function = steps.decode_function
compile_generation_loop = generation.compile_loop
generation = None  # the whole loop is compiled: no on-device loop of steps


def decode_paths(model):
    """`generate`'s decode paths, the default first: the whole loop as one program."""
    return ("loop", "per_token")


fused_attention = attention.fused_attention
reads_cache_prefix_cheaply = attention.reads_cache_prefix_cheaply
prefers_blockwise_causal = attention.prefers_blockwise_causal
blockwise_causal_attention = attention.blockwise_causal_attention
cache_kernel = attention.cache_kernel

gate_loss = gradients.gate_loss
gate_loss_and_gradients = gradients.gate_loss_and_gradients

concrete_index = tensors.concrete_index
cache_variables = tensors.cache_variables
is_variable = tensors.is_variable
variable_tensor = tensors.variable_tensor
scatter_into_variable = tensors.scatter_into_variable
linear = tensors.linear
tied_logits = tensors.tied_logits
check_lengths_at_run_time = tensors.check_lengths_at_run_time
has_value = tensors.has_value
tensor_from_numpy = tensors.tensor_from_numpy
device_memory = tensors.device_memory
has_accelerator = tensors.has_accelerator

variable_caches = True  # a tf.function cannot donate its tensor arguments
compiles_decode = True
constant_rope_tables = False
applies_layouts = False
write_cache_buffer = None  # keras.ops.slice_update (variable caches: a scatter)
no_gradient_tracking = contextlib.nullcontext


def eager_step(layer, inputs, query, cache, start, attention_mask, options):
    return None  # every step is compiled


def layer_call(layer, query, arguments):
    return None  # Keras's `Layer.__call__` (inside a compiled step it costs nothing per step)


def gates_are_ones(layer):
    return False  # the product with the gates stays in the compiled program


def eager_calls():
    return None


def cache_factory(make_caches):
    return make_caches


def cache_zeroer(caches):
    """One `tf.function` that zeroes every cache variable: eager, one assign a buffer,
    it took 4.2 ms of a call at `bench roofline --scale 4` (0.6 ms as one call)."""
    import keras
    import tensorflow as tf

    buffers = keras.tree.flatten(caches)

    @tf.function
    def zero():
        for buffer in buffers:
            buffer.assign(tf.zeros(buffer.shape, buffer.dtype))

    return zero


def supports_deferred_variables():
    return True


def sync_training_state(model):
    """Variables are current during `fit` on TensorFlow."""
