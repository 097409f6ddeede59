"""TensorFlow: `generate`'s whole decode loop as one XLA program (`tf.while_loop` inside
`tf.function(jit_compile=True)`).

The caches are variables made outside the function (`init_cache(..., variables=True)`),
which every step of the loop writes in place; they stay out of the loop's state and out
of the function's outputs (a returned variable would come back as a copy). One program
per batch, cache length and kind of sampling: the prompt length, the number of new
tokens, the temperature and `top_p` are tensors. On the CPU a tied LM head is read from a
`(D, V)` copy (`head_copy`), passed in as a tensor.

Example:
    >>> run = compile_loop(model, loop, on_trace=lambda: None)  # doctest: +SKIP
    >>> tokens, steps, caches = run(logits, caches, None, 7, 32, None, None, None)
    ... # doctest: +SKIP
"""

from __future__ import annotations

from keras_mha.backends.common import decode_copies
from keras_mha.backends.tensorflow.head_copy import head_copy


def compile_loop(model, loop, on_trace):
    """`run(logits, caches, key_mask, length, count, draws, eos_ids, values) -> (tokens,
    steps, caches)`: `loop` compiled with XLA over `model`'s variable caches.
    `run.head_copy` says whether the last call read the tied head from its `(D, V)` copy
    (asked at every call: LoRA or quantization may come after the first)."""
    import tensorflow as tf

    def function(head, logits, caches, key_mask, length, count, draws, eos_ids, values):
        on_trace()
        with decode_copies.streamed_head(head):
            tokens, steps, _ = loop(logits, caches, key_mask, length, count, draws, eos_ids,
                                    values)  # fmt: skip
        return tokens, steps

    compiled = tf.function(function, jit_compile=True, reduce_retracing=False)

    def run(logits, caches, key_mask, length, count, draws, eos_ids, values):
        copy = head_copy(model)
        run.head_copy = copy is not None
        tokens, steps = compiled(
            None if copy is None else copy.table(),
            tf.convert_to_tensor(logits),
            caches,
            None if key_mask is None else tf.convert_to_tensor(key_mask),
            tf.constant(length, tf.int32),
            tf.constant(count, tf.int32),
            draws,
            eos_ids,
            values,
        )
        return tokens, steps, caches

    run.head_copy = False
    return run


__all__ = ["compile_loop"]
