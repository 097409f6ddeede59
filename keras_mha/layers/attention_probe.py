"""Recording the attention probabilities of keras-mha layers while a model runs.

`record_attention(model, callback)` makes every keras-mha attention layer of `model`
hand its attention probabilities, `(batch, num_heads, query_length, key_length)`
float32 NumPy arrays, to `callback(path, probabilities)` on each call, in call order.
Statistics can so be accumulated batch by batch without keeping any map. Without a
callback, the probe keeps the maps of each layer's latest call (`probe.attention`),
for looking at one batch.

Recording is per process (a block on one thread is seen by calls on others). While
recording, the layers take the generic (non-fused) path, as with
`return_attention_scores=True`, even with `flash_attention=True`; the eager PyTorch
decode fast path is not taken either. Outputs are unchanged (to float round-off).
Call the model eagerly (`model(inputs)`): inside `jax.jit`, `tf.function` or
`torch.compile` (as `predict` and `fit` run it) the probabilities are not values yet,
and recording refuses them.

Example:
    >>> entropy = {}
    >>> def on_attention(path, probabilities):
    ...     p = probabilities[probabilities > 0]
    ...     entropy[path] = entropy.get(path, 0.0) - float((p * np.log(p)).sum())
    >>> with record_attention(model, on_attention):  # doctest: +SKIP
    ...     model({"token_ids": ids, "padding_mask": mask})
    >>> with record_attention(model) as probe:  # doctest: +SKIP
    ...     model(ids)
    >>> probe.attention["blocks_0/attention"].shape  # doctest: +SKIP
    (1, 12, 9, 9)
"""

from __future__ import annotations

import contextlib

import keras
import numpy as np

# {id(layer): (path, callback)} of the layers being recorded, in this process. A plain
# dict, not a ContextVar: torch.compile traces a check of an empty dict (the layer asks
# on every call) but breaks its graph on ContextVar.get.
_RECORDING: dict = {}


def is_recording(layer) -> bool:
    """Whether `layer`'s probabilities are being recorded (it must not use a fused kernel)."""
    return bool(_RECORDING) and id(layer) in _RECORDING


def observe(layer, probabilities) -> None:
    """Hand `layer`'s attention probabilities to its recorder, if it has one."""
    if not _RECORDING or id(layer) not in _RECORDING:
        return
    path, callback = _RECORDING[id(layer)]
    callback(path, _eager_numpy(probabilities, path))


def _eager_numpy(tensor, path):
    if keras.backend.is_keras_tensor(tensor) or not _has_value(tensor):
        raise RuntimeError(
            f"record_attention: layer {path!r} was called inside a compiled function "
            "(jax.jit, tf.function, torch.compile, or Model.predict/fit), where the attention "
            "probabilities have no value yet; call the model eagerly, model(inputs)."
        )
    return np.asarray(keras.ops.convert_to_numpy(tensor), dtype="float32")


def _has_value(tensor) -> bool:
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return not isinstance(tensor, jax.core.Tracer)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.executing_eagerly()
    if backend == "torch":
        import torch

        return not torch.compiler.is_compiling()
    return True


class AttentionProbe:
    """What `record_attention` yields.

    Attributes:
        layers: `{path: layer}` of the recorded attention layers, in model order.
        attention: `{path: probabilities}` of each layer's latest call (only when
            no callback was given).
        calls: `{path: number of calls recorded}`.
    """

    def __init__(self, layers, callback):
        self.layers = dict(layers)
        self.attention = {}
        self.calls = dict.fromkeys(self.layers, 0)
        self._callback = callback

    def _receive(self, path, probabilities):
        self.calls[path] += 1
        if self._callback is None:
            self.attention[path] = probabilities
        else:
            self._callback(path, probabilities)


@contextlib.contextmanager
def record_attention(model, callback=None):
    """Within the block, every keras-mha attention layer of `model` reports its probabilities.

    Args:
        model: a Keras model or layer holding keras-mha attention layers (found as
            `keras_mha.pruning.find_attention_layers` finds them, with the same paths).
        callback: `callback(path, probabilities)`, called once per layer call with a
            float32 NumPy array `(batch, num_heads, query_length, key_length)`; rows of
            padded queries are zeros. None keeps each layer's latest map in
            `probe.attention` instead.

    Yields:
        An `AttentionProbe`.

    Raises:
        ValueError: `model` holds no keras-mha attention layer.

    Example:
        >>> with record_attention(model) as probe:  # doctest: +SKIP
        ...     model(token_ids)
        >>> sorted(probe.calls.values())  # doctest: +SKIP
        [1, 1]
    """
    from keras_mha.pruning.discovery import require_attention_layers

    layers = require_attention_layers(model)
    probe = AttentionProbe(layers, callback)
    keys = [id(layer) for layer in layers.values()]
    outer = {key: _RECORDING[key] for key in keys if key in _RECORDING}  # a nested block's
    for key, path in zip(keys, layers, strict=True):
        _RECORDING[key] = (path, probe._receive)
    try:
        yield probe
    finally:
        for key in keys:
            _RECORDING.pop(key, None)
        _RECORDING.update(outer)


__all__ = ["AttentionProbe", "is_recording", "observe", "record_attention"]
