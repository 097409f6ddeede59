"""Model inputs in keras-hub's convention, `{"token_ids", "padding_mask"}` or bare token ids,
and the checks every model makes on them wherever they enter.

- `unpack_inputs(inputs)`: `(token_ids, padding_mask or None, segment_ids or None)`.
- `as_arrays(inputs)`: nested Python lists (`model([[1, 2, 3]])`) as NumPy arrays; a
  ragged list is refused, naming the key.
- `check_token_ids(ids, vocab_size)`: one min and one max per batch; skipped while tracing.
- `CheckedInputs`: the models' mixin that runs their `check_inputs` on every direct call
  and on every batch `fit`, `evaluate` and `predict` hand to their compiled steps, where
  the traced call cannot see values: an id outside the vocabulary would otherwise give
  NaN logits (JAX), wrap around (a negative id on JAX and TensorFlow) or fail deep inside
  the backend.

Example:
    >>> token_ids, padding_mask, extra = unpack_inputs({"token_ids": ids, "padding_mask": m})
    ... # doctest: +SKIP
"""

from __future__ import annotations

import itertools

import numpy as np
from keras import ops

from keras_mha.errors import UsageError
from keras_mha.planning.config_values import shown

INPUT_KEYS = ("token_ids", "padding_mask", "segment_ids")


def unpack_inputs(inputs, *, allow_segments=False):
    """`(token_ids, padding_mask or None, segment_ids or None)` from a dict or a tensor."""
    if isinstance(inputs, dict):
        unknown = sorted(set(inputs) - set(INPUT_KEYS if allow_segments else INPUT_KEYS[:2]))
        if unknown or "token_ids" not in inputs:
            expected = INPUT_KEYS if allow_segments else INPUT_KEYS[:2]
            raise UsageError(
                f"model inputs: a dict needs 'token_ids' and may hold {list(expected[1:])}; "
                f"received keys {shown(sorted(map(str, inputs)))}",
                key="inputs",
            )
        token_ids = inputs["token_ids"]
        padding_mask = inputs.get("padding_mask")
        segment_ids = inputs.get("segment_ids")
    else:
        token_ids, padding_mask, segment_ids = inputs, None, None
    named = (("token_ids", token_ids), ("padding_mask", padding_mask), ("segment_ids", segment_ids))
    for name, value in named:
        if value is not None and not hasattr(value, "shape"):
            raise UsageError(
                f"{name} is a {type(value).__name__}; expected a (batch, length) array or tensor",
                key=name,
            )
    if len(token_ids.shape) != 2:
        raise UsageError(
            f"token_ids must have shape (batch, length); received {tuple(token_ids.shape)}",
            key="token_ids",
        )
    for name, value in named[1:]:
        if value is not None and tuple(value.shape) != tuple(token_ids.shape):
            raise UsageError(
                f"{name} has shape {tuple(value.shape)}; expected the shape of token_ids "
                f"{tuple(token_ids.shape)}",
                key=name,
            )
    return token_ids, padding_mask, segment_ids


def as_array(value, name: str):
    """`value` as a NumPy array when it is a (nested) Python list or tuple, else unchanged.

    Raises:
        UsageError: a ragged list (rows of different lengths), naming `name`.

    Example:
        >>> as_array([[1, 2, 3]], "token_ids").shape
        (1, 3)
    """
    if not isinstance(value, (list, tuple)):
        return value
    try:
        array = np.asarray(value)
    except ValueError:  # NumPy refuses rows of different lengths
        array = None
    if array is None or array.dtype == object:
        lengths = sorted({len(row) for row in value if isinstance(row, (list, tuple))})
        raise UsageError(
            f"{name}: the rows have different lengths {shown(lengths)}; expected a rectangular "
            "(batch, length) array (pad the short rows and pass padding_mask)",
            key=name,
        )
    return array


def as_arrays(inputs):
    """`inputs` (a dict or bare token ids) with every Python list made a NumPy array."""
    if isinstance(inputs, dict):
        return {key: as_array(value, str(key)) for key, value in inputs.items()}
    return as_array(inputs, "token_ids")


def concrete_values(tensor):
    """NumPy values of `tensor`, or None while tracing (jit, tf.function, symbolic)."""
    if tensor is None:
        return None
    if isinstance(tensor, np.ndarray):
        return tensor
    try:
        from keras_mha import backends

        if not backends.current().has_value(tensor):
            return None
        return np.asarray(ops.convert_to_numpy(tensor))
    except Exception:  # A tracer has no value yet: the check is skipped.
        return None


def check_token_ids(token_ids, vocab_size, *, argument="token_ids"):
    """UsageError (a ValueError) when a concrete id is outside [0, vocab_size); skipped while
    tracing.

    Example:
        >>> check_token_ids(np.array([[1, 200]]), 100)
        Traceback (most recent call last):
        keras_mha.errors.UsageError: token_ids holds 200, outside the vocabulary [0, 100) ...
    """
    values = concrete_values(token_ids)
    if values is None or values.size == 0:
        return
    if not np.issubdtype(values.dtype, np.integer):
        raise UsageError(
            f"{argument} must be integers; received dtype {values.dtype}", key=argument
        )
    low, high = int(values.min()), int(values.max())
    bad = low if low < 0 else high if high >= vocab_size else None
    if bad is not None:
        raise UsageError(
            f"{argument} holds {bad}, outside the vocabulary [0, {vocab_size}) of this model",
            key=argument,
            value=bad,
        )


class CheckedInputs:
    """Mixin of the models: `check_inputs(inputs)` on every call and every batch of data.

    A subclass defines `check_inputs(inputs) -> inputs` (refusing bad ones). Keras's
    `fit`, `evaluate` and `predict` run the model inside compiled steps, where a traced
    call cannot see the values; their step functions are wrapped so that the batches of
    each step are checked on the host first (one min and max of the ids per batch).
    """

    def check_inputs(self, inputs):
        raise NotImplementedError

    def __call__(self, inputs, *args, **kwargs):
        # Checked before Keras's __call__, which would wrap the error in a long report.
        return super().__call__(self.check_inputs(inputs), *args, **kwargs)

    def make_train_function(self, force=False):
        super().make_train_function(force)
        self.train_function = self._checking_batches(self.train_function, _TRAIN_STATE)
        return self.train_function

    def make_test_function(self, force=False):
        super().make_test_function(force)
        self.test_function = self._checking_batches(self.test_function, _TEST_STATE)
        return self.test_function

    def make_predict_function(self, force=False):
        super().make_predict_function(force)
        self.predict_function = self._checking_batches(self.predict_function, _PREDICT_STATE)
        return self.predict_function

    def _checking_batches(self, step_function, state_names):
        """`step_function` with the batches of each call checked first.

        Every backend passes one step's data last: a list of batches (PyTorch, and
        TensorFlow's predict) or an iterator of them (JAX; TensorFlow's fit and evaluate).
        An iterator is read here, one step's batches, and handed on as a Python iterator,
        which every backend's step function also accepts (their `*_on_batch` path). JAX
        passes the variables' values first (`state_names`), having detached them from the
        variables: a refused batch gives them back before the error is raised.
        """
        if step_function is None or getattr(step_function, "checks_inputs", False):
            return step_function
        from keras.utils import unpack_x_y_sample_weight

        def checked(*arguments):
            *state, data = arguments
            if isinstance(data, list):
                batches = data
            else:
                batches = list(itertools.islice(data, self.steps_per_execution))
                if not batches:
                    raise StopIteration
            try:
                for batch in batches:
                    self.check_inputs(unpack_x_y_sample_weight(batch)[0])
            except UsageError:
                if state:
                    self._jax_state = dict(zip(state_names, state[0], strict=False))
                    self._jax_state_synced = False
                    self.jax_state_sync()
                raise
            return step_function(*state, batches if isinstance(data, list) else iter(batches))

        checked.checks_inputs = True
        return checked


# The values JAX's step functions take first, in order (keras/src/backend/jax/trainer.py).
_TRAIN_STATE = (
    "trainable_variables",
    "non_trainable_variables",
    "optimizer_variables",
    "metrics_variables",
)
_TEST_STATE = ("trainable_variables", "non_trainable_variables", "metrics_variables")
_PREDICT_STATE = ("trainable_variables", "non_trainable_variables")
