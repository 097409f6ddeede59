"""Train a small grouped-query-attention language model, then generate with its KV cache.

The text is *The Zen of Python* by Tim Peters (PEP 20, placed in the public
domain), which ships with every Python as the standard-library module `this`
(ROT13-encoded in `this.s`), so nothing is downloaded. Tokens are characters.

The model is a decoder-only transformer built from keras-mha layers:

    token embedding
    -> 2 pre-norm blocks:  x + GroupedQueryAttention(RMSNorm(x))   causal, RoPE,
                                                                  8 query heads sharing 2 KV heads
                           x + MLP(RMSNorm(x))
    -> RMSNorm -> logits through the embedding matrix (weight-tied head)

The script

1. prints the loss before training, trains for `--steps` steps with
   `model.fit` (its progress shows Keras's running mean of the loss over the
   batches so far), and prints the trained model's loss on the same windows;
2. generates greedily with the KV cache: the prompt is prefilled into one
   fixed-shape cache per block (`GroupedQueryAttention.init_cache`), then each
   new token is one call of a decode step that is compiled once for every
   position (`jax.jit`, `tf.function(jit_compile=True)` or `torch.compile`;
   the position is a tensor `cache_index`);
3. checks that the first `--check-tokens` tokens equal those of uncached
   generation (the full causal forward pass over the growing sequence for
   every token), and stops with an error if they do not.

Run it on any backend; it takes well under two minutes on a laptop CPU:

    KERAS_BACKEND=jax python examples/gqa_language_model.py
    KERAS_BACKEND=torch python examples/gqa_language_model.py --fast   # smoke test

Example:
    >>> import subprocess, sys
    >>> subprocess.run([sys.executable, "examples/gqa_language_model.py", "--fast"], check=True)
    ... # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import io
import sys
import time

import keras
import numpy as np
from keras import ops

from keras_mha.layers import GroupedQueryAttention


def zen_of_python() -> str:
    """The Zen of Python, decoded from the standard library's `this` module.

    Example:
        >>> zen_of_python().splitlines()[2]
        'Beautiful is better than ugly.'
    """
    with contextlib.redirect_stdout(io.StringIO()):  # `import this` prints the poem
        import this
    return codecs.decode(this.s, "rot13")


class CharacterTokenizer:
    """Characters of a text as token ids, in sorted order.

    Example:
        >>> tokenizer = CharacterTokenizer("abba")
        >>> tokenizer.encode("ab").tolist(), tokenizer.decode([1, 0])
        ([0, 1], 'ba')
    """

    def __init__(self, text: str):
        self.characters = sorted(set(text))
        self._ids = {character: index for index, character in enumerate(self.characters)}

    @property
    def vocabulary_size(self) -> int:
        return len(self.characters)

    def encode(self, text: str) -> np.ndarray:
        return np.array([self._ids[character] for character in text], dtype="int32")

    def decode(self, ids) -> str:
        return "".join(self.characters[int(index)] for index in ids)


class DecoderBlock(keras.layers.Layer):
    """Pre-norm transformer block: causal GQA with RoPE, then a GELU MLP, each residual.

    Example:
        >>> block = DecoderBlock(hidden=64, num_heads=8, num_key_value_heads=2)
        >>> block(keras.random.normal((1, 10, 64))).shape
        (1, 10, 64)
    """

    def __init__(self, hidden, num_heads, num_key_value_heads, mlp_ratio=4, **kwargs):
        super().__init__(**kwargs)
        self.attention_norm = keras.layers.RMSNormalization(epsilon=1e-6)
        self.attention = GroupedQueryAttention(
            num_heads=num_heads,
            num_key_value_heads=num_key_value_heads,
            causal=True,
            use_rope=True,
            use_bias=False,
        )
        self.mlp_norm = keras.layers.RMSNormalization(epsilon=1e-6)
        self.mlp_up = keras.layers.Dense(mlp_ratio * hidden, activation="gelu")
        self.mlp_down = keras.layers.Dense(hidden)

    def call(self, x, cache=None, cache_index=None):
        normed = self.attention_norm(x)
        if cache is None:
            x = x + self.attention(normed)
        else:
            attended, cache = self.attention(normed, cache=cache, cache_index=cache_index)
            x = x + attended
        x = x + self.mlp_down(self.mlp_up(self.mlp_norm(x)))
        return x if cache is None else (x, cache)


class GQALanguageModel(keras.Model):
    """Decoder-only language model of `DecoderBlock`s with a weight-tied output head.

    Call with `tokens` `(batch, length)` for logits `(batch, length, vocabulary)`;
    add `caches` (from `init_caches`) and `cache_index` to decode incrementally,
    which returns `(logits, caches)`.

    Example:
        >>> model = GQALanguageModel(vocabulary_size=40)
        >>> model(np.zeros((1, 5), "int32")).shape
        (1, 5, 40)
    """

    def __init__(
        self, vocabulary_size, hidden=128, num_layers=2, num_heads=8, num_key_value_heads=2
    ):
        super().__init__()
        self.embedding = keras.layers.Embedding(vocabulary_size, hidden)
        self.blocks = [
            DecoderBlock(hidden, num_heads, num_key_value_heads, name=f"block_{index}")
            for index in range(num_layers)
        ]
        self.final_norm = keras.layers.RMSNormalization(epsilon=1e-6)

    def call(self, tokens, caches=None, cache_index=None):
        x = self.embedding(tokens)
        updated_caches = []
        for index, block in enumerate(self.blocks):
            if caches is None:
                x = block(x)
            else:
                x, cache = block(x, cache=caches[index], cache_index=cache_index)
                updated_caches.append(cache)
        x = self.final_norm(x)
        # Weight tying: the output projection is the transposed embedding matrix.
        logits = ops.matmul(x, ops.transpose(self.embedding.embeddings))
        return logits if caches is None else (logits, updated_caches)

    def init_caches(self, batch_size, max_length):
        """One zero KV cache per block (a `(key, value)` pair each, opaque to the model)."""
        return [block.attention.init_cache(batch_size, max_length) for block in self.blocks]


def training_windows(ids: np.ndarray, length: int, count: int, seed: int):
    """`count` random (input, next-token target) windows of `length` tokens."""
    starts = np.random.default_rng(seed).integers(0, len(ids) - length - 1, size=count)
    inputs = np.stack([ids[start : start + length] for start in starts])
    targets = np.stack([ids[start + 1 : start + length + 1] for start in starts])
    return inputs, targets


def _next_token(logits):
    return ops.cast(ops.argmax(logits[:, -1], axis=-1), "int32")[:, None]


def make_decode_step(model, compile_step=True):
    """A greedy decode step `step(token, caches, cache_index) -> (next_token, caches)`.

    Compiled once for every position: `jax.jit` (with the caches donated),
    `tf.function(jit_compile=True)` or `torch.compile`. Returns the step and
    a one-element list counting its compilations (traces on JAX and
    TensorFlow, graphs Inductor compiled on PyTorch).

    Example:
        >>> step, compilations = make_decode_step(model)
        >>> token, caches = step(token, caches, ops.convert_to_tensor(7, "int32"))
    """
    compilations = [0]
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        trainable = [variable.value for variable in model.trainable_variables]
        non_trainable = [variable.value for variable in model.non_trainable_variables]

        def pure_step(trainable, non_trainable, token, caches, cache_index):
            compilations[0] += 1
            (logits, caches), _ = model.stateless_call(
                trainable, non_trainable, token, caches=caches, cache_index=cache_index
            )
            return _next_token(logits), caches

        if not compile_step:
            return (lambda *args: pure_step(trainable, non_trainable, *args)), compilations
        jitted = jax.jit(pure_step, donate_argnums=(3,))
        return (lambda *args: jitted(trainable, non_trainable, *args)), compilations

    def step(token, caches, cache_index):
        logits, caches = model(token, caches=caches, cache_index=cache_index)
        return _next_token(logits), caches

    if backend == "tensorflow":
        import tensorflow as tf

        def counted_step(token, caches, cache_index):
            compilations[0] += 1
            return step(token, caches, cache_index)

        if not compile_step:
            return step, compilations
        return tf.function(counted_step, jit_compile=True), compilations
    if backend == "torch":
        import torch

        if compile_step:
            inductor = torch._dynamo.lookup_backend("inductor")

            def counting_inductor(graph_module, example_inputs):
                compilations[0] += 1
                return inductor(graph_module, example_inputs)

            compiled = torch.compile(step, backend=counting_inductor)
        else:
            compiled = step

        def no_grad_step(token, caches, cache_index):
            with torch.no_grad():
                return compiled(token, caches, cache_index)

        return no_grad_step, compilations
    raise ValueError(f"KERAS_BACKEND={backend!r} is not supported; use jax, tensorflow or torch.")


def generate_with_cache(model, prompt_ids, new_tokens, compile_step=True):
    """Greedy generation: prefill the prompt into the KV caches, then one token per step.

    Returns `(token ids, seconds per step after the first, compilations)`.

    Example:
        >>> ids, seconds, compilations = generate_with_cache(model, prompt_ids, 20)
    """
    prompt_length = len(prompt_ids)
    caches = model.init_caches(batch_size=1, max_length=prompt_length + new_tokens)
    logits, caches = model(prompt_ids[None], caches=caches, cache_index=0)  # prefill
    caches = keras.tree.map_structure(ops.stop_gradient, caches)
    token = _next_token(logits)
    step, compilations = make_decode_step(model, compile_step)
    tokens, step_seconds = [ops.convert_to_numpy(token)], []
    for position in range(prompt_length, prompt_length + new_tokens - 1):
        start = time.perf_counter()
        token, caches = step(token, caches, ops.convert_to_tensor(position, dtype="int32"))
        tokens.append(ops.convert_to_numpy(token))  # waits for the step to finish
        step_seconds.append(time.perf_counter() - start)
    ids = [int(np.asarray(token)[0, 0]) for token in tokens]
    # The first step compiles; the rest show the cost of a cached step.
    seconds_per_step = float(np.median(step_seconds[1:])) if len(step_seconds) > 1 else None
    return ids, seconds_per_step, compilations[0]


def generate_without_cache(model, prompt_ids, new_tokens):
    """Greedy generation recomputing the full causal forward pass for every token.

    The sequence lives in a fixed-length buffer, so `predict_on_batch` compiles
    once; causal attention keeps the not-yet-written positions after the last
    token from affecting its logits.

    Example:
        >>> generate_without_cache(model, prompt_ids, 4)
        [7, 1, 12, 0]
    """
    prompt_length = len(prompt_ids)
    buffer = np.zeros((1, prompt_length + new_tokens), dtype="int32")
    buffer[0, :prompt_length] = prompt_ids
    for position in range(prompt_length, prompt_length + new_tokens):
        logits = model.predict_on_batch(buffer)
        buffer[0, position] = int(np.argmax(logits[0, position - 1]))
    return buffer[0, prompt_length:].tolist()


class StepLine(keras.callbacks.Callback):
    """Print `step 30/300: loss 2.345` every tenth of the training steps."""

    def __init__(self, steps: int):
        super().__init__()
        self.steps, self.every = steps, max(1, steps // 10)

    def on_train_batch_end(self, batch, logs=None):
        step = batch + 1
        if step % self.every == 0 or step == self.steps:
            loss = float((logs or {}).get("loss", float("nan")))
            print(f"step {step}/{self.steps}: loss {loss:.3f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Train, report the loss, generate with and without the cache, compare.

    Example:
        >>> main(["--fast"])  # doctest: +SKIP
        0
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150, help="training steps (default 150)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128, help="training window length")
    parser.add_argument("--prompt", default="Beautiful is")
    parser.add_argument("--new-tokens", type=int, default=100, help="tokens to generate")
    parser.add_argument(
        "--check-tokens",
        type=int,
        default=16,
        help="tokens that must match uncached generation (default 16)",
    )
    parser.add_argument("--no-compile", action="store_true", help="decode step uncompiled")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--fast",
        action="store_true",
        help="smoke test: 30 steps on 64-token windows, 24 new tokens, 6 checked",
    )
    args = parser.parse_args(argv)
    if args.fast:
        # 64-token windows still hold the prompt and all 24 new tokens; they train
        # 2.5x faster than 128 (the loss drops as far: 4.0 -> 2.1 on JAX).
        args.steps, args.seq_len, args.new_tokens, args.check_tokens = 30, 64, 24, 6
    if not 0 < args.check_tokens <= args.new_tokens:
        parser.error(f"--check-tokens={args.check_tokens} must be in [1, --new-tokens]")

    keras.utils.set_random_seed(args.seed)
    text = zen_of_python()
    tokenizer = CharacterTokenizer(text)
    ids = tokenizer.encode(text)
    prompt_ids = tokenizer.encode(args.prompt)
    if len(prompt_ids) + args.new_tokens > args.seq_len:
        print(
            f"note: generating past position {args.seq_len}, beyond the training windows; "
            "RoPE positions there were never trained"
        )
    print(
        f"backend {keras.backend.backend()}; text: The Zen of Python ({len(text)} characters, "
        f"{tokenizer.vocabulary_size} distinct)"
    )

    model = GQALanguageModel(tokenizer.vocabulary_size)
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    evaluation = training_windows(ids, args.seq_len, count=64, seed=args.seed + 1)
    loss_before = model.evaluate(*evaluation, batch_size=64, verbose=0)
    print(f"parameters: {model.count_params():,}")
    print(
        f"loss before training: {loss_before:.3f} "
        f"(uniform guess: {np.log(tokenizer.vocabulary_size):.3f})"
    )
    start = time.perf_counter()
    inputs, targets = training_windows(ids, args.seq_len, args.steps * args.batch_size, args.seed)
    # Progress while it trains (a while on a CPU): Keras's bar on a terminal, and a line
    # every tenth of the steps when the output goes to a file or pipe.
    on_terminal = sys.stdout.isatty()
    # Keras logs the mean loss over the batches trained so far in the epoch, early (worse)
    # batches included, so it ends above the trained model's loss printed after.
    print("training (progress shows Keras's running mean of the loss over the batches so far)")
    model.fit(
        inputs, targets, batch_size=args.batch_size, epochs=1, verbose=1 if on_terminal else 0,
        callbacks=[] if on_terminal else [StepLine(args.steps)],
    )  # fmt: skip
    loss_after = model.evaluate(*evaluation, batch_size=64, verbose=0)
    print(
        f"loss after {args.steps} steps: {loss_after:.3f} "
        f"(the trained model on the same windows as before; {time.perf_counter() - start:.1f} s "
        "of training)"
    )

    cached_ids, step_seconds, compilations = generate_with_cache(
        model, prompt_ids, args.new_tokens, compile_step=not args.no_compile
    )
    uncached_ids = generate_without_cache(model, prompt_ids, args.check_tokens)
    print(f"\ngenerated with the KV cache (greedy):\n{args.prompt}{tokenizer.decode(cached_ids)}\n")
    if step_seconds is not None:
        print(
            f"cached decode step: {1000 * step_seconds:.2f} ms per token; compiled "
            f"{compilations} time(s) for {args.new_tokens - 1} positions"
        )
    checked = cached_ids[: args.check_tokens]
    if checked != uncached_ids:
        print(
            f"error: cached generation {tokenizer.decode(checked)!r} differs from uncached "
            f"generation {tokenizer.decode(uncached_ids)!r} within the first "
            f"{args.check_tokens} tokens",
            file=sys.stderr,
        )
        return 1
    print(f"check: the first {args.check_tokens} tokens equal uncached generation")
    return 0


if __name__ == "__main__":
    sys.exit(main())
