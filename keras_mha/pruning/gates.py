"""Reading and writing head gates, also in the middle of `fit` on JAX.

During `fit`, Keras's JAX trainer does not read variables at each step: it
takes their values once (`_get_jax_state(..., purge_model_variables=True)`,
which empties the variables), threads them through the jitted train step, and
writes them back only at the end of the epoch (`jax_state_sync()`). A gate
written to the variable mid-epoch would be ignored by the following steps and
then overwritten by the stale copy at the end of the epoch.

So before reading or writing gates we call `model.jax_state_sync()`: it puts
the trainer's current values back into the variables and marks the state as
synced, which makes the trainer take the values from the variables again
(gates included) before its next step. (Keras's `Callback.model` property
does the same sync on access; these helpers also work with a model reached
any other way.) On TensorFlow and PyTorch the train step reads the variables
themselves, so nothing is needed.
"""

from __future__ import annotations

import keras
import ml_dtypes
import numpy as np

from keras_mha import backends
from keras_mha.errors import PruningError
from keras_mha.pruning.discovery import require_attention_layers


def sync_training_state(model):
    """Make `model`'s variables current on JAX while `fit` holds their values.

    A no-op outside `fit`, when already synced, and on other backends.

    Example:
        >>> class Probe(keras.callbacks.Callback):
        ...     def on_train_batch_end(self, batch, logs=None):
        ...         sync_training_state(self.model)
        ...         print(self.model.layers[1].head_gates.numpy())
    """
    backends.current().sync_training_state(model)


def get_head_gates(model):
    """The gates of every attention layer, as `{path: np.ndarray(num_heads)}`.

    Example:
        >>> from keras_mha.layers import MultiHeadAttention
        >>> inputs = keras.Input((8, 16))
        >>> model = keras.Model(inputs, MultiHeadAttention(4, name="attention")(inputs))
        >>> get_head_gates(model)
        {'attention': array([1., 1., 1., 1.], dtype=float32)}
    """
    layers = require_attention_layers(model)
    sync_training_state(model)
    return {
        path: np.array(keras.ops.convert_to_numpy(layer.head_gates))
        for path, layer in layers.items()
    }


def set_head_gates(model, gates):
    """Set the gates of some attention layers of `model` (safe during `fit`).

    Every entry is checked before any gate is written, so on error the model
    is unchanged.

    Args:
        model: a model with keras-mha attention layers.
        gates: `{path: array of num_heads values}` with paths as in
            `find_attention_layers(model)`; layers not named keep their gates.

    Example:
        >>> from keras_mha.layers import MultiHeadAttention
        >>> inputs = keras.Input((8, 16))
        >>> model = keras.Model(inputs, MultiHeadAttention(4, name="attention")(inputs))
        >>> set_head_gates(model, {"attention": [1, 0, 1, 1]})
        >>> get_head_gates(model)["attention"]
        array([1., 0., 1., 1.], dtype=float32)
    """
    layers = require_attention_layers(model)
    checked = {}
    for path, values in gates.items():
        if path not in layers:
            raise PruningError(
                f"`gates` names the layer {path!r}, which is not an attention layer of the model; "
                f"expected one of {list(layers)}."
            )
        raw = np.asarray(values)
        expected = (layers[path].num_heads,)
        # bfloat16 is what get_head_gates returns for a bfloat16 model.
        numeric = raw.dtype.kind in "biuf" or raw.dtype == ml_dtypes.bfloat16
        if raw.shape != expected or not numeric:
            raise PruningError(
                f"`gates[{path!r}]` has shape {raw.shape}; expected {expected} (one gate per "
                f"query head, a number; received dtype {raw.dtype}).",
                key=path,
            )
        values = raw.astype("float32")
        if not np.isfinite(values).all() or (values < 0).any():
            raise PruningError(
                f"`gates[{path!r}]`={raw.tolist()} has non-finite or negative values; expected "
                "finite gates >= 0 (1 keeps a head, 0 silences it).",
                key=path,
            )
        checked[path] = values
    sync_training_state(model)
    for path, values in checked.items():
        layers[path].head_gates.assign(values)


def pruned_heads_from_gates(gates):
    """`{path: sorted indices of heads whose gate is 0}` from `get_head_gates` output.

    Example:
        >>> pruned_heads_from_gates({"attention": np.array([1.0, 0.0, 1.0, 0.0])})
        {'attention': [1, 3]}
    """
    return {path: [int(h) for h in np.flatnonzero(values == 0)] for path, values in gates.items()}
