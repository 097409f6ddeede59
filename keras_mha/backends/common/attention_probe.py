"""The layer side of recording attention: keras-mha attention layers ask `is_recording`
(while recording they take the generic, non-fused path, as with
`return_attention_scores=True`, and the eager PyTorch decode fast path is not taken)
and hand their probabilities to `observe`, which passes them, as float32 NumPy arrays
`(batch, num_heads, query_length, key_length)`, to whoever registered the layer with
`recording`. Outputs are unchanged (to float round-off).

Recording is per process (a block on one thread is seen by calls on others). Call the
model eagerly: inside `jax.jit`, `tf.function` or `torch.compile` the probabilities are
not values yet, and `observe` refuses them. Models are recorded with
`keras_mha.analysis.recording.record_attention(model, callback)`.

Example:
    >>> shapes = {}
    >>> with recording({"attention": layer}, lambda path, p: shapes.update({path: p.shape})):
    ...     layer(x)  # doctest: +SKIP
    >>> shapes  # doctest: +SKIP
    {'attention': (1, 4, 9, 9)}
"""

from __future__ import annotations

import contextlib

import keras
import numpy as np

from keras_mha import backends

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
    return backends.current().has_value(tensor)


@contextlib.contextmanager
def recording(layers, receive):
    """Within the block, each layer of `layers` (`{path: layer}`) hands its probabilities to
    `receive(path, probabilities)`; an enclosing block's recording of the same layers
    resumes after it. `keras_mha.analysis.recording.record_attention` is the model-level
    entry point.

    Example:
        >>> with recording({"attention": layer}, print):  # doctest: +SKIP
        ...     layer(x)
    """
    keys = [id(layer) for layer in layers.values()]
    outer = {key: _RECORDING[key] for key in keys if key in _RECORDING}  # a nested block's
    for key, path in zip(keys, layers, strict=True):
        _RECORDING[key] = (path, receive)
    try:
        yield
    finally:
        for key in keys:
            _RECORDING.pop(key, None)
        _RECORDING.update(outer)


__all__ = ["is_recording", "observe", "recording"]
