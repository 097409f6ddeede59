"""TensorFlow's gate gradients (`keras_mha.pruning.gate_gradients`): the model called
inside a `keras.StatelessScope` with the gate tensors watched by a `tf.GradientTape`.

Example:
    >>> loss, gradients = gate_loss_and_gradients(gate_loss, gates, x, y, None)  # doctest: +SKIP
"""

from __future__ import annotations

import tensorflow as tf


def gate_loss(owner, gate_values, x, y, sample_weight):
    """The loss of `owner` (a `GateLoss`) at `gate_values`."""
    return owner.scoped_loss(gate_values, x, y, sample_weight)


def gate_loss_and_gradients(owner, gate_values, x, y, sample_weight):
    """`(loss, gradients)` of `owner` (a `GateLoss`) at `gate_values`."""
    tensors = [tf.constant(value) for value in gate_values]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        loss = owner.scoped_loss(tensors, x, y, sample_weight)
    gradients = tape.gradient(loss, tensors, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return loss, gradients
