"""PyTorch's gate gradients (`keras_mha.pruning.gate_gradients`): the model called inside
a `keras.StatelessScope` that maps each gate variable to a leaf tensor with
`requires_grad=True`, then `torch.autograd.grad`.

Example:
    >>> loss, gradients = gate_loss_and_gradients(gate_loss, gates, x, y, None)  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import torch


def gate_loss(owner, gate_values, x, y, sample_weight):
    """The loss of `owner` (a `GateLoss`) at `gate_values`, autograd off."""
    with torch.no_grad():
        return owner.scoped_loss(gate_values, x, y, sample_weight)


def gate_loss_and_gradients(owner, gate_values, x, y, sample_weight):
    """`(loss, gradients)` of `owner` (a `GateLoss`) at `gate_values`."""
    # Through float32: torch cannot read NumPy's bfloat16 (ml_dtypes) arrays.
    leaves = [
        torch.tensor(
            np.asarray(value, dtype=np.float32),
            dtype=variable.value.dtype,
            device=variable.value.device,
            requires_grad=True,
        )
        for variable, value in zip(owner.gate_variables, gate_values, strict=True)
    ]
    with torch.enable_grad():
        loss = owner.scoped_loss(leaves, x, y, sample_weight)
        # allow_unused: a tracked layer the loss never reaches has no gradient.
        gradients = torch.autograd.grad(loss, leaves, allow_unused=True)
    gradients = [
        torch.zeros_like(leaf) if gradient is None else gradient
        for leaf, gradient in zip(leaves, gradients, strict=True)
    ]
    return loss.detach(), gradients
