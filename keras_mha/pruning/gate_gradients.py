"""The loss as a function of the head gates, and its gradient: one module per backend branch.

Gates enter the forward pass as inputs of a pure function; the model's
variables are never written. How that function is built and differentiated
is the only backend-specific code of the pruning package:

- JAX: `model.stateless_call` with the gate values substituted into the
  non-trainable variable values, `jax.value_and_grad`, and `jax.jit` so that
  scoring many batches (or many masked heads) compiles once per batch shape
  instead of dispatching every op eagerly. The jitted pair is kept on the
  model, keyed by its variables and the loss, so that every `GateLoss` of
  the same model and loss (one per `head_importance` call, i.e. one per
  `HeadPruning` step) reuses the compiled programs.
- PyTorch: the model called inside a `keras.StatelessScope` that maps each
  gate variable to a leaf tensor with `requires_grad=True`; `torch.autograd.grad`.
- TensorFlow: the same scope with gate tensors watched by a `tf.GradientTape`.

`tests/pruning/test_gradients.py` checks each branch against central finite
differences (taken by writing the gate variables and running plain forward
passes) and the three branches against each other.
"""

from __future__ import annotations

import contextlib
import inspect

import keras
import numpy as np


def _to_numpy(value, dtype="float64"):
    return np.asarray(keras.ops.convert_to_numpy(value), dtype=dtype)


class GateLoss:
    """`loss(gates)` of one model on one batch, and `d loss / d gates`.

    Inference mode (`training=False`: no dropout). Gate values not given are
    the variables' current values.

    Args:
        model: a built Keras model.
        gate_variables: the `head_gates` variables that become inputs.
        loss_fn: `(y_true, y_pred, sample_weight) -> scalar tensor`, e.g. from
            `keras_mha.pruning.batches.resolve_loss`.

    Example:
        >>> from keras_mha.layers import MultiHeadAttention
        >>> inputs = keras.Input((8, 16))
        >>> model = keras.Model(inputs, MultiHeadAttention(4, name="attention")(inputs))
        >>> from keras_mha.pruning import find_attention_layers
        >>> from keras_mha.pruning.batches import resolve_loss
        >>> x = np.ones((2, 8, 16), "float32")
        >>> gates = [layer.head_gates for layer in find_attention_layers(model).values()]
        >>> gate_loss = GateLoss(model, gates, resolve_loss(model, "mse"))
        >>> loss, gradients = gate_loss.value_and_gradients(x, x)
        >>> masked = gate_loss.value(x, x, gate_values=[np.array([0., 1., 1., 1.])])
    """

    def __init__(self, model, gate_variables, loss_fn):
        self.model = model
        self.gate_variables = list(gate_variables)
        self.loss_fn = loss_fn
        self.backend = keras.backend.backend()
        if self.backend not in ("jax", "torch", "tensorflow"):
            raise ValueError(
                "Gate gradients support the backends ['jax', 'tensorflow', 'torch']; the Keras "
                f"backend is {self.backend!r}."
            )
        self._jax_functions = None

    def _current_gates(self):
        return [
            np.asarray(keras.ops.convert_to_numpy(v), dtype=v.dtype) for v in self.gate_variables
        ]

    def value(self, x, y=None, sample_weight=None, gate_values=None):
        """The loss (a float) with the given gate values; forward pass only."""
        gate_values = self._current_gates() if gate_values is None else gate_values
        if self.backend == "jax":
            loss = self._jax()[0](gate_values, *self._jax_state(), x, y, sample_weight)
            return float(loss)
        with no_gradient_tracking():
            return float(_to_numpy(self._scoped_loss(gate_values, x, y, sample_weight)))

    def value_and_gradients(self, x, y=None, sample_weight=None, gate_values=None):
        """`(loss, [np.ndarray(num_heads) per gate variable])` at the given gate values."""
        gate_values = self._current_gates() if gate_values is None else gate_values
        branch = {
            "jax": self._jax_gradients,
            "torch": self._torch_gradients,
            "tensorflow": self._tensorflow_gradients,
        }[self.backend]
        loss, gradients = branch(gate_values, x, y, sample_weight)
        return float(_to_numpy(loss)), [_to_numpy(gradient) for gradient in gradients]

    # ------------------------------------------------------------ torch / tf
    def _scoped_loss(self, gate_values, x, y, sample_weight):
        mapping = list(zip(self.gate_variables, gate_values, strict=True))
        with keras.StatelessScope(state_mapping=mapping):
            return self.loss_fn(y, self.model(x, training=False), sample_weight)

    def _torch_gradients(self, gate_values, x, y, sample_weight):
        import torch

        # Through float32: torch cannot read NumPy's bfloat16 (ml_dtypes) arrays.
        leaves = [
            torch.tensor(
                np.asarray(value, dtype=np.float32),
                dtype=variable.value.dtype,
                device=variable.value.device,
                requires_grad=True,
            )
            for variable, value in zip(self.gate_variables, gate_values, strict=True)
        ]
        with torch.enable_grad():
            loss = self._scoped_loss(leaves, x, y, sample_weight)
            # allow_unused: a tracked layer the loss never reaches has no gradient.
            gradients = torch.autograd.grad(loss, leaves, allow_unused=True)
        gradients = [
            torch.zeros_like(leaf) if gradient is None else gradient
            for leaf, gradient in zip(leaves, gradients, strict=True)
        ]
        return loss.detach(), gradients

    def _tensorflow_gradients(self, gate_values, x, y, sample_weight):
        import tensorflow as tf

        tensors = [tf.constant(value) for value in gate_values]
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            loss = self._scoped_loss(tensors, x, y, sample_weight)
        gradients = tape.gradient(loss, tensors, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return loss, gradients

    # ------------------------------------------------------------------ jax
    def _jax_state(self):
        return (
            [v.value for v in self.model.trainable_variables],
            [v.value for v in self.model.non_trainable_variables],
        )

    def _jax(self):
        if self._jax_functions is None:
            self._jax_functions = _cached_jax_functions(
                self.model, self.gate_variables, self.loss_fn
            )
        return self._jax_functions

    def _jax_gradients(self, gate_values, x, y, sample_weight):
        import jax.numpy as jnp

        gates = [jnp.asarray(value) for value in gate_values]
        return self._jax()[1](gates, *self._jax_state(), x, y, sample_weight)


# Attribute of the model holding its jitted gate-loss functions. Set with
# `object.__setattr__` so that Keras's attribute tracking leaves it alone.
_JAX_CACHE_ATTRIBUTE = "_keras_mha_gate_loss_functions"


def _cached_jax_functions(model, gate_variables, loss_fn):
    """`(jit(loss), jit(value_and_grad(loss)))` for this model, gates and loss, built once.

    A new `jax.jit` of a new closure compiles again even for identical shapes,
    so building them per `GateLoss` made every `head_importance` call (every
    `HeadPruning` step) recompile the whole model. The key holds what the
    traced function depends on beyond its arguments: the position of every
    non-trainable variable (gates are substituted by position) and the loss.
    Entries keep their loss object alive, so an `id` is never reused by
    another object while its entry exists.
    """
    loss = getattr(loss_fn, "loss", loss_fn)  # `resolve_loss` wraps the user's loss.
    key = (
        tuple(id(v) for v in model.non_trainable_variables),
        tuple(id(v) for v in gate_variables),
        id(loss),
    )
    cache = getattr(model, _JAX_CACHE_ATTRIBUTE, None)
    if cache is None:
        cache = {}
        object.__setattr__(model, _JAX_CACHE_ATTRIBUTE, cache)
    entry = cache.get(key)
    if entry is None:
        entry = (loss, _build_jax_functions(model, gate_variables, loss_fn))
        cache[key] = entry
    return entry[1]


def _build_jax_functions(model, gate_variables, loss_fn):
    import jax

    positions = {id(v): i for i, v in enumerate(model.non_trainable_variables)}
    missing = [v.path for v in gate_variables if id(v) not in positions]
    if missing:
        raise ValueError(
            f"The gate variables {missing} are not non-trainable variables of the model; "
            "their layers must be tracked by the model."
        )
    gate_positions = [positions[id(v)] for v in gate_variables]
    # `stateless_call` calls `model.call` directly, without the filtering of
    # `__call__`: pass `training` only where `call` takes it.
    parameters = inspect.signature(model.call).parameters
    takes_training = "training" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )
    call_kwargs = {"training": False} if takes_training else {}

    def loss_of_gates(gates, trainable, non_trainable, x, y, sample_weight):
        non_trainable = list(non_trainable)
        for position, gate in zip(gate_positions, gates, strict=True):
            non_trainable[position] = gate
        y_pred, _ = model.stateless_call(trainable, non_trainable, x, **call_kwargs)
        return loss_fn(y, y_pred, sample_weight)

    return jax.jit(loss_of_gates), jax.jit(jax.value_and_grad(loss_of_gates))


def gate_gradients(model, gate_variables, x, y=None, sample_weight=None, *, loss_fn):
    """The loss on one batch and its gradient with respect to each gate variable.

    A one-off `GateLoss(model, gate_variables, loss_fn).value_and_gradients(...)`.

    Returns:
        `(loss, gradients)`: a float and one `np.ndarray(num_heads)` per gate variable.

    Example:
        >>> from keras_mha.pruning.batches import resolve_loss
        >>> attention = GroupedQueryAttention(num_heads=4, num_key_value_heads=2)
        >>> model = keras.Sequential([keras.Input((6, 8)), attention])
        >>> x = np.ones((2, 6, 8), "float32")
        >>> loss_fn = resolve_loss(model, "mse")
        >>> loss, grads = gate_gradients(model, [attention.head_gates], x, x, loss_fn=loss_fn)
        >>> grads[0].shape
        (4,)
    """
    return GateLoss(model, gate_variables, loss_fn).value_and_gradients(x, y, sample_weight)


def no_gradient_tracking():
    """A context for forward-only passes: `torch.no_grad()` on PyTorch, else nothing.

    Example:
        >>> from keras_mha.layers import MultiHeadAttention
        >>> inputs = keras.Input((8, 16))
        >>> model = keras.Model(inputs, MultiHeadAttention(4, name="attention")(inputs))
        >>> with no_gradient_tracking():
        ...     y_pred = model(np.ones((2, 8, 16), "float32"), training=False)
    """
    if keras.backend.backend() == "torch":
        import torch

        return torch.no_grad()
    return contextlib.nullcontext()
