"""JAX: `generate`'s whole decode loop as one `jax.jit` program (`lax.while_loop`).

The model's variables are passed in (`keras.StatelessScope`) and the caches donated, so
XLA writes them in place across every step of the loop; the tokens come back as one
array. On the CPU a tied LM head is read from a `(D, V)` copy (`head_copy`), passed in
beside the variables. One program per batch, cache length and kind of sampling (see
`keras_mha.models.decode_loop.LoopShape`): the prompt length, the number of new tokens,
the temperature and `top_p` are values, not part of it.

Example:
    >>> run = compile_loop(model, loop, on_trace=lambda: None)  # doctest: +SKIP
    >>> tokens, steps, caches = run(logits, caches, None, 7, 32, None, None, None)
    ... # doctest: +SKIP
"""

from __future__ import annotations

import keras
import numpy as np

from keras_mha.backends.common import decode_copies
from keras_mha.backends.jax.head_copy import head_copy
from keras_mha.backends.jax.steps import _values as variable_values


def compile_loop(model, loop, on_trace):
    """`run(logits, caches, key_mask, length, count, draws, eos_ids, values) -> (tokens,
    steps, caches)`: `loop` (`decode_loop.decode_loop(...)`) jitted with `model`'s
    variables as arguments and the caches donated. `run.head_copy` says whether the
    last call read the tied head from its `(D, V)` copy (asked at every call: LoRA or
    quantization may come after the first)."""
    import jax

    def stateless(variables, head, logits, caches, key_mask, length, count, draws, eos_ids,
                  values):  # fmt: skip
        on_trace()
        mapping = list(zip(model.variables, variables, strict=True))
        with keras.StatelessScope(state_mapping=mapping), decode_copies.streamed_head(head):
            return loop(logits, caches, key_mask, length, count, draws, eos_ids, values)

    compiled = jax.jit(stateless, donate_argnums=(3,))

    def run(logits, caches, key_mask, length, count, draws, eos_ids, values):
        copy = head_copy(model)
        run.head_copy = copy is not None
        return compiled(
            variable_values(model.variables),
            None if copy is None else copy.table(),
            logits,
            caches,
            key_mask,
            np.int32(length),
            np.int32(count),
            draws,
            eos_ids,
            values,
        )

    run.head_copy = False
    return run


__all__ = ["compile_loop"]
