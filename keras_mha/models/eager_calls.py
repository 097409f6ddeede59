"""`generate`'s eager leaf-layer calls: the backend's kernels, keyed by the model's layers.

The backend knows its kernels by the kind of layer they replace
(`keras_mha.backends.EagerKernels`: on PyTorch, `keras_mha.backends.torch.model_calls`);
the models know which classes those kinds are. `eager_calls` puts the two together as
the `EagerCalls` that `direct_calls` runs.

Example:
    >>> with direct_calls(True, eager_calls(backends.current().eager_calls())):  # doctest: +SKIP
    ...     logits, caches = model.call_with_cache(ids, key_mask, caches, index)
"""

from __future__ import annotations

import functools

import keras

from keras_mha.backends import EagerKernels
from keras_mha.layers import GroupedQueryAttention, MultiHeadAttention, MultiQueryAttention
from keras_mha.models.blocks import RMSNorm
from keras_mha.models.direct_calls import EagerCalls
from keras_mha.models.supported import ACTIVATIONS

#: Layer class (exact) -> the field of `EagerKernels` that replaces its `call`.
LAYER_KERNELS = {
    keras.layers.Dense: "dense",
    keras.layers.Embedding: "embedding",
    keras.layers.LayerNormalization: "layer_norm",
    RMSNorm: "rms_norm",
    GroupedQueryAttention: "attention",
    MultiHeadAttention: "attention",
    MultiQueryAttention: "attention",
}


def eager_calls(kernels: EagerKernels | None) -> EagerCalls | None:
    """The `EagerCalls` of `kernels` (what `backends.current().eager_calls()` answers):
    each layer class of `LAYER_KERNELS` to its kernel, each `ACTIVATIONS` entry the
    backend has a function for to that function; None for None.

    Example:
        >>> eager_calls(None) is None
        True
    """
    return None if kernels is None else _eager_calls(kernels)


@functools.cache
def _eager_calls(kernels: EagerKernels) -> EagerCalls:
    activations = {name: kernels.activation(*entry) for name, entry in ACTIVATIONS.items()}
    return EagerCalls(
        layers={kind: getattr(kernels, field) for kind, field in LAYER_KERNELS.items()},
        activations={name: f for name, f in activations.items() if f is not None},
        add_into=kernels.add_into,
        multiply_into=kernels.multiply_into,
    )


__all__ = ["LAYER_KERNELS", "eager_calls"]
