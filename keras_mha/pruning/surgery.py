"""Model-level physical removal of the heads whose gate is 0."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import keras
import numpy as np

from keras_mha.errors import PruningError
from keras_mha.layers import validation
from keras_mha.layers.head_surgery import plan_head_removal
from keras_mha.pruning.discovery import require_attention_layers
from keras_mha.pruning.gates import sync_training_state


def _fresh_optimizer(optimizer):
    if isinstance(optimizer, keras.optimizers.Optimizer):
        # Its slot variables have the old shapes; start again from its config.
        return optimizer.__class__.from_config(optimizer.get_config())
    return optimizer


def check_flag(name, value):
    """`value` when it is True or False (NumPy booleans too); else `PruningError`.

    Example:
        >>> check_flag("recompile", True)
        True
    """
    try:
        return validation.flag(name, value)
    except ValueError as error:  # the layers' check, raised as pruning's error class
        raise PruningError(str(error), key=name) from None


def prune_heads(model, heads=None, recompile=True):
    """Physically remove attention heads from every keras-mha layer of `model`.

    By default the heads removed are those whose gate is 0 (what `HeadPruning`
    gated off), so the pruned model computes the same outputs as the gated
    one, with smaller kernels, fewer parameters and fewer FLOPs. A KV head goes
    with the last of its query heads. Every layer's removal is checked before
    any layer changes, so on error the model is untouched.

    The pruned model saves to `.keras` and loads back with its new shape.
    Compiled functions are dropped (they hold the old variables), and a
    compiled model is compiled again with the same loss and metrics and a
    fresh optimizer of the same configuration (its slot variables had the old
    shapes, so optimizer state such as momentum starts again).

    Args:
        model: a built model with keras-mha attention layers.
        heads: None (remove gated-off heads) or `{path: head indices}` for the
            layers to prune; paths as in `find_attention_layers`.
        recompile: compile a compiled model again (see above).

    Returns:
        `{path: sorted removed head indices}` for every attention layer.

    Raises:
        PruningError: `heads` names an unknown layer, or has an index that is
            not an integer in range (floats, strings and bools included), a
            repeated index, or a removal that leaves a layer irregular or empty.
            Nothing is changed.

    Example:
        >>> from keras_mha.layers import MultiHeadAttention
        >>> inputs = keras.Input((8, 16))
        >>> model = keras.Model(inputs, MultiHeadAttention(4, name="attention")(inputs))
        >>> from keras_mha.pruning import find_attention_layers, set_head_gates
        >>> set_head_gates(model, {"attention": [1, 0, 1, 0]})
        >>> prune_heads(model)
        {'attention': [1, 3]}
        >>> find_attention_layers(model)["attention"].num_heads
        2
    """
    check_flag("recompile", recompile)
    layers = require_attention_layers(model)
    sync_training_state(model)
    if heads is None:
        requested = {
            path: np.flatnonzero(keras.ops.convert_to_numpy(layer.head_gates) == 0).tolist()
            for path, layer in layers.items()
        }
    else:
        if not isinstance(heads, Mapping):
            raise PruningError(
                f"`heads` must be None or a dict {{layer path: head indices}}; received {heads!r}."
            )
        unknown = sorted(set(heads) - set(layers), key=repr)
        if unknown:
            raise PruningError(
                f"`heads` names {unknown}, which are not attention layers of the model; expected "
                f"paths among {list(layers)}."
            )
        requested = {path: heads.get(path, ()) for path in layers}
    removal = {}
    for path, layer in layers.items():
        try:
            kept, _ = plan_head_removal(layer.num_heads, layer.num_key_value_heads, requested[path])
        except ValueError as error:
            raise PruningError(f"Cannot prune layer {path!r}: {error}", key=path) from None
        removal[path] = sorted(set(range(layer.num_heads)) - set(kept))

    with variables_replaced(model, recompile=recompile):
        for path, layer in layers.items():
            if removal[path]:
                layer.prune_heads(removal[path])
    return removal


@contextlib.contextmanager
def variables_replaced(model, *, recompile=True):
    """Around code that re-creates attention variables: drop `model`'s traced functions after.

    The traced train/test/predict functions captured the old variables. A compiled
    model is compiled again (when `recompile`) with the same loss and metrics and a
    fresh optimizer of the same configuration: its slot variables had the old shapes.

    Example:
        >>> with variables_replaced(model):  # doctest: +SKIP
        ...     layer.prune_heads([0])
    """
    compile_config = None
    if recompile and getattr(model, "compiled", False) and hasattr(model, "_compile_config"):
        compile_config = dict(model._compile_config.config)
    try:
        yield
    finally:
        if isinstance(model, keras.Model):
            model.train_function = model.test_function = model.predict_function = None
        if compile_config is not None:
            compile_config["optimizer"] = _fresh_optimizer(compile_config["optimizer"])
            model.compile(**compile_config)
