"""JAX's tensors and devices: what has a value while tracing, NumPy arrays adopted without
a copy, the device's memory, and what `fit` holds of a model's variables.

Example:
    >>> has_value(jax.numpy.ones(2))  # doctest: +SKIP
    True
"""

from __future__ import annotations

import jax
import keras

from keras_mha.backends.common import kv_cache


def concrete_index(cache_index):
    """The int behind a cache index array, or None for a tracer."""
    return kv_cache.read_index(cache_index)


def has_value(tensor):
    """Whether `tensor` holds values now: not a `jax.jit` tracer."""
    return not isinstance(tensor, jax.core.Tracer)


def tensor_from_numpy(array):
    """An array sharing `array`'s memory where JAX allows it (the CPU)."""
    try:
        return jax.device_put(array, may_alias=True)
    except TypeError:  # jax < 0.5 has no may_alias; on the CPU it aliases anyway
        return jax.device_put(array)


def has_accelerator():
    return jax.devices()[0].platform != "cpu"


def device_memory(host_memory):
    """`(bytes, description)` of the memory this backend computes in, None when unknown."""
    device = jax.devices()[0]
    if device.platform == "cpu":
        return host_memory()
    limit = (device.memory_stats() or {}).get("bytes_limit")
    return None if limit is None else (int(limit), f"the {device.platform} device")


def supports_deferred_variables():
    """Keras's NNX variables cannot be created empty and filled later."""
    return not keras.config.is_nnx_enabled()


def sync_training_state(model):
    """Make `model`'s variables current while `fit` holds their values (a no-op outside
    `fit` and when already synced)."""
    if getattr(model, "_jax_state", None) and not getattr(model, "_jax_state_synced", True):
        model.jax_state_sync()
