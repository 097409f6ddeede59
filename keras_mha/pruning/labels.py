"""Checking scoring labels against the model's classes before any head is scored.

Backends disagree on a sparse label outside `[0, num_classes)`: TensorFlow
raises, PyTorch raises an index error, and JAX gathers out of range without a
word (its loss and gradients are then computed from a clipped or zero entry), so
heads would be scored on garbage. keras-mha refuses such labels itself, with
one line naming the value, on every backend.

Only the losses whose label format is known are checked: Keras's sparse and
one-hot categorical cross-entropies (by name, class or function, focal
variants included). Other losses and multi-output labels pass unchecked.
"""

from __future__ import annotations

import keras
import numpy as np

from keras_mha.errors import PruningError
from keras_mha.pruning.gate_gradients import no_gradient_tracking

_SPARSE = (keras.losses.sparse_categorical_crossentropy,)
_ONE_HOT = (
    keras.losses.categorical_crossentropy,
    keras.losses.categorical_focal_crossentropy,
)


def label_format(loss):
    """`("sparse" | "one_hot" | None, class axis, ignored class)` of a resolved loss.

    Example:
        >>> label_format(keras.losses.SparseCategoricalCrossentropy(ignore_class=-1))
        ('sparse', -1, -1)
    """
    function = getattr(loss, "fn", loss)
    options = getattr(loss, "_fn_kwargs", None) or {}
    axis = options.get("axis", -1)
    if any(function is known for known in _SPARSE):
        return "sparse", axis, options.get("ignore_class")
    if any(function is known for known in _ONE_HOT):
        return "one_hot", axis, None
    return None, axis, None


def _num_classes(model, x, axis):
    outputs = getattr(model, "outputs", None)
    if outputs and len(outputs) == 1 and outputs[0].shape[axis] is not None:
        return int(outputs[0].shape[axis])
    with no_gradient_tracking():  # A subclassed model: one forward pass tells.
        prediction = model(x, training=False)
    if isinstance(prediction, (list, tuple, dict)):
        return None
    return int(keras.ops.shape(prediction)[axis])


class LabelCheck:
    """Call on each `(x, y)` batch before scoring it; raises a `PruningError` on a bad label.

    Args:
        model: the model whose output the labels are compared with.
        loss: the loss as resolved by `batches.resolve_loss` (its `.loss`).
        argument: the data's argument name, for messages.

    Example:
        >>> inputs = keras.Input((4,))
        >>> model = keras.Model(inputs, keras.layers.Dense(3)(inputs))  # 3 classes
        >>> check = LabelCheck(model, keras.losses.get("sparse_categorical_crossentropy"))
        >>> check(np.ones((3, 4)), np.array([0, 1, 3]))
        Traceback (most recent call last):
        ...
        keras_mha.errors.PruningError: `data` has the label 3, outside the model's 3 classes ...
    """

    def __init__(self, model, loss, argument="data"):
        self.model = model
        self.kind, self.axis, self.ignore_class = label_format(loss)
        self.name = getattr(getattr(loss, "fn", loss), "__name__", "the loss")
        self.argument = argument
        self.num_classes = None

    def __call__(self, x, y):
        if self.kind is None or y is None or isinstance(y, (dict, list, tuple)):
            return
        if self.num_classes is None:
            self.num_classes = _num_classes(self.model, x, self.axis)
            if self.num_classes is None:
                self.kind = None  # Several outputs: the format is the loss's business.
                return
        labels = np.asarray(y)
        if labels.dtype.kind not in "biuf":
            self._refuse(f"labels of dtype {labels.dtype}", "numbers")
        if self.kind == "one_hot":
            self._check_one_hot(labels)
        else:
            self._check_sparse(labels)

    def _refuse(self, what, expected, value=None):
        raise PruningError(
            f"`{self.argument}` has {what} ({self.name}); expected {expected}.",
            key=self.argument,
            value=value,
        )

    def _check_sparse(self, labels):
        classes = self.num_classes
        bad = ~np.isfinite(labels) if labels.dtype.kind == "f" else np.zeros(labels.shape, bool)
        with np.errstate(invalid="ignore"):
            bad |= (labels < 0) | (labels >= classes) | (labels != np.floor(labels))
        if self.ignore_class is not None:
            bad &= labels != self.ignore_class
        if bad.any():
            value = labels[bad].flat[0].item()
            ignored = (
                "" if self.ignore_class is None else f" or the ignored class {self.ignore_class}"
            )
            self._refuse(
                f"the label {value!r}, outside the model's {classes} classes",
                f"integer class indices in [0, {classes}){ignored}",
                value,
            )

    def _check_one_hot(self, labels):
        classes = self.num_classes
        if labels.ndim == 0 or labels.shape[self.axis] != classes:
            self._refuse(
                f"labels of shape {labels.shape}",
                f"one-hot labels with {classes} classes on axis {self.axis} (the model's output)",
            )
        if not np.isfinite(labels).all():
            value = labels[~np.isfinite(labels)].flat[0].item()
            self._refuse(f"the label value {value!r}", "finite label values", value)
