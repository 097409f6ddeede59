"""Per-head importance scores: Taylor (gate gradients), ablation, weight magnitude."""

from __future__ import annotations

import keras
import numpy as np

from keras_mha.errors import PruningError
from keras_mha.layers.quantization import refuse_quantized
from keras_mha.pruning.batches import Batches, batch_size_of, check_batching, resolve_loss
from keras_mha.pruning.discovery import require_attention_layers
from keras_mha.pruning.gate_gradients import GateLoss
from keras_mha.pruning.gates import sync_training_state
from keras_mha.pruning.labels import LabelCheck

METHODS = ("taylor", "ablation", "magnitude")


def check_method(method):
    """Raise a ValueError naming `method` unless it is one of `METHODS`.

    Example:
        >>> check_method("taylor")
    """
    if method not in METHODS:
        raise ValueError(
            f"`method`={method!r} is not a head-importance method; expected one of {METHODS}."
        )


def head_importance(
    model,
    data=None,
    method="taylor",
    loss=None,
    batch_size=32,
    max_batches=None,
):
    """One importance score per query head, for every keras-mha attention layer.

    The methods (`method=`):

    - `"taylor"` (Michel et al., 2019, "Are Sixteen Heads Really Better than
      One?"): the expected absolute gradient of the loss with respect to
      each head's gate, `mean over batches of |dL_batch/dgate_h|` (absolute
      value per batch, batches weighted by their size), then divided by the
      layer's L2 norm so that layers can be compared with each other.
    - `"ablation"`: the rise of the loss over `data` when only that head's
      gate is set to 0 (forward passes only). Negative when the model does
      better without the head. Heads whose gate is already 0 score 0.
    - `"magnitude"`: from the weights alone (no data). For query head `h` of
      KV group `k = h // num_query_groups`:
      `sqrt(|Wq[:, h]|^2 + |bq[h]|^2 + |Wo[h]|^2 + (|Wk[:, k]|^2 + |bk[k]|^2
      + |Wv[:, k]|^2 + |bv[k]|^2) / num_query_groups)`, Frobenius norms: a
      shared KV head's squared norm is split equally among the query heads
      that read it, so the squared scores of a layer add up to the squared
      norm of all its head-indexed weights. Gates are not included.

    The model is not changed: for Taylor and ablation scores the gates enter
    the forward pass as inputs of a pure function (`gate_gradients.GateLoss`).
    Gradients and losses are taken in inference mode (`training=False`) at the
    gates' current values.

    Args:
        model: a built model with keras-mha attention layers.
        data: what to score on (not used by `"magnitude"`), see
            `keras_mha.pruning.batches.Batches`: `(x, y)` arrays, a dataset or
            an iterable of batches.
        method: `"taylor"`, `"ablation"` or `"magnitude"`.
        loss: None (the model's compiled loss), a loss name, a
            `keras.losses.Loss` or a callable `(y_true, y_pred) -> tensor`.
        batch_size: batch size for array data.
        max_batches: use at most this many batches.

    Returns:
        `{path: np.ndarray(num_heads)}` in model order; paths as in
        `find_attention_layers`.

    Raises:
        PruningError: a bad `batch_size` / `max_batches`; labels outside the
            model's classes for a (sparse) categorical cross-entropy (checked
            per batch before it is scored, on every backend); scores that are
            NaN or infinite (a loss, gradient or weight that is not finite).

    Example:
        >>> from keras_mha.layers import MultiHeadAttention
        >>> inputs = keras.Input((8, 16))
        >>> model = keras.Model(inputs, MultiHeadAttention(4, name="attention")(inputs))
        >>> x = np.random.default_rng(0).normal(size=(4, 8, 16)).astype("float32")
        >>> scores = head_importance(model, (x, x), method="taylor", loss="mse")
        >>> scores["attention"].shape
        (4,)
    """
    check_method(method)
    check_batching(batch_size, max_batches)
    layers = require_attention_layers(model)
    if method == "magnitude":
        sync_training_state(model)
        scores = {path: magnitude_scores(layer) for path, layer in layers.items()}
        return _checked(scores, method, "the layer's weights are not finite")
    batches = (
        data
        if isinstance(data, Batches)
        else Batches(data, batch_size=batch_size, max_batches=max_batches)
    )
    loss_fn = resolve_loss(model, loss)
    check_labels = LabelCheck(model, loss_fn.loss)
    sync_training_state(model)
    score = _taylor if method == "taylor" else _ablation
    scores = score(model, layers, batches, loss_fn, check_labels)
    return _checked(scores, method, "the loss or its gradient is not finite on `data`")


def _checked(scores, method, cause):
    """Refuse NaN / infinite scores: pruning on them would remove arbitrary heads."""
    for path, values in scores.items():
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise PruningError(
                f"{method} importance of layer {path!r} is not finite for heads {bad.tolist()} "
                f"({values[bad].tolist()}): {cause}; expected finite scores.",
                key=path,
                value=values[bad].tolist(),
            )
    return scores


def _taylor(model, layers, batches, loss_fn, check_labels):
    gate_loss = GateLoss(model, [layer.head_gates for layer in layers.values()], loss_fn)
    totals = [np.zeros(layer.num_heads) for layer in layers.values()]
    examples = 0
    for x, y, sample_weight in batches:
        check_labels(x, y)
        _, gradients = gate_loss.value_and_gradients(x, y, sample_weight)
        size = batch_size_of(x)
        for total, gradient in zip(totals, gradients, strict=True):
            total += size * np.abs(gradient)
        examples += size
    scores = {}
    for path, total in zip(layers, totals, strict=True):
        expected = total / examples
        norm = np.linalg.norm(expected)
        scores[path] = expected / norm if norm > 0 else expected
    return scores


def _ablation(model, layers, batches, loss_fn, check_labels):
    gate_loss = GateLoss(model, [layer.head_gates for layer in layers.values()], loss_fn)
    gates = gate_loss._current_gates()
    # One pass over the data; every masked variant is scored on each batch in turn.
    variants = [(None, None, gates)]
    for index, layer_gates in enumerate(gates):
        for head in np.flatnonzero(layer_gates != 0):
            masked = [values.copy() for values in gates]
            masked[index][head] = 0.0
            variants.append((index, head, masked))
    totals = np.zeros(len(variants))
    examples = 0
    for x, y, sample_weight in batches:
        check_labels(x, y)
        size = batch_size_of(x)
        for position, (_, _, gate_values) in enumerate(variants):
            totals[position] += size * gate_loss.value(x, y, sample_weight, gate_values)
        examples += size
    losses = totals / examples
    scores = [np.zeros(layer.num_heads) for layer in layers.values()]
    for position, (index, head, _) in enumerate(variants[1:], start=1):
        scores[index][head] = losses[position] - losses[0]
    return dict(zip(layers, scores, strict=True))


def _squared_norm(variable, axes_to_keep):
    value = np.asarray(keras.ops.convert_to_numpy(variable), dtype="float64")
    reduce_axes = tuple(axis for axis in range(value.ndim) if axis != axes_to_keep)
    return np.sum(np.square(value), axis=reduce_axes)


def magnitude_scores(layer):
    """Weight-magnitude score of each query head of one layer (see `head_importance`).

    Example:
        >>> layer = MultiQueryAttention(num_heads=4); layer.build((None, None, 32))
        >>> magnitude_scores(layer).shape
        (4,)
    """
    refuse_quantized(layer, "head_importance(method='magnitude')", PruningError)
    per_query_head = _squared_norm(layer.query_kernel, 1) + _squared_norm(layer.output_kernel, 0)
    per_kv_head = _squared_norm(layer.key_kernel, 1) + _squared_norm(layer.value_kernel, 1)
    if layer.use_bias:
        per_query_head = per_query_head + _squared_norm(layer.query_bias, 0)
        per_kv_head = (
            per_kv_head + _squared_norm(layer.key_bias, 0) + _squared_norm(layer.value_bias, 0)
        )
    groups = layer.num_query_groups
    shared = np.repeat(per_kv_head / groups, groups)
    return np.sqrt(per_query_head + shared)
