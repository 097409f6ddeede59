"""Recording the attention probabilities of a model's keras-mha layers while it runs.

`record_attention(model, callback)` makes every keras-mha attention layer of `model`
hand its attention probabilities, `(batch, num_heads, query_length, key_length)`
float32 NumPy arrays, to `callback(path, probabilities)` on each call, in call order.
Statistics can so be accumulated batch by batch without keeping any map. Without a
callback, the probe keeps the maps of each layer's latest call (`probe.attention`),
for looking at one batch.

While recording, the layers take the generic (non-fused) path, as with
`return_attention_scores=True`, even with `flash_attention=True`; the eager PyTorch
decode fast path is not taken either. Outputs are unchanged (to float round-off).
Call the model eagerly (`model(inputs)`): inside `jax.jit`, `tf.function` or
`torch.compile` (as `predict` and `fit` run it) the probabilities are not values yet,
and recording refuses them. The layer side is `keras_mha.backends.common.attention_probe`.

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

from keras_mha.backends.common.attention_probe import recording
from keras_mha.pruning.discovery import require_attention_layers


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
    layers = require_attention_layers(model)
    probe = AttentionProbe(layers, callback)
    with recording(layers, probe._receive):
        yield probe


__all__ = ["AttentionProbe", "record_attention"]
