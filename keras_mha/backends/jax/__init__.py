"""JAX's fast paths: decode steps under `jax.jit` with the caches donated, one XLA program
for blockwise causal attention, the copy-free decode kernels on the CPU
(`keras_mha.backends.INTERFACE` lists what every backend module defines).

- `steps`: the jitted decode step and a layer's decode function;
- `attention`: Keras's fused attention, blockwise causal, the cache kernel's choice;
- `tensors`: tracers, devices, NumPy arrays adopted, `fit`'s variable state.

Example:
    >>> from keras_mha.backends import jax as jax_backend  # doctest: +SKIP
    >>> jax_backend.compiles_decode  # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib

from keras_mha.backends.common import linear as common_linear
from keras_mha.backends.jax import attention, generation, gradients, steps, tensors

compile_decode_step = steps.compile_decode_step
decode_function = steps.decode_function
cache_factory = steps.cache_factory
cache_zeroer = steps.cache_zeroer
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
has_value = tensors.has_value
tensor_from_numpy = tensors.tensor_from_numpy
device_memory = tensors.device_memory
has_accelerator = tensors.has_accelerator
supports_deferred_variables = tensors.supports_deferred_variables
sync_training_state = tensors.sync_training_state

linear = common_linear.matmul_linear  # XLA fuses the bias by itself
tied_logits = common_linear.tied_logits
variable_caches = False  # the caches are donated to the jitted step instead
compiles_decode = True
# RoPE's angles of positions 0 .. T - 1 as constants of the program: XLA folds no sine of
# an iota, and it recomputed the angles inside every fusion that reads them (136 sines in
# a 512-token prefill of 8 layers). torch.compile breaks on NumPy constants, and
# TensorFlow's compiled prefill ran no faster with them (their modules say False).
constant_rope_tables = True
applies_layouts = True  # keras.distribution places variables by a LayoutMap on JAX only
write_cache_buffer = None  # keras.ops.slice_update, in place once XLA has the donation
scatter_into_variable = None  # no variable caches here
no_gradient_tracking = contextlib.nullcontext


def eager_step(layer, inputs, query, cache, start, attention_mask, options):
    return None  # every step is compiled


def layer_call(layer, query, arguments):
    return None  # Keras's `Layer.__call__` (inside a compiled step it costs nothing per step)


def gates_are_ones(layer):
    return False  # the product with the gates stays in the compiled program


def eager_calls():
    return None


_NO_VARIABLES = (
    "`variables=True` (a KV cache of variables written in place) is for TensorFlow; "
    "received it on jax, where variables cannot be updated under jax.jit: pass the "
    "default cache to `jax.jit(step, donate_argnums=...)` and XLA updates it in place."
)


def cache_variables(shape, dtype):
    raise ValueError(_NO_VARIABLES)


def is_variable(buffer):
    return False


def variable_tensor(buffer):
    return buffer


def check_lengths_at_run_time(pairs):
    """Under `jax.jit` every size is static: the layer's own checks saw them."""
