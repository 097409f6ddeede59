"""Calling sub-layers without Keras's `Layer.__call__` on the eager decode path.

A single-token decode step of a small model does little arithmetic per layer, and in
eager PyTorch Keras's per-call bookkeeping (flattening every argument, name scopes,
mask propagation, dtype checks, the torch `Module` hooks) cost more than the layer's
own ops: measured, about a third of an eager step of a 4-layer model. Inside `direct_calls(True)`,
the model's blocks call their sub-layers' `call` methods directly.

That is only equivalent where `__call__` adds nothing to the result: built layers
whose compute dtype equals their variable dtype (no autocasting), no quantization and
no distribution; `supports_direct_calls(model)` checks this. `direct_calls` may also
be given `EagerCalls`: functions that replace the `call` of layers of given classes,
and activations, with the backend's kernels (`keras_mha.models.eager_calls`, from
`backends.current().eager_calls()`: on PyTorch, `keras_mha.backends.torch.model_calls`).

Example:
    >>> with direct_calls(supports_direct_calls(model)):  # doctest: +SKIP
    ...     logits, caches = model.call_with_cache(ids, key_mask, caches, index)
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping

import keras


@dataclasses.dataclass(frozen=True)
class EagerCalls:
    """Inside `direct_calls`: `layers` maps a layer's exact class to a function
    `(layer, *args, **kwargs)` run instead of its `call`; `activations` maps a Hugging
    Face activation name to a function run instead of Keras's (it may write into its
    input, which `activate` only gets fresh); `add_into` and `multiply_into` are
    `add_into` and `multiply_into` below, which may write into their first argument."""

    layers: Mapping[type, Callable] = dataclasses.field(default_factory=dict)
    activations: Mapping[str, Callable] = dataclasses.field(default_factory=dict)
    add_into: Callable | None = None
    multiply_into: Callable | None = None


# The active `EagerCalls`, or None: a one-item list, not a ContextVar, whose `get()`
# torch.compile cannot trace (a graph break at every sub-layer made a compiled whole-model
# step 10x slower than the eager one). Decode steps run on one thread at a time.
_DIRECT: list = [None]


def run(layer, *args, **kwargs):
    """`layer(*args, **kwargs)`, or inside `direct_calls` `layer.call(...)` (or the
    function registered for the layer's class)."""
    calls = _DIRECT[0]
    if calls is None:
        return layer(*args, **kwargs)
    function = calls.layers.get(type(layer))
    if function is None:
        return layer.call(*args, **kwargs)
    return function(layer, *args, **kwargs)


def activate(name, function, inputs):
    """`function(inputs)`, the activation `name`, or the one registered for `name` inside
    `direct_calls`. `inputs` must be fresh: a tensor just computed and used nowhere else
    (the registered function may write the result into it)."""
    calls = _DIRECT[0]
    fast = None if calls is None else calls.activations.get(name)
    return (fast or function)(inputs)


# Out of place, a block's residual sums and gated products each allocate a tensor of the
# activations' size, which eager PyTorch gets as fresh pages from the system.
def add_into(fresh, other):
    """`other + fresh`, where `fresh` was just computed and is used nowhere else: inside
    `direct_calls` with eager calls, the sum may be written into `fresh`.

    Example:
        >>> add_into(keras.ops.ones(2), keras.ops.ones(2)).tolist()  # doctest: +SKIP
        [2.0, 2.0]
    """
    calls = _DIRECT[0]
    if calls is not None and calls.add_into is not None:
        return calls.add_into(fresh, other)
    return other + fresh


def multiply_into(fresh, other):
    """`fresh * other`, where `fresh` was just computed and is used nowhere else: inside
    `direct_calls` with eager calls, the product may be written into `fresh`."""
    calls = _DIRECT[0]
    if calls is not None and calls.multiply_into is not None:
        return calls.multiply_into(fresh, other)
    return fresh * other


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
def direct_calls(enabled=True, eager_calls=None):
    """Within (when `enabled`): `run(layer, ...)` calls `layer.call` directly, or the
    function `eager_calls` (an `EagerCalls`) registers for the layer's class."""
    previous = _DIRECT[0]
    _DIRECT[0] = (eager_calls or EagerCalls()) if enabled else None
    try:
        yield
    finally:
        _DIRECT[0] = previous


__all__ = [
    "EagerCalls",
    "activate",
    "add_into",
    "direct_calls",
    "multiply_into",
    "run",
    "supports_direct_calls",
]
