"""Calling sub-layers without Keras's `Layer.__call__` on the eager decode path.

A single-token decode step of a small model does little arithmetic per layer, and in
eager PyTorch Keras's per-call bookkeeping (flattening every argument, name scopes,
mask propagation, dtype checks, the torch `Module` hooks) cost more than the layer's
own ops: measured, about a third of an eager step of a 4-layer model. Inside `direct_calls(True)`,
the model's blocks call their sub-layers' `call` methods directly.

That is only equivalent where `__call__` adds nothing to the result: built layers
whose compute dtype equals their variable dtype (no autocasting), no quantization and
no distribution; `supports_direct_calls(model)` checks this.

Example:
    >>> with direct_calls(supports_direct_calls(model)):  # doctest: +SKIP
    ...     logits, caches = model.call_with_cache(ids, key_mask, caches, index)
"""

from __future__ import annotations

import contextlib
import contextvars

import keras

_DIRECT = contextvars.ContextVar("keras_mha_direct_calls", default=False)


def run(layer, *args, **kwargs):
    """`layer(*args, **kwargs)`, or `layer.call(...)` inside `direct_calls`."""
    if _DIRECT.get():
        return layer.call(*args, **kwargs)
    return layer(*args, **kwargs)


def supports_direct_calls(model) -> bool:
    """Whether calling `call` directly gives what `__call__` gives, for every layer.

    Example:
        >>> supports_direct_calls(keras.Sequential([keras.layers.Dense(2)]))
        False
    """
    if not model.built or keras.distribution.distribution() is not None:
        return False
    # Keras's own walk over every nested layer (what `model.layers` does one level deep).
    for layer in model._flatten_layers(include_self=True, recursive=True):
        if not layer.built or getattr(layer, "quantization_mode", None) is not None:
            return False
        policy = layer.dtype_policy
        if policy.compute_dtype != policy.variable_dtype:
            return False
    return True


@contextlib.contextmanager
def direct_calls(enabled=True):
    """Within (when `enabled`): `run(layer, ...)` calls `layer.call` directly."""
    token = _DIRECT.set(bool(enabled))
    try:
        yield
    finally:
        _DIRECT.reset(token)


__all__ = ["direct_calls", "run", "supports_direct_calls"]
