"""Each backend's fast paths behind one small interface; the only place that asks which
backend runs.

The layers, the models and `generate` are written in `keras.ops`; where a backend has a
faster primitive or needs a workaround, they call `current()`, the running backend's
module (`keras_mha.backends.torch`, `.jax` or `.tensorflow`), which holds that backend's
answer under the same name on all three (`INTERFACE` lists them; a test checks each
backend module defines every one). Private Keras and torch attributes are read only
below this package. Each backend module is imported on first use, by name: importing
the layers on JAX never imports torch.

Example:
    >>> name() == keras.backend.backend()
    True
    >>> current().reads_cache_prefix_cheaply() in (True, False)
    True
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import NamedTuple

import keras

#: What every backend module defines (functions unless noted), and who calls it.
INTERFACE = (
    # Decoding (GroupedQueryAttention.make_decode_function, generate).
    "compile_decode_step",  # forward -> the step this backend decodes with
    "decode_function",  # GroupedQueryAttention.make_decode_function
    "layer_call",  # GroupedQueryAttention.__call__: a decode call without Keras's, or None
    "eager_step",  # GroupedQueryAttention.call: an eager decode step, or None
    "gates_are_ones",  # GroupedQueryAttention._output: skip multiplying by 1
    "eager_calls",  # generate's eager leaf-layer kernels (an `EagerKernels`), or None
    "variable_caches",  # bool: generate keeps its caches in variables (TensorFlow)
    "compiles_decode",  # bool: generate's steps are compiled by default
    "cache_factory",  # generate: the function that makes zero caches, compiled or not
    "cache_zeroer",  # generate: caches kept between calls -> the function that zeroes them
    "decode_paths",  # generate: its decode paths for a model here, the default first
    "compile_generation_loop",  # generate's whole loop as one program, or None
    "generation",  # generate's on-device loop and CUDA-graph step (a module), or None
    # Attention kernels (common.attention_kernels, layers.attention_paths).
    "fused_attention",
    "reads_cache_prefix_cheaply",
    "prefers_blockwise_causal",
    "blockwise_causal_attention",
    "cache_kernel",
    # KV cache writes (common.kv_cache).
    "concrete_index",
    "write_cache_buffer",
    "cache_variables",
    "is_variable",
    "variable_tensor",
    "scatter_into_variable",
    # Tensors and devices.
    "linear",
    "tied_logits",  # a tied LM head: hidden (B, T, D) against the embedding table (V, D)
    "has_value",
    "check_lengths_at_run_time",
    "constant_rope_tables",  # bool: RoPE angles as constants of the program
    "tensor_from_numpy",
    "device_memory",
    "has_accelerator",
    "no_gradient_tracking",
    "supports_deferred_variables",
    "sync_training_state",
    # Pruning (pruning.gate_gradients): the loss of the head gates, and its gradient.
    "gate_loss",
    "gate_loss_and_gradients",
    "applies_layouts",  # bool: keras.distribution places variables by a LayoutMap
)


class EagerKernels(NamedTuple):
    """What `eager_calls()` answers on a backend with eager kernels for a model's leaf
    layers (PyTorch): each a function `(layer, *args, **kwargs)` run instead of the
    layer's `call` inside `generate`'s eager steps (`keras_mha.models.eager_calls` maps
    the model's layer classes to them); `activation(function_name, arguments)` the
    backend's function for a `keras.activations` entry, or None; `add_into` and
    `multiply_into` write a residual sum or gated product into their first argument."""

    dense: Callable
    embedding: Callable
    layer_norm: Callable
    rms_norm: Callable
    attention: Callable
    activation: Callable
    add_into: Callable
    multiply_into: Callable


_LOADED: dict = {}
_MODULES: dict = {}


def name() -> str:
    """The running Keras backend's name: `"jax"`, `"tensorflow"` or `"torch"`."""
    return keras.backend.backend()


def current():
    """The running backend's module (see `INTERFACE`), imported on first use.

    Example:
        >>> current().__name__ == f"keras_mha.backends.{keras.backend.backend()}"
        True
    """
    backend = keras.backend.backend()
    found = _LOADED.get(backend)
    if found is None:
        if backend not in ("jax", "tensorflow", "torch"):
            raise ValueError(
                f"The Keras backend is {backend!r}; keras-mha runs on 'jax', 'tensorflow' "
                "and 'torch'."
            )
        found = _LOADED[backend] = importlib.import_module(f"keras_mha.backends.{backend}")
    return found


def module(dotted):
    """A backend's own module (`"torch.nn.functional"`), imported on first use and kept.

    For the eager decode paths, where an import statement costs more than a kernel launch.

    Example:
        >>> module("numpy").float32
        <class 'numpy.float32'>
    """
    found = _MODULES.get(dotted)
    if found is None:
        found = _MODULES[dotted] = importlib.import_module(dotted)
    return found


def compile_decode_step(owner, forward, **options):
    """`step(inputs, mask, caches, index) -> (outputs, caches)`: `forward` compiled the way
    the running backend decodes (see `keras_mha.backends.steps.compile_decode_step`).

    Example:
        >>> layer = GroupedQueryAttention(8, 2, head_dim=16, causal=True)
        >>> _ = layer(keras.ops.ones((1, 4, 64)))
        >>> step = compile_decode_step(layer, lambda x, mask, cache, index: layer(
        ...     x, cache=cache, cache_index=index, attention_mask=mask))
        >>> cache = layer.init_cache(1, 16, variables=keras.backend.backend() == "tensorflow")
        >>> output, cache = step(keras.ops.ones((1, 1, 64)), None, cache, 7)
        >>> tuple(output.shape)
        (1, 1, 64)
    """
    return current().compile_decode_step(owner, forward, **options)


__all__ = ["INTERFACE", "EagerKernels", "compile_decode_step", "current", "module", "name"]
