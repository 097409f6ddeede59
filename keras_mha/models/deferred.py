"""Variables built without memory, then created from loaded arrays without a copy.

Building a model with zero-filled variables and assigning each checkpoint tensor over
them holds, for the largest tensor, its zeros, the array read from the file and the
backend's copy at once. Here the model is built inside `deferred_variables()`: every
variable gets its shape and dtype but no buffer (Keras's own deferred initialisation,
`keras.StatelessScope(initialize_variables=False)`), and `fill` then creates each one
from its loaded array. On the CPU the array itself becomes the variable's buffer:
`torch.from_numpy`, `jax.device_put` of a 64-byte-aligned array and TensorFlow's DLPack
import all share the memory instead of copying it; on an accelerator the array is
copied to the device once and freed.

Keras exposes no public call to initialise a deferred variable from a value, so this
module uses its internals: the list of pending variables in
`keras.src.backend.common.global_state`, and a variable's `_value` (None while
pending), `_initializer` and `_deferred_initialize()`. `deferral_supported` checks for
them first (and tests/models/test_load_memory.py pins them on the installed Keras).
Where they are missing, or a `keras.distribution` is active (its layouts place
variables when they are created), models are built eagerly and `fill` assigns
instead: same weights, with the earlier peak memory (1.4-1.75x the checkpoint).

Example:
    >>> with deferred_variables() as pending:  # doctest: +SKIP
    ...     layer = keras.layers.Dense(4)
    ...     layer.build((None, 3))
    >>> fill(layer.kernel, np.ones((3, 4), "float32"))  # doctest: +SKIP
    >>> pending.initialize_rest()  # the bias gets its own initializer  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import keras
import numpy as np

from keras_mha import backends
from keras_mha.models.safetensors_reader import BUFFER_ALIGNMENT, aligned_empty

_PENDING = "uninitialized_variables"  # Keras's global list of deferred variables


def _global_state():
    try:
        from keras.src.backend.common import global_state
    except ImportError:
        return None
    return global_state


def deferral_supported() -> bool:
    """Whether variables can be created now without memory and filled later."""
    if _global_state() is None or not hasattr(keras.Variable, "_deferred_initialize"):
        return False
    if keras.distribution.distribution() is not None:
        return False
    if not backends.current().supports_deferred_variables():  # JAX's NNX variables
        return False
    # Inside a caller's stateless scope variables cannot be initialised at all.
    return _global_state().get_global_attribute("stateless_scope") is None


def is_pending(variable) -> bool:
    """True for a variable built inside `deferred_variables()` and not filled yet."""
    return getattr(variable, "_value", 0) is None


@dataclass
class PendingVariables:
    """The variables created inside one `deferred_variables()` block.

    Attributes:
        deferred: False when the block built eagerly (`deferral_supported()` was False).
        variables: every variable created in the block (filled after it closes).
    """

    deferred: bool
    variables: list = field(default_factory=list)

    def initialize_rest(self) -> None:
        """Give every variable still without a value its own initializer's value."""
        initialize_rest(self.variables)


def initialize_rest(variables) -> None:
    """Initialise each pending variable of `variables` with its own initializer."""
    for variable in variables:
        if is_pending(variable):
            variable._deferred_initialize()


@contextlib.contextmanager
def deferred_variables():
    """Variables created inside get their shapes and dtypes but no memory.

    Yields a `PendingVariables`; its `variables` are listed when the block closes. The
    block's variables are taken off Keras's own pending list, so no later Keras scope
    initialises them behind the caller's back: fill them (`fill`) and call
    `initialize_rest()`, or drop them.
    """
    pending = PendingVariables(deferral_supported())
    if not pending.deferred:
        yield pending
        return
    state = _global_state()
    before = {id(v) for v in state.get_global_attribute(_PENDING, []) or []}
    try:
        with keras.StatelessScope(initialize_variables=False):
            yield pending
    finally:
        queued = state.get_global_attribute(_PENDING, []) or []
        pending.variables = [v for v in queued if id(v) not in before]
        state.set_global_attribute(_PENDING, [v for v in queued if id(v) in before])


def _adoptable(array: np.ndarray) -> bool:
    return array.flags.c_contiguous and array.ctypes.data % BUFFER_ALIGNMENT == 0


def backend_tensor(array: np.ndarray):
    """A backend tensor sharing `array`'s memory where the backend allows it.

    `array` must be C-contiguous and 64-byte aligned (`aligned_empty`), and nothing else
    may write to it afterwards: the tensor (and the variable made from it) owns it.
    """
    return backends.current().tensor_from_numpy(array)


def owned_array(value: np.ndarray, dtype, *, shared: bool = False) -> np.ndarray:
    """`value` as a new aligned C-contiguous array of `dtype`, or `value` itself when it
    already is one and is not `shared` with another variable's value.

    Transposed and reshaped views (the weight-name transforms) are copied once, straight
    into the aligned array, casting on the way (float32 -> bfloat16 rounds to nearest
    even, as the backends' casts do).
    """
    dtype = np.dtype(dtype)
    if value.dtype == dtype and not shared and _adoptable(value):
        return value
    owned = aligned_empty(value.shape, dtype)
    np.copyto(owned, value, casting="unsafe")
    return owned


def fill(variable, value: np.ndarray, *, shared: bool = False) -> None:
    """Give `variable` the value `value` (its shape), creating it from the array when it
    is pending, else assigning.

    Args:
        variable: a Keras variable, pending (`deferred_variables()`) or initialised.
        value: a NumPy array of the variable's shape (any dtype; cast to the variable's).
        shared: `value` shares memory with another variable's value (a view of one
            fused checkpoint tensor split in parts): it is copied, never adopted.
    """
    dtype = keras.backend.standardize_dtype(variable.dtype)
    array = owned_array(np.asarray(value), dtype, shared=shared)
    if tuple(array.shape) != tuple(variable.shape):
        raise ValueError(
            f"value of shape {tuple(array.shape)} for the variable {variable.path!r} of "
            f"shape {tuple(variable.shape)}"
        )
    tensor = backend_tensor(array)
    del array
    if is_pending(variable):
        variable._initializer = lambda shape, dtype: tensor
        variable._deferred_initialize()
    else:
        variable.assign(tensor)


__all__ = [
    "PendingVariables",
    "backend_tensor",
    "deferral_supported",
    "deferred_variables",
    "fill",
    "initialize_rest",
    "is_pending",
    "owned_array",
]
