"""What a run must fit, checked before anything is allocated: the model's positions and
the memory of the device it computes on.

- `model_spec(model)`: the `ModelSpec` of a model's Hub config (None without one).
- `max_positions(model)`: its `max_position_embeddings` (None when not stated).
- `device_memory()`: bytes of the memory Keras computes in, and where: the GPU's on JAX
  and PyTorch, the machine's RAM on a CPU (`host_memory()`); None where the backend does
  not say (TensorFlow on a GPU).
- `check_memory(spec, ...)`: refuses a batch and length whose memory, by the planner's
  formulas (`keras_mha.planning.planner.memory.serving_memory`: weights, KV cache and one
  unchunked prefill; a lower bound of what a run takes), exceeds that memory.

Example:
    >>> from keras_mha.models.limits import max_positions
    >>> max_positions(model)  # doctest: +SKIP
    2048
"""

from __future__ import annotations

import os
import warnings
import weakref

from keras_mha.errors import UsageError

# model -> (its hub_config dict, that config's ModelSpec): `generate` checks every call.
_SPECS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def model_spec(model):
    """The `ModelSpec` of `model.hub_config` (None for a model without a Hub config);
    read once per config (a model's config is set when it is built)."""
    config = getattr(model, "hub_config", None)
    if not isinstance(config, dict):
        return None
    try:
        cached = _SPECS.get(model)
    except TypeError:  # not weakly referable
        cached = None
    if cached is not None and cached[0] is config:
        return cached[1]
    from keras_mha.planning.spec import from_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the config was read (and warned about) on load
        spec = from_config(dict(config))
    try:
        _SPECS[model] = (config, spec)
    except TypeError:
        pass
    return spec


def max_positions(model) -> int | None:
    """The positions `model` was trained for (`max_position_embeddings`), or None.

    Example:
        >>> max_positions(object()) is None
        True
    """
    spec = model_spec(model)
    positions = getattr(getattr(spec, "positions", None), "max_position_embeddings", None)
    if positions is None:
        positions = getattr(model, "max_position_embeddings", None)
    return None if positions is None else int(positions)


def host_memory() -> tuple[int, str] | None:
    """`(bytes, description)` of this machine's RAM (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine's RAM"
    except (AttributeError, ValueError, OSError):  # not a POSIX system
        return None


def device_memory() -> tuple[int, str] | None:
    """`(bytes, description)` of the memory the current Keras backend computes in.

    Example:
        >>> device_memory()  # doctest: +SKIP
        (25323864064, "this machine's RAM")
    """
    from keras_mha import backends

    return backends.current().device_memory(host_memory)


def _gib(size: int) -> str:
    return f"{size / 2**30:,.1f} GiB"


def check_memory(spec, *, batch: int, seq_len: int, dtype: str, argument: str, memory=None):
    """Refuse `batch` sequences of `seq_len` tokens whose memory exceeds the device's.

    Args:
        spec: the model's `ModelSpec`.
        batch, seq_len: the run's batch and total length (prompt and new tokens).
        dtype: the weights' and activations' dtype.
        argument: the flags or arguments to name, e.g. "--batch / --prompt-length".
        memory: `(bytes, description)`; default `device_memory()`.

    Raises:
        UsageError: naming `argument`, the estimate and the memory.

    Example:
        >>> check_memory(spec, batch=1, seq_len=128, dtype="float32", argument="--batch")
        ... # doctest: +SKIP
    """
    from keras_mha.planning.planner.memory import serving_memory

    memory = device_memory() if memory is None else memory
    if memory is None:
        return
    available, where = memory
    needed = serving_memory(
        spec,
        batch=batch,
        seq_len=seq_len,
        weights_dtype=dtype,
        kv_dtype=dtype,
        compute_dtype=dtype,
        prefill_chunk=batch * seq_len,
    )
    if needed.total_bytes > available:
        raise UsageError(
            f"{argument}: {batch} sequence(s) of {seq_len} tokens need at least "
            f"{_gib(needed.total_bytes)} (weights {_gib(needed.weights_bytes)}, KV cache "
            f"{_gib(needed.kv_cache_bytes)}, activations {_gib(needed.activation_bytes)}), more "
            f"than the {_gib(available)} of {where}; expected a smaller batch or length",
            key=argument,
            value=(batch, seq_len),
        )


__all__ = ["check_memory", "device_memory", "host_memory", "max_positions", "model_spec"]
