"""JAX's decode step: `jax.jit`, the owner's variables passed in, the caches donated.

`owner`'s variables enter through `keras.StatelessScope`, and the caches (argument 3) are
donated so that XLA updates them in place; `step.lower(inputs, mask, caches, index)`
gives the lowering, e.g. to read the optimised HLO (tests/layers/test_cache.py does).

Example:
    >>> step = compile_decode_step(layer, forward)  # doctest: +SKIP
    >>> outputs, caches = step(token, None, caches, 7)  # doctest: +SKIP
"""

from __future__ import annotations

import jax
import keras
import numpy as np
from keras.src.backend import get_autocast_scope, in_stateless_scope

from keras_mha.backends import steps


def compile_decode_step(
    owner,
    forward,
    *,
    static_index=False,
    compile_torch=False,
    jit_compile=True,
    eager_forward=None,
    on_trace=None,
    guard_tensors_only=False,
    one_signature=False,
):
    """`forward` under `jax.jit` (the PyTorch and TensorFlow options are ignored here)."""
    traced = steps.traced(forward, static_index, on_trace or (lambda: None))

    def stateless(variables, inputs, mask, caches, index):
        mapping = list(zip(owner.variables, variables, strict=True))
        with keras.StatelessScope(state_mapping=mapping):
            return traced(inputs, mask, caches, index)

    compiled = jax.jit(stateless, donate_argnums=(3,))

    def arguments(inputs, mask, caches, index):
        index = np.int32(index) if steps.is_int(index) else index
        return _values(owner.variables), inputs, mask, caches, index

    def step(inputs, mask, caches, index):
        return compiled(*arguments(inputs, mask, caches, index))

    # `step.lower(...).compile().as_text()`: the optimised HLO, to check what XLA copies.
    step.lower = lambda *args: compiled.lower(*arguments(*args))
    return step


def _values(variables):
    """The variables' arrays, as `.value` gives them (which costs ~8 us a variable on JAX).

    Outside a stateless or autocast scope, that is the stored array itself.
    """
    if in_stateless_scope() or get_autocast_scope() is not None:
        return [variable.value for variable in variables]
    return [
        variable.value if v is None else v for variable in variables for v in (variable._value,)
    ]


def decode_function(layer, *, compile_torch=False, jit_compile=True):
    """`GroupedQueryAttention.make_decode_function` on JAX: a jitted prefill and step."""
    return steps.layer_decode_function(
        layer, compile_decode_step, compile_torch=compile_torch, jit_compile=jit_compile
    )


def cache_zeroer(caches):
    """Never called: JAX's caches are donated to each call, not kept between calls."""
    raise NotImplementedError("JAX keeps no caches between generate calls")


def cache_factory(make_caches):
    """`make_caches()` as one compiled call: made one by one, each buffer a dispatch, they
    took about a tenth of a 64-token CPU prefill."""
    return jax.jit(make_caches)
