"""The data and loss that heads are scored on, in one backend-neutral form.

Scoring data is turned into NumPy `(x, y, sample_weight)` batches, which every
backend's model accepts, whatever the data came as (arrays, `tf.data`, a
PyTorch `DataLoader`, a `keras.utils.PyDataset`, a list or generator of batches).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import keras
import numpy as np
from keras import ops

from keras_mha.errors import PruningError


def _to_numpy(value):
    if value is None:
        return None
    if hasattr(value, "detach"):  # torch.Tensor
        value = value.detach().cpu()
    return np.asarray(value)


def _structure_to_numpy(value):
    return keras.tree.map_structure(_to_numpy, value) if value is not None else None


def _unpack(batch):
    if isinstance(batch, tuple) and 1 <= len(batch) <= 3:
        x, y, sample_weight = (*batch, None, None)[:3]
    else:
        x, y, sample_weight = batch, None, None
    return _structure_to_numpy(x), _structure_to_numpy(y), _structure_to_numpy(sample_weight)


def _num_samples(x):
    first = keras.tree.flatten(x)[0]
    return int(first.shape[0]) if getattr(first, "ndim", 0) else 1


def _is_arrays_tuple(data):
    if not isinstance(data, tuple) or not 2 <= len(data) <= 3:
        return False
    leaves = keras.tree.flatten(data[0])
    return bool(leaves) and all(hasattr(leaf, "shape") for leaf in leaves)


def check_batching(batch_size, max_batches):
    """`(batch_size, max_batches)` as ints: positive integers (NumPy ones too), `max_batches`
    also None; bools, floats, NaN and values < 1 raise a `PruningError`.

    Example:
        >>> check_batching(np.int64(16), None)
        (16, None)
    """
    for name, value, optional in (
        ("batch_size", batch_size, False),
        ("max_batches", max_batches, True),
    ):
        if optional and value is None:
            continue
        if (
            isinstance(value, (bool, np.bool_))
            or not isinstance(value, (int, np.integer))
            or (value <= 0)
        ):
            expected = "a positive integer or None" if optional else "a positive integer"
            raise PruningError(f"`{name}` must be {expected}; received {value!r}.", key=name)
    return int(batch_size), None if max_batches is None else int(max_batches)


class Batches:
    """A re-iterable stream of NumPy `(x, y, sample_weight)` batches.

    Args:
        data: one of
            - a tuple `(x, y)` or `(x, y, sample_weight)` of arrays (or dicts /
              lists of arrays for multi-input models), cut into `batch_size` batches;
            - a single array `x` (for losses that need no targets);
            - a re-iterable of batches, each `(x, y)`, `(x, y, sample_weight)` or
              `x`: a list, a `tf.data.Dataset`, a PyTorch `DataLoader`, a
              `keras.utils.PyDataset`. Iterated afresh every time heads are scored;
            - an iterator or generator of such batches: read once (at most
              `max_batches` batches) and kept.
        batch_size: batch size for array data.
        max_batches: use at most this many batches each time (None: all).
        argument: the argument name used in error messages.

    Raises:
        ValueError: when the data yields no batch.
        TypeError: data that is neither arrays nor an iterable of batches.

    Example:
        >>> batches = Batches((np.zeros((10, 4, 8)), np.zeros(10)), batch_size=4)
        >>> [_num_samples(x) for x, y, w in batches]
        [4, 4, 2]
    """

    def __init__(self, data, batch_size=32, max_batches=None, argument="data"):
        batch_size, max_batches = check_batching(batch_size, max_batches)
        if data is None:
            raise ValueError(f"`{argument}` is None; expected data to score heads on.")
        self.batch_size = batch_size
        self.max_batches = max_batches
        self._arrays = None
        self._iterable = None
        if _is_arrays_tuple(data) or hasattr(data, "shape") or isinstance(data, dict):
            self._arrays = _unpack(data if isinstance(data, tuple) else (data,))
            size = _num_samples(self._arrays[0])
            description = f"{size} samples"
            empty = size == 0
        elif isinstance(data, keras.utils.PyDataset):
            self._iterable = _PyDatasetView(data)
            description = f"a PyDataset of {len(self._iterable)} batches"
            empty = len(self._iterable) == 0
        elif not isinstance(data, Iterable):
            raise TypeError(
                f"`{argument}` is {str(data)[:40]!r} ({type(data).__name__}); expected arrays, "
                "(x, y) arrays, or an iterable of batches"
            )
        elif iter(data) is data:  # A one-shot iterator or generator: keep what it yields.
            self._iterable = list(itertools.islice(data, max_batches))
            description = f"an iterator that yielded {len(self._iterable)} batches"
            empty = not self._iterable
        else:
            self._iterable = data
            description = type(data).__name__
            empty = next(iter(data), None) is None
        if empty:
            raise ValueError(
                f"`{argument}` yields no batches ({description}); expected at least one batch "
                "of examples to score heads on."
            )

    @property
    def label_array(self):
        """All labels `y` when the data are arrays (None otherwise: not read ahead)."""
        return None if self._arrays is None else self._arrays[1]

    @property
    def first_inputs(self):
        """The inputs `x` of the first batch."""
        return next(iter(self))[0]

    def __iter__(self):
        if self._arrays is not None:
            x, y, sample_weight = self._arrays
            size = _num_samples(x)
            starts = range(0, size, self.batch_size)
            for start in itertools.islice(starts, self.max_batches):
                cut = lambda a, s=start: a[s : s + self.batch_size]  # noqa: B023
                yield (
                    keras.tree.map_structure(cut, x),
                    None if y is None else keras.tree.map_structure(cut, y),
                    None if sample_weight is None else cut(sample_weight),
                )
            return
        for batch in itertools.islice(iter(self._iterable), self.max_batches):
            yield _unpack(batch)


class _PyDatasetView:
    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return self.dataset.num_batches or 0

    def __iter__(self):
        return (self.dataset[index] for index in range(len(self)))


def batch_size_of(x):
    """Number of examples in a batch `x` (array or structure of arrays).

    Example:
        >>> batch_size_of({"tokens": np.zeros((3, 5))})
        3
    """
    return _num_samples(x)


def resolve_loss(model, loss):
    """A scalar loss function `(y_true, y_pred, sample_weight) -> tensor`.

    Args:
        model: used when `loss` is None: its compiled loss.
        loss: None, a loss name (`"sparse_categorical_crossentropy"`), a
            `keras.losses.Loss`, or a callable `(y_true, y_pred) -> tensor`
            whose result is averaged to a scalar.

    Example:
        >>> from keras_mha.layers import MultiHeadAttention
        >>> inputs = keras.Input((8, 16))
        >>> model = keras.Model(inputs, MultiHeadAttention(4, name="attention")(inputs))
        >>> loss_fn = resolve_loss(model, "mse")
        >>> float(loss_fn(np.zeros((2, 3)), np.ones((2, 3)), None))
        1.0
    """
    source = "loss"
    if loss is None:
        loss = getattr(model, "loss", None)
        source = "the model's compiled loss"
        if loss is None:
            raise ValueError(
                "`loss` is None and the model was not compiled with a loss; pass `loss=` (a loss "
                "name, a keras.losses.Loss or a callable (y_true, y_pred) -> tensor)."
            )
    if isinstance(loss, (dict, list, tuple)):
        raise ValueError(
            f"{source} is a {type(loss).__name__} of per-output losses ({loss!r}); pass `loss=` "
            "as one callable (y_true, y_pred) -> scalar over the model's whole output."
        )
    try:
        function = keras.losses.get(loss) if isinstance(loss, str) else loss
    except ValueError as error:
        raise ValueError(f"`loss`={loss!r} is not a known Keras loss: {error}") from None
    if not callable(function):
        raise ValueError(f"`loss` must be a loss name or a callable; received {loss!r}.")

    def scalar_loss(y_true, y_pred, sample_weight=None):
        if isinstance(function, keras.losses.Loss):
            value = function(y_true, y_pred, sample_weight=sample_weight)
        else:
            value = function(y_true, y_pred)
            if sample_weight is not None:
                weights = ops.cast(sample_weight, value.dtype)
                weights = ops.reshape(weights, ops.shape(weights)[:1] + (1,) * (value.ndim - 1))
                value = value * weights
        return ops.mean(ops.cast(value, "float32"))

    scalar_loss.loss = function  # What it wraps, for the label checks (`labels.LabelCheck`).
    return scalar_loss
