"""PyTorch's fast paths: the eager decode step in torch ops, `torch.compile`d steps, SDPA
without repeating K/V, in-place cache writes (`keras_mha.backends.INTERFACE` lists what
every backend module defines).

- `eager_decode`: a layer's single-token step in plain torch ops, and the checks that
  `Layer.__call__` would add nothing;
- `steps`: the decode steps, eager or `torch.compile`d, and a layer's decode function;
- `model_calls`: a whole model's leaf layers as torch calls inside `generate`;
- `model_step`: a whole decoder's single-token step as one function of torch ops (CPU);
- `attention`: SDPA and the one-query decode kernel;
- `tensors`: cache writes, linear layers, devices.

Example:
    >>> from keras_mha import backends
    >>> backends.current().compiles_decode
    False
"""

from __future__ import annotations

from keras_mha.backends.common import attention_kernels
from keras_mha.backends.common import linear as common_linear
from keras_mha.backends.torch import attention, eager_decode, gradients, steps, tensors
from keras_mha.backends.torch import generation as device_generation

compile_decode_step = steps.compile_decode_step
compile_generation_loop = None  # eager steps; on CUDA a CUDA-graph step (`generation`)
generation = device_generation  # generate's on-device loop and CUDA-graph step


def decode_paths(model):
    """`generate`'s decode paths, the default first: CUDA graphs on a CUDA GPU, else
    one eager step per token, the layers' calls (measured faster on the CPU than
    choosing the tokens on the device, docs/benchmarks.md); `generate` takes
    `device_loop` instead where it binds the whole-model step (`generation.model_step`)."""
    if device_generation.on_cuda(model):
        return ("cuda_graph", "device_loop", "per_token")
    return ("per_token", "device_loop")


decode_function = steps.layer_decode_function
gates_are_ones = eager_decode.gates_are_ones
layer_call = eager_decode.layer_call

fused_attention = attention.fused_attention
reads_cache_prefix_cheaply = attention.reads_cache_prefix_cheaply

gate_loss = gradients.gate_loss
gate_loss_and_gradients = gradients.gate_loss_and_gradients

concrete_index = tensors.concrete_index
write_cache_buffer = tensors.write_cache_buffer
linear = tensors.linear
tied_logits = common_linear.tied_logits
has_value = tensors.has_value
tensor_from_numpy = tensors.tensor_from_numpy
device_memory = tensors.device_memory
has_accelerator = tensors.has_accelerator
no_gradient_tracking = tensors.no_gradient_tracking

variable_caches = False  # the default cache is written in place (outside autograd)
compiles_decode = False  # eager steps measured faster than torch.compile's on the CPU
constant_rope_tables = False
applies_layouts = False


def eager_step(layer, inputs, query, cache, start, attention_mask, options):
    """The layer's eager decode step in torch ops where it applies, else None."""
    if eager_decode.applies(layer, inputs, cache, start, options):
        return eager_decode.step(layer, query, cache, start, attention_mask, options)
    return None


_EAGER_CALLS = []


def eager_calls():
    """`generate`'s eager leaf-layer kernels (`model_calls.eager_calls`); imported on
    first use."""
    if not _EAGER_CALLS:
        from keras_mha.backends.torch import model_calls as module

        _EAGER_CALLS.append(module.eager_calls)
    return _EAGER_CALLS[0]()


def cache_factory(make_caches):
    return make_caches


def cache_zeroer(caches):
    """Zero the kept caches in place (CUDA graphs read them at fixed addresses)."""
    import keras

    buffers = keras.tree.flatten(caches)

    def zero():
        for buffer in buffers:
            buffer.zero_()

    return zero


def prefers_blockwise_causal():
    return False  # SDPA skips the masked triangle itself


def blockwise_causal_attention(query, key, value, scale, *, block_size):
    return attention_kernels.causal_attention_in_blocks(
        query, key, value, scale, block_size=block_size
    )


def cache_kernel(query, key):
    return None  # SDPA over the cache (or its written prefix)


_NO_VARIABLES = (
    "`variables=True` (a KV cache of variables written in place) is for TensorFlow; "
    "received it on torch, where the default cache is already written in place "
    "(under torch.no_grad())."
)


def cache_variables(shape, dtype):
    raise ValueError(_NO_VARIABLES)


def is_variable(buffer):
    return False


def variable_tensor(buffer):
    return buffer


scatter_into_variable = None  # no variable caches here


def check_lengths_at_run_time(pairs):
    """Eager PyTorch knows every size when the layer checks them."""


def supports_deferred_variables():
    return True


def sync_training_state(model):
    """Variables are current during `fit` on PyTorch."""
