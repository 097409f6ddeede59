"""`generate`: greedy or seeded sampling from a `DecoderModel` on the layers' KV cache.

The prompt is run once (prefill) into fixed-shape caches made by each attention layer's
`init_cache` (their inside is the layer's business), then one token per step. The step
is compiled once per model, batch size and cache length, by the one place that picks
the backend, `keras_mha.backends`: `jax.jit` on JAX (stateless, the
weights passed as arguments, the caches donated so that XLA updates them in place),
`tf.function(jit_compile=True)` on TensorFlow (the caches are variables, created outside
the function and updated in place by it: `init_cache(..., variables=True)`), and eager
PyTorch (the caches written in place; measured faster than `torch.compile` for
single-token CPU steps; pass `compile_torch=True` to try it). No step copies the caches.
Cache lengths are rounded up to a multiple of `CACHE_BUCKET`, so prompts of similar
lengths reuse the compiled step; how often each function was traced is in
`generation_stats(model)`.

Tokens are chosen on the host from the last position's logits: the argmax at
temperature 0 (ties go to the lowest id, as in torch), else a draw from
`softmax(logits / temperature)` restricted by `top_k` / `top_p`, with a NumPy generator
seeded by `seed`, so a seed gives the same tokens on every backend up to float
round-off in the logits.

Left-padded batches (`padding_mask` False at the start of short rows) work: padded
keys are masked in every step, RoPE depends only on the distance between positions,
and learned positions (GPT-2) are counted over each row's real tokens, so a row's
tokens attend as in an unpadded run. A batch without padding passes no key mask at all,
so the fused kernels apply the causal mask themselves (PyTorch's SDPA then skips the
masked triangle, JAX and TensorFlow go blockwise on long prompts).

Example:
    >>> from keras_mha.models import from_pretrained, generate, generation_stats
    >>> model = from_pretrained("path/to/tiny-llama")  # doctest: +SKIP
    >>> generate(model, [[5, 6, 7]], max_new_tokens=4).shape  # doctest: +SKIP
    (1, 7)
    >>> generation_stats(model)["step_traces"]  # doctest: +SKIP
    1
"""

from __future__ import annotations

import contextlib
import functools
import weakref

import keras
import numpy as np

from keras_mha import backends
from keras_mha.errors import UsageError
from keras_mha.models.direct_calls import direct_calls, supports_direct_calls
from keras_mha.planning.config_values import shown

CACHE_BUCKET = 64

_DECODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _CompiledDecoder:
    """The prefill and step functions of one model, compiled for the current backend."""

    def __init__(self, model, compile_torch=False):
        self.model = model
        self.backend = backends.current()
        self.compile_torch = compile_torch
        # TensorFlow cannot donate a function's tensor arguments: its caches are variables.
        self.variable_caches = self.backend.variable_caches
        self.stats = {
            "backend": backends.name(),
            "compiled": self.backend.compiles_decode or compile_torch,
            "variable_caches": self.variable_caches,
            "prefill_traces": 0,
            "step_traces": 0,
            "prefill_calls": 0,
            "step_calls": 0,
        }
        # TensorFlow: the cache variables of finished calls, by (batch, cache length):
        # creating them took ~40% of a 64-token CPU prefill; zeroing them is cheap.
        self._spare_caches = {}
        self._cache_factories = {}  # (batch, cache length) -> init_caches (jitted on JAX)
        self._prefill, self._step = self._make()

    @contextlib.contextmanager
    def borrowed_caches(self, batch, max_length):
        """Zero caches for one `generate` call: new ones, or on TensorFlow the variables of
        an earlier call of the same shape (a call running beside it gets new ones)."""
        caches = self._spare_caches.pop((batch, max_length), None)
        if caches is None:
            caches = self._new_caches(batch, max_length)
        else:
            for buffer in keras.tree.flatten(caches):
                buffer.assign(keras.ops.zeros(buffer.shape, buffer.dtype))
        try:
            yield caches
        finally:
            if self.variable_caches:
                self._spare_caches[batch, max_length] = caches

    def _new_caches(self, batch, max_length):
        make = self._cache_factories.get((batch, max_length))
        if make is None:
            make = functools.partial(
                self.model.init_caches, batch, max_length, variables=self.variable_caches
            )
            make = self._cache_factories[batch, max_length] = self.backend.cache_factory(make)
        return make()

    # The model's forward on the cache; `index` is 0 for prefill. Only the last
    # position's logits are computed: the LM head over the whole prompt is wasted work.
    def _forward(self, token_ids, key_mask, caches, index):
        logits, caches = self.model.call_with_cache(
            token_ids, key_mask, caches, index, logits_to_keep=1
        )
        return keras.ops.cast(logits[:, 0], "float32"), caches

    def _make(self):
        # Eager PyTorch steps skip Keras's per-layer __call__ bookkeeping where that
        # changes nothing (see direct_calls.py): most of a small model's eager step.
        direct = not self.compile_torch and supports_direct_calls(self.model)
        if not self.backend.compiles_decode:  # eager PyTorch
            self.stats["direct_calls"] = direct

        def eager_forward(token_ids, key_mask, caches, index):
            # The leaf layers as torch calls too (backends/torch/model_calls.py), outside
            # Keras scopes.
            with direct_calls(direct, self.backend.eager_calls()):
                return self._forward(token_ids, key_mask, caches, index)

        def make(kind, static_index):
            def on_trace():
                self.stats[f"{kind}_traces"] += 1

            return self.backend.compile_decode_step(
                self.model,
                self._forward,
                static_index=static_index,
                compile_torch=self.compile_torch,
                eager_forward=eager_forward,
                on_trace=on_trace,
            )

        return make("prefill", True), make("step", False)

    def prefill(self, token_ids, key_mask, caches):
        self.stats["prefill_calls"] += 1
        return self._prefill(token_ids, key_mask, caches, 0)

    def step(self, token_ids, key_mask, caches, index):
        self.stats["step_calls"] += 1
        return self._step(token_ids, key_mask, caches, index)


def _decoder_for(model, compile_torch):
    decoder = _DECODERS.get(model)
    if decoder is None or decoder.compile_torch != compile_torch:
        decoder = _DECODERS[model] = _CompiledDecoder(model, compile_torch)
    return decoder


def generation_stats(model) -> dict:
    """How `generate` ran on `model`: backend, compiled or eager, traces and calls.

    Example:
        >>> generation_stats(model)  # doctest: +SKIP
        {'backend': 'jax', 'compiled': True, 'prefill_traces': 1, 'step_traces': 1, ...}
    """
    decoder = _DECODERS.get(model)
    return dict(decoder.stats) if decoder is not None else {}


# -- choosing tokens ------------------------------------------------------------------------------


def _choose(logits, temperature, top_k, top_p, rng):
    """Next token per row from `(B, V)` float32 logits."""
    if temperature == 0:
        return np.argmax(logits, axis=-1)
    logits = logits.astype(np.float64) / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = np.sort(logits, axis=-1)[:, -top_k][:, None]
        logits = np.where(logits < kth, -np.inf, logits)
    probabilities = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probabilities /= probabilities.sum(axis=-1, keepdims=True)
    if top_p is not None and top_p < 1.0:
        order = np.argsort(-probabilities, axis=-1, kind="stable")
        ordered = np.take_along_axis(probabilities, order, axis=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always).
        keep_sorted = np.cumsum(ordered, axis=-1) - ordered < top_p
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        probabilities = np.where(keep, probabilities, 0.0)
        probabilities /= probabilities.sum(axis=-1, keepdims=True)
    draws = rng.random((logits.shape[0], 1))
    chosen = (np.cumsum(probabilities, axis=-1) < draws).sum(axis=-1)
    return np.minimum(chosen, logits.shape[-1] - 1)


# -- arguments ----------------------------------------------------------------------------------


def _check_arguments(model, token_ids, max_new_tokens, temperature, top_k, top_p, padding_mask):
    from keras_mha.models.decoder import DecoderModel
    from keras_mha.models.inputs import as_array, check_token_ids

    if not isinstance(model, DecoderModel):
        name = type(model).__name__
        article = "an" if name[:1].lower() in "aeiou" else "a"
        raise UsageError(
            f"model is {article} {name}; generate needs a causal LM (a DecoderModel "
            f"from keras_mha.models.from_pretrained)",
            key="model",
        )
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)):
        raise UsageError(
            f"max_new_tokens={shown(max_new_tokens)}; expected a positive integer",
            key="max_new_tokens",
        )
    if max_new_tokens <= 0:
        raise UsageError(
            f"max_new_tokens={max_new_tokens}; expected a positive integer", key="max_new_tokens"
        )
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float, np.integer, np.floating))
        or not 0 <= temperature < float("inf")
    ):
        raise UsageError(
            f"temperature={shown(temperature)}; expected a finite number >= 0", key="temperature"
        )
    if top_k is not None and (
        isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k <= 0
    ):
        raise UsageError(f"top_k={shown(top_k)}; expected a positive integer or None", key="top_k")
    if top_p is not None and (
        isinstance(top_p, bool)
        or not isinstance(top_p, (int, float, np.integer, np.floating))
        or not 0 < top_p <= 1
    ):
        raise UsageError(f"top_p={shown(top_p)}; expected a number in (0, 1] or None", key="top_p")
    ids = np.asarray(keras.ops.convert_to_numpy(as_array(token_ids, "token_ids")))
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.shape[1] == 0:
        raise UsageError(
            f"token_ids has shape {ids.shape}; expected (batch, length) with length >= 1",
            key="token_ids",
        )
    check_token_ids(ids, model.vocab_size)
    if padding_mask is None:
        mask = np.ones(ids.shape, dtype=bool)
    else:
        mask = np.asarray(keras.ops.convert_to_numpy(as_array(padding_mask, "padding_mask")))
        mask = mask.astype(bool)
        if mask.ndim == 1:
            mask = mask[None]
        if mask.shape != ids.shape:
            raise UsageError(
                f"padding_mask has shape {mask.shape}; expected the shape of token_ids {ids.shape}",
                key="padding_mask",
            )
        if not mask[:, -1].all():
            row = int(np.argmin(mask[:, -1]))
            raise UsageError(
                f"padding_mask: row {row} ends with padding; generate needs left-padded "
                f"prompts (padding at the start of short rows)",
                key="padding_mask",
            )
    _check_length(model, ids.shape, int(max_new_tokens))
    return ids.astype(np.int32), mask


def _check_length(model, shape, max_new_tokens):
    """Refuse more positions than the model has, or a KV cache the device cannot hold."""
    from keras_mha.models.limits import check_memory, model_spec

    spec = model_spec(model)
    if spec is None:
        return
    batch, length = shape
    positions = spec.max_position_embeddings
    if positions is not None and length >= positions:
        raise UsageError(
            f"token_ids has {length} positions; this model has max_position_embeddings="
            f"{positions}, which leaves no room for new tokens",
            key="token_ids",
            value=length,
        )
    if positions is not None and length + max_new_tokens > positions:
        raise UsageError(
            f"max_new_tokens={max_new_tokens}: with the prompt's {length} tokens that is "
            f"{length + max_new_tokens} positions, past this model's max_position_embeddings="
            f"{positions}; expected max_new_tokens <= {positions - length}",
            key="max_new_tokens",
            value=max_new_tokens,
        )
    check_memory(
        spec,
        batch=batch,
        seq_len=length + max_new_tokens,
        dtype=str(model.compute_dtype),
        argument="token_ids / max_new_tokens",
    )


def _eos_ids(eos_token_id, vocab_size):
    if eos_token_id is None:
        return np.array([], dtype=np.int64)
    try:
        ids = np.atleast_1d(np.asarray(eos_token_id))
    except ValueError:  # a ragged list
        ids = np.array([], dtype=object)
    if (
        ids.ndim != 1
        or not np.issubdtype(ids.dtype, np.integer)
        or ((ids < 0) | (ids >= vocab_size)).any()
    ):
        raise UsageError(
            f"eos_token_id={shown(eos_token_id)}; expected token id(s) in [0, {vocab_size})",
            key="eos_token_id",
        )
    return ids


def _generator(seed):
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0
    ):
        raise UsageError(f"seed={shown(seed)}; expected a non-negative integer or None", key="seed")
    return np.random.default_rng(seed)


def generate(
    model,
    token_ids,
    max_new_tokens,
    *,
    temperature=0.0,
    top_k=None,
    top_p=None,
    seed=None,
    eos_token_id=None,
    padding_mask=None,
    compile_torch=False,
):
    """Continue each prompt by up to `max_new_tokens` tokens.

    Args:
        model: a `DecoderModel`.
        token_ids: `(B, T)` prompt ids (left-padded when rows differ in length).
        max_new_tokens: tokens to add, > 0.
        temperature: 0 is greedy; above 0 samples from `softmax(logits / temperature)`.
        top_k: sample among the `top_k` most likely tokens only.
        top_p: sample among the smallest set of tokens whose probability reaches `top_p`.
        seed: seed of the sampling generator (same seed, same tokens).
        eos_token_id: id or ids that end a row; the row is then filled with the first one,
            and generation stops early when every row has ended.
        padding_mask: `(B, T)`, False at left padding.
        compile_torch: on PyTorch, `torch.compile` the prefill and step.

    Returns:
        NumPy int32 `(B, T + n)`: the prompts followed by the `n <= max_new_tokens` new
        tokens (`n < max_new_tokens` only when every row reached an EOS).

    Raises:
        UsageError (a ValueError): a bad argument (non-positive `max_new_tokens`, ids
            outside the vocabulary, a ragged or right-padded prompt, a prompt plus
            `max_new_tokens` longer than the model's `max_position_embeddings`, a KV cache
            larger than the device's memory, ...), named in the message.

    Example:
        >>> generate(model, [[5, 6, 7]], max_new_tokens=2, temperature=0.8, seed=0)
        ... # doctest: +SKIP
        array([[ 5,  6,  7, 41, 12]], dtype=int32)
    """
    ids, mask = _check_arguments(
        model, token_ids, max_new_tokens, temperature, top_k, top_p, padding_mask
    )
    eos = _eos_ids(eos_token_id, model.vocab_size)
    rng = _generator(seed)
    batch, length = ids.shape
    model.check_length(length + int(max_new_tokens), argument="the prompt and max_new_tokens")
    max_length = -(-(length + max_new_tokens) // CACHE_BUCKET) * CACHE_BUCKET
    key_mask = np.ones((batch, max_length), dtype=bool)
    key_mask[:, :length] = mask

    decoder = _decoder_for(model, compile_torch)
    with decoder.borrowed_caches(batch, max_length) as caches:
        # Unpadded prompts need no key mask: causal attention alone, which the fused
        # kernels compute without building a mask (and skip the masked triangle).
        key_mask_tensor = None if mask.all() else keras.ops.convert_to_tensor(key_mask)
        logits, caches = decoder.prefill(keras.ops.convert_to_tensor(ids), key_mask_tensor, caches)
        finished = np.zeros(batch, dtype=bool)
        new_tokens = []
        for step in range(max_new_tokens):
            chosen = _choose(
                np.asarray(keras.ops.convert_to_numpy(logits)), temperature, top_k, top_p, rng
            ).astype(np.int32)
            if eos.size:
                chosen = np.where(finished, eos[0], chosen)
                finished |= np.isin(chosen, eos)
            new_tokens.append(chosen)
            if step == max_new_tokens - 1 or (eos.size and finished.all()):
                break
            logits, caches = decoder.step(
                keras.ops.convert_to_tensor(chosen[:, None]), key_mask_tensor, caches, length + step
            )
    return np.concatenate([ids, np.stack(new_tokens, axis=1)], axis=1)


__all__ = ["CACHE_BUCKET", "generate", "generation_stats"]
