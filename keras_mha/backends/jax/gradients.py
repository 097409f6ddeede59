"""JAX's gate gradients (`keras_mha.pruning.gate_gradients`): `model.stateless_call` with
the gate values substituted into the non-trainable variable values, `jax.value_and_grad`,
and `jax.jit`, so that scoring many batches (or many masked heads) compiles once per batch
shape instead of dispatching every op eagerly. The jitted pair is kept on the model, keyed
by its variables and the loss, so that every `GateLoss` of the same model and loss (one
per `head_importance` call, i.e. one per `HeadPruning` step) reuses the compiled programs.

Example:
    >>> loss, gradients = gate_loss_and_gradients(gate_loss, gates, x, y, None)  # doctest: +SKIP
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp


def gate_loss(owner, gate_values, x, y, sample_weight):
    """The loss of `owner` (a `GateLoss`) at `gate_values`, jitted."""
    return _functions(owner)[0](gate_values, *owner.jax_state(), x, y, sample_weight)


def gate_loss_and_gradients(owner, gate_values, x, y, sample_weight):
    """`(loss, gradients)` of `owner` (a `GateLoss`) at `gate_values`, jitted."""
    gates = [jnp.asarray(value) for value in gate_values]
    return _functions(owner)[1](gates, *owner.jax_state(), x, y, sample_weight)


def _functions(owner):
    if owner.jax_functions is None:
        owner.jax_functions = cached_functions(owner.model, owner.gate_variables, owner.loss_fn)
    return owner.jax_functions


# Attribute of the model holding its jitted gate-loss functions. Set with
# `object.__setattr__` so that Keras's attribute tracking leaves it alone.
_CACHE_ATTRIBUTE = "_keras_mha_gate_loss_functions"


def cached_functions(model, gate_variables, loss_fn):
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
    cache = getattr(model, _CACHE_ATTRIBUTE, None)
    if cache is None:
        cache = {}
        object.__setattr__(model, _CACHE_ATTRIBUTE, cache)
    entry = cache.get(key)
    if entry is None:
        entry = (loss, _build_functions(model, gate_variables, loss_fn))
        cache[key] = entry
    return entry[1]


def _build_functions(model, gate_variables, loss_fn):
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
