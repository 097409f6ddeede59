"""The decode loop of `generate` as one program: choosing tokens and stopping, in `keras.ops`.

`generate`'s per-token path runs one compiled step per token and chooses the next token
on the host. Here the whole loop is written in `keras.ops`, so that a backend compiles it
once (`keras_mha.backends.<backend>.generation`): `jax.jit` over `lax.while_loop` on
JAX, an XLA while loop on TensorFlow, a step replayed from a CUDA graph on PyTorch.

The loop gives the per-token path's tokens: the same argmax (ties to the lowest id), the
same uniform draws (drawn on the host from the seeded NumPy generator before the loop,
`uniform_draws`, in the order the per-token path draws them), the same restriction by
`top_k` / `top_p` and the same stop rule (a row that reached an EOS is filled with the
first EOS id; the loop ends once every row has). Sampling runs in float32 here and in
float64 on the host, so a draw within float32 round-off of a bucket edge may pick the
neighbouring token; greedy tokens are the same.

Example:
    >>> logits = keras.ops.convert_to_tensor([[0.0, 2.0, 1.0]])
    >>> int(keras.ops.convert_to_numpy(choose_tokens(logits, Sampling().key(3)))[0])
    1
"""

from __future__ import annotations

import dataclasses

import numpy as np
from keras import ops


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How tokens are chosen, as the compiled loop needs it: `temperature`, `top_k` and
    `top_p` are values (tensors in the loop); which of them apply is part of the
    program (`key()`), so one program serves every temperature or `top_p`."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def key(self, vocab_size: int) -> tuple:
        """What decides the program: `(samples, uses_top_k, uses_top_p)` (the per-token
        path's `_choose` applies `top_k` below the vocabulary and `top_p` below 1 only)."""
        if self.temperature == 0:
            return (False, False, False)
        uses_top_k = self.top_k is not None and self.top_k < vocab_size
        return (True, uses_top_k, self.top_p is not None and self.top_p < 1.0)

    def values(self):
        """`(temperature, top_k, top_p)` as float32 / int32 scalars for the compiled loop."""
        return (
            np.float32(self.temperature or 1.0),
            np.int32(self.top_k or 0),
            np.float32(1.0 if self.top_p is None else self.top_p),
        )


def uniform_draws(rng, steps: int, batch: int) -> np.ndarray:
    """`(steps, batch)` float32 draws: row `i` is what the per-token path's `i`-th
    `rng.random((batch, 1))` gives (NumPy's generators fill arrays in C order).

    Example:
        >>> a = uniform_draws(np.random.default_rng(0), 2, 3)
        >>> rng = np.random.default_rng(0)
        >>> b = np.stack([rng.random((3, 1))[:, 0] for _ in range(2)])
        >>> bool((a == b.astype("float32")).all())
        True
    """
    return rng.random((steps, batch)).astype(np.float32)


def choose_tokens(logits, key, draws=None, values=None):
    """`(B,)` int32 next tokens from `(B, V)` float32 logits, in `keras.ops`.

    `key` is `Sampling.key(V)`; `draws` `(B,)` uniform draws and `values`
    `Sampling.values()` (tensors inside a compiled loop) when `key` samples.
    """
    samples, uses_top_k, uses_top_p = key
    if not samples:
        return ops.cast(ops.argmax(logits, axis=-1), "int32")
    temperature, top_k, top_p = values
    vocab = logits.shape[-1]
    logits = logits / ops.cast(temperature, "float32")
    if uses_top_k:
        ascending = ops.sort(logits, axis=-1)
        column = ops.full((logits.shape[0], 1), vocab, "int32") - ops.cast(top_k, "int32")
        kth = ops.take_along_axis(ascending, column, axis=-1)
        logits = ops.where(logits < kth, float("-inf"), logits)
    probabilities = ops.softmax(logits, axis=-1)
    if uses_top_p:
        order = ops.argsort(-probabilities, axis=-1)
        ordered = ops.take_along_axis(probabilities, order, axis=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always).
        keep_sorted = ops.cumsum(ordered, axis=-1) - ordered < ops.cast(top_p, "float32")
        keep = ops.take_along_axis(keep_sorted, ops.argsort(order, axis=-1), axis=-1)
        probabilities = ops.where(keep, probabilities, 0.0)
        probabilities = probabilities / ops.sum(probabilities, axis=-1, keepdims=True)
    below = ops.cumsum(probabilities, axis=-1) < draws[:, None]
    chosen = ops.sum(ops.cast(below, "int32"), axis=-1)
    return ops.minimum(chosen, vocab - 1)


def stop_rule(chosen, finished, eos_ids):
    """`(chosen, finished)` after the EOS rule: rows that had ended take the first EOS id,
    and a row ends when it chooses one. `eos_ids` is `(E,)` int32, E >= 1."""
    chosen = ops.where(finished, eos_ids[0], chosen)
    hit = ops.any(ops.equal(chosen[:, None], eos_ids[None, :]), axis=-1)
    return chosen, ops.logical_or(finished, hit)


@dataclasses.dataclass(frozen=True)
class LoopShape:
    """What one compiled loop is specialised to: batch, cache length, sampling kind,
    whether rows can end (EOS ids given) and whether a key mask is passed."""

    batch: int
    max_length: int
    sampling_key: tuple
    stops: bool
    masked: bool


def chooser(shape: LoopShape, draws, eos_ids, values):
    """`choose(logits, step, finished) -> (chosen, finished)`: token `step` of every row
    and which rows have ended, by `shape`'s sampling and stop rule."""

    def choose(logits, step, finished):
        row_draws = None if draws is None else ops.take(draws, step, axis=0)
        chosen = choose_tokens(logits, shape.sampling_key, row_draws, values)
        if shape.stops:
            return stop_rule(chosen, finished, eos_ids)
        return chosen, finished

    return choose


def decode_loop(forward, shape: LoopShape, carry_caches: bool):
    """`loop(logits, caches, key_mask, length, count, draws, eos_ids, values) ->
    (tokens (B, max_length) int32, steps, caches)`: `count` new tokens (fewer when every
    row ended), starting from the prefill's `(B, V)` float32 `logits`.

    `forward(token_ids, key_mask, caches, index) -> (logits, caches)` is the model's
    one-token step. Token `i` is chosen from the logits of the step before it; the last
    token's step is never run (as on the per-token path). With `carry_caches` False the
    caches are variables that `forward` writes in place (TensorFlow): they stay out of
    the loop's state.
    """

    def loop(logits, caches, key_mask, length, count, draws, eos_ids, values):
        batch, max_length = shape.batch, shape.max_length
        choose = chooser(shape, draws, eos_ids, values)
        finished = ops.zeros((batch,), "bool")
        chosen, finished = choose(logits, 0, finished)
        tokens = ops.zeros((batch, max_length), "int32")
        tokens = ops.slice_update(tokens, [0, 0], chosen[:, None])

        def condition(step, tokens, finished, *rest):
            going = step < count
            if shape.stops:
                going = ops.logical_and(going, ops.logical_not(ops.all(finished)))
            return going

        def body(step, tokens, finished, *rest):
            previous = ops.slice(tokens, [0, step - 1], [batch, 1])
            step_caches = rest[0] if carry_caches else caches
            logits, step_caches = forward(previous, key_mask, step_caches, length + step - 1)
            chosen, finished = choose(logits, step, finished)
            tokens = ops.slice_update(tokens, [0, step], chosen[:, None])
            state = (step + 1, tokens, finished)
            return (*state, step_caches) if carry_caches else state

        state = (ops.convert_to_tensor(1, "int32"), tokens, finished)
        state = ops.while_loop(condition, body, (*state, caches) if carry_caches else state)
        return state[1], state[0], state[3] if carry_caches else caches

    return loop


__all__ = [
    "LoopShape",
    "chooser",
    "Sampling",
    "choose_tokens",
    "decode_loop",
    "stop_rule",
    "uniform_draws",
]
