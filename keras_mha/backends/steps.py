"""What every backend's decode steps share: the forward at its position, the index checks,
and the decode function of a layer where the backend adds nothing to it.

Each backend compiles `forward(inputs, mask, caches, index) -> (outputs, caches)`, a
layer's or a model's call on its KV caches, into the step it decodes with, as keras-hub's
`CausalLM.make_generate_function` does for its models, so that the layers and models
hold no backend branch of their own:

- JAX (`backends/jax/steps.py`): `jax.jit`, `owner`'s variables passed in
  (`keras.StatelessScope`), the caches donated so that XLA updates them in place
  (`step.lower(inputs, mask, caches, index)` gives the lowering, e.g. to read the
  optimised HLO);
- TensorFlow (`backends/tensorflow/steps.py`): `tf.function(jit_compile=True)`; variable
  caches (`init_cache(..., variables=True)`) are assigned in place and kept out of the
  function's outputs (a returned variable comes back as a copy);
- PyTorch (`backends/torch/steps.py`): eager calls under `torch.no_grad()`
  (the caches written in place), or `torch.compile` with `compile_torch=True`.

The index is an int32 tensor to the compiled steps (a 0-d tensor under
`torch.compile`), so one compiled step serves every position; a step made with
`static_index=True` is a prefill at position 0, which keeps the fused causal kernels.

Example:
    >>> layer = GroupedQueryAttention(8, 2, head_dim=16, causal=True)
    >>> layer.build((None, None, 64))
    >>> prompt = keras.random.normal((1, 5, 64))
    >>> decode = layer.make_decode_function()
    >>> cache = layer.init_cache(1, 64, variables=keras.backend.backend() == "tensorflow")
    >>> output, cache = decode(prompt, cache, 0)
    >>> output, cache = decode(output[:, -1:], cache, prompt.shape[1])
    >>> tuple(output.shape)
    (1, 1, 64)
"""

from __future__ import annotations

import numpy as np

from keras_mha.backends.common import kv_cache


def positioned(forward, static_index):
    """`forward` at its index, or at the Python int 0 for a prefill (`static_index`)."""

    def call(inputs, mask, caches, index):
        return forward(inputs, mask, caches, 0 if static_index else index)

    return call


def traced(forward, static_index, on_trace):
    """`positioned(forward, ...)` that calls `on_trace()` first: runs once per trace under
    `jax.jit` and `tf.function`."""
    call = positioned(forward, static_index)

    def trace(inputs, mask, caches, index):
        on_trace()
        return call(inputs, mask, caches, index)

    return trace


def layer_forward(layer):
    """`forward` of a layer's decode function: the layer's call on its cache."""

    def forward(query, mask, cache, index):
        return layer(query, cache=cache, cache_index=index, attention_mask=mask)

    return forward


def layer_decode_function(layer, compile_decode_step, *, compile_torch=False, jit_compile=True):
    """A layer's decode function on a compiling backend: a prefill step (at 0) and a step.

    Example:
        >>> from keras_mha.backends import current
        >>> layer = GroupedQueryAttention(8, 2, head_dim=16, causal=True)
        >>> layer.build((None, None, 64))
        >>> decode = layer_decode_function(layer, current().compile_decode_step)
        >>> cache = layer.init_cache(1, 16, variables=keras.backend.backend() == "tensorflow")
        >>> output, cache = decode(keras.ops.ones((1, 3, 64)), cache, 0)
        >>> tuple(output.shape)
        (1, 3, 64)
    """
    forward = layer_forward(layer)
    options = {"compile_torch": compile_torch, "jit_compile": jit_compile}
    prefill = compile_decode_step(layer, forward, static_index=True, **options)
    step = compile_decode_step(layer, forward, **options)

    def decode(query, cache, cache_index, attention_mask=None):
        run = prefill if is_int(cache_index) and cache_index == 0 else step
        return run(query, attention_mask, cache, cache_index)

    return decode


def check_write(query, cache, index):
    """Check writing `query` at the int `index` into `cache` as the layer would: raise its
    overrun error, else True; False when they are not shaped as the layer takes them
    (the layer's own checks then say so)."""
    shape = getattr(query, "shape", None)
    if shape is None or len(shape) != 3 or not isinstance(cache, (tuple, list)):
        return False
    if len(cache) != 2 or len(getattr(cache[0], "shape", ())) != 4:
        return False
    kv_cache.check_static_write(int(index), shape[1], kv_cache.KVCache(*cache).max_length)
    return True


def is_int(index):
    """A Python or NumPy int (converted to the backend's index here); not a bool, which
    goes on as it is for the layer to refuse."""
    return isinstance(index, (int, np.integer)) and not isinstance(index, bool)


__all__ = ["check_write", "is_int", "layer_decode_function", "layer_forward", "positioned"]
