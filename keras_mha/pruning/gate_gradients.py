"""The loss as a function of the head gates, and its gradient.

Gates enter the forward pass as inputs of a pure function; the model's
variables are never written. How that function is built and differentiated
is each backend's (`keras_mha/backends/*/gradients.py`, reached through
`backends.current().gate_loss_and_gradients`):

- JAX: `model.stateless_call` with the gate values substituted into the
  non-trainable variable values, `jax.value_and_grad`, under `jax.jit`, kept
  on the model so that every `GateLoss` of the same model and loss reuses
  the compiled programs;
- PyTorch: the model called inside a `keras.StatelessScope` that maps each
  gate variable to a leaf tensor with `requires_grad=True`; `torch.autograd.grad`;
- TensorFlow: the same scope with gate tensors watched by a `tf.GradientTape`.

`tests/pruning/test_gradients.py` checks each branch against central finite
differences (taken by writing the gate variables and running plain forward
passes) and the three branches against each other.
"""

from __future__ import annotations

import keras
import numpy as np

from keras_mha import backends


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
        self.backend = backends.current()
        self.jax_functions = None  # JAX: the jitted loss and gradient, made on first use

    def _current_gates(self):
        return [
            np.asarray(keras.ops.convert_to_numpy(v), dtype=v.dtype) for v in self.gate_variables
        ]

    def value(self, x, y=None, sample_weight=None, gate_values=None):
        """The loss (a float) with the given gate values; forward pass only."""
        gate_values = self._current_gates() if gate_values is None else gate_values
        return float(_to_numpy(self.backend.gate_loss(self, gate_values, x, y, sample_weight)))

    def value_and_gradients(self, x, y=None, sample_weight=None, gate_values=None):
        """`(loss, [np.ndarray(num_heads) per gate variable])` at the given gate values."""
        gate_values = self._current_gates() if gate_values is None else gate_values
        loss, gradients = self.backend.gate_loss_and_gradients(
            self, gate_values, x, y, sample_weight
        )
        return float(_to_numpy(loss)), [_to_numpy(gradient) for gradient in gradients]

    def scoped_loss(self, gate_values, x, y, sample_weight):
        """The loss with the gate variables read as `gate_values` (a `keras.StatelessScope`)."""
        mapping = list(zip(self.gate_variables, gate_values, strict=True))
        with keras.StatelessScope(state_mapping=mapping):
            return self.loss_fn(y, self.model(x, training=False), sample_weight)

    def jax_state(self):
        """The model's trainable and non-trainable arrays (JAX passes them in)."""
        return (
            [v.value for v in self.model.trainable_variables],
            [v.value for v in self.model.non_trainable_variables],
        )


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
    return backends.current().no_gradient_tracking()
