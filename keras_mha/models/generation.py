"""`generate`: greedy or seeded sampling from a `DecoderModel` on the layers' KV cache.

The prompt is run once (prefill) into fixed-shape caches made by each attention layer's
`init_cache` (their inside is the layer's business), then one token per step. The step
is compiled once per model, batch size and cache length, by the one place that picks
the backend, `keras_mha.backends`: `jax.jit` on JAX (stateless, the
weights passed as arguments, the caches donated so that XLA updates them in place),
`tf.function(jit_compile=True)` on TensorFlow (the caches are variables, created outside
the function and updated in place by it: `init_cache(..., variables=True)`), and eager
PyTorch (the caches written in place; measured faster than `torch.compile` for
single-token CPU steps; pass `compile_torch=True` to try it). On PyTorch's CPU a decode
step is the whole model's step in torch ops on weights bound once per call
(`keras_mha.backends.torch.model_step`) wherever it serves the model and the call
(`generation_stats(model)["step"]` is then `"whole_model"`), else the layers' eager
calls. On the CPU, PyTorch's steps
run on the intra-op thread count that times fastest, torch's own or one
(`keras_mha.backends.torch.threads`; `generation_stats(model)["decode_threads"]`). No
step copies the caches.
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
from keras_mha.backends.common import kv_cache
from keras_mha.errors import UsageError
from keras_mha.models import decode_loop
from keras_mha.models.decoder_layout import decoder_layout
from keras_mha.models.direct_calls import direct_calls, supports_direct_calls
from keras_mha.models.eager_calls import eager_calls
from keras_mha.planning.config_values import shown
from keras_mha.planning.kv_formats import RUNTIME_QUANTIZED

CACHE_BUCKET = 64

#: `generate(decode_path=...)`: how the tokens after the prefill are decoded.
DECODE_PATHS = {
    "auto": "the fastest measured for the backend and device (see `default_decode_path`)",
    "loop": "the whole loop as one compiled program (JAX, TensorFlow)",
    "cuda_graph": "PyTorch on CUDA: the step replayed from CUDA graphs, tokens on the device",
    "device_loop": "PyTorch: eager steps, tokens chosen on the device, read back once",
    "per_token": "one compiled (or eager PyTorch) step per token, tokens chosen on the host",
}

# model -> {(compile_torch, kv_cache_dtype): its _CompiledDecoder}; model -> the latest used.
_DECODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LATEST: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _CompiledDecoder:
    """The prefill and step functions of one model, compiled for the current backend."""

    def __init__(self, model, compile_torch=False, kv_cache_dtype=None):
        self.model = model
        self.backend = backends.current()
        self.compile_torch = compile_torch
        self.kv_cache_dtype = kv_cache_dtype
        # TensorFlow cannot donate a function's tensor arguments: its caches are variables.
        self.variable_caches = self.backend.variable_caches
        self.paths = self.backend.decode_paths(model)  # the default first
        # CUDA graphs read the caches at fixed addresses: one set per shape, kept.
        self.keeps_caches = self.variable_caches or "cuda_graph" in self.paths
        self.stats = {
            "backend": backends.name(),
            "compiled": self.backend.compiles_decode or compile_torch,
            "variable_caches": self.variable_caches,
            "path": None,
            "prefill_traces": 0,
            "step_traces": 0,
            "loop_traces": 0,
            "prefill_calls": 0,
            "step_calls": 0,
            "loop_calls": 0,
        }
        self._loops = {}  # LoopShape -> the compiled loop (JAX, TensorFlow)
        self._cuda_step = None
        # PyTorch on the CPU: the whole model's step in torch ops (kept: its fused
        # matrices serve later calls), and the step this call decodes with, if bound.
        self._model_step = None
        self._bound_step = None
        # PyTorch on the CPU: the steps' thread count, chosen by timing them.
        home = self.backend.generation
        self._threads = None if home is None else home.decode_threads(model)
        self.cuda_graph_error = None  # why the CUDA-graph path failed here, if it did
        # TensorFlow: the cache variables of finished calls and the function that zeroes
        # them, by (batch, cache length): creating them took ~40% of a 64-token CPU
        # prefill; zeroing them in one call is cheap.
        self._spare_caches = {}
        self._cache_factories = {}  # (batch, cache length) -> init_caches (jitted on JAX)
        self._prefill, self._step = self._make()

    @contextlib.contextmanager
    def borrowed_caches(self, batch, max_length):
        """Zero caches for one `generate` call: new ones, or on TensorFlow the variables of
        an earlier call of the same shape (a call running beside it gets new ones)."""
        kept = self._spare_caches.pop((batch, max_length), None)
        if kept is None:
            caches = self._new_caches(batch, max_length)
            zero = self.backend.cache_zeroer(caches) if self.keeps_caches else None
        else:
            caches, zero = kept
            zero()
        try:
            yield caches
        finally:
            self._bound_step = None
            if self._model_step is not None:
                self._model_step.release()  # the caches are not kept until the next call
            if self.keeps_caches:
                self._spare_caches[batch, max_length] = caches, zero

    def _new_caches(self, batch, max_length):
        make = self._cache_factories.get((batch, max_length))
        if make is None:
            make = functools.partial(
                self.model.init_caches,
                batch,
                max_length,
                variables=self.variable_caches,
                dtype=self.kv_cache_dtype,
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
            with direct_calls(direct, eager_calls(self.backend.eager_calls())):
                return self._forward(token_ids, key_mask, caches, index)

        self._eager_forward = self._forward if self.backend.compiles_decode else eager_forward

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

    def bind_step(self, caches, key_mask):
        """Choose this call's decode step: on PyTorch's CPU, the whole model's step in
        torch ops (`backends.torch.model_step`, measured the fastest) where it serves
        the model and `caches` without a key mask; else the step `_make` made (the
        layers' eager calls, or `torch.compile`'s). `stats["step"]` says which."""
        home = self.backend.generation
        found = None
        if home is not None and key_mask is None:
            found = home.model_step(decoder_layout(self.model), caches, self._model_step)
        if found is not None:
            self._model_step = found
        self._bound_step = None if found is None else found.forward
        if home is not None:
            kind = "compiled" if self.compile_torch else "layers"
            self.stats["step"] = "whole_model" if found is not None else kind

    def step(self, token_ids, key_mask, caches, index):
        self.stats["step_calls"] += 1
        return (self._bound_step or self._step)(token_ids, key_mask, caches, index)

    def host_conversions(self):
        """`(logits -> NumPy, NumPy token ids -> tensor)` for `per_token`: the backend's
        own where the whole-model step is bound (PyTorch's CPU, where Keras's two
        conversions cost about a fifth of a small model's step), else Keras's."""
        if self._bound_step is not None:
            return self.backend.generation.host_conversions()
        return _to_numpy, keras.ops.convert_to_tensor

    @contextlib.contextmanager
    def tuned_steps(self, step):
        """`step` (a decode step) run on the thread count the backend finds fastest for a
        loop of steps (PyTorch on the CPU: `backends.torch.threads`), else as it is."""
        if self._threads is None:
            yield step
            return
        with self._threads.steps(step) as run:
            yield run
        self.stats["decode_threads"] = self._threads.chosen

    def default_path(self):
        """The path `decode_path="auto"` takes: the backend's first (`decode_paths`): the
        whole loop compiled on JAX and TensorFlow, CUDA graphs on a CUDA GPU; on
        PyTorch's CPU, the whole-model step with tokens chosen on the device where that
        step is bound (`bind_step`), else eager steps with tokens chosen on the host,
        each measured the fastest there (docs/benchmarks.md)."""
        if self.paths[0] == "cuda_graph" and (self.compile_torch or self.cuda_graph_error):
            return "per_token"
        if self.paths[0] == "per_token" and self._bound_step is not None:
            return "device_loop"
        return self.paths[0]

    def _loop_forward(self, token_ids, key_mask, caches, index):
        # The caller checked that prompt and new tokens fit the cache: no overrun guard.
        with kv_cache.index_checked_by_caller():
            return self._forward(token_ids, key_mask, caches, index)

    def loop(self, shape, logits, caches, key_mask, length, count, draws, eos_ids, values):
        """`(tokens (B, n), n, caches)` from the whole loop compiled for `shape`."""
        run = self._loops.get(shape)
        if run is None:
            loop = decode_loop.decode_loop(
                self._loop_forward, shape, carry_caches=not self.variable_caches
            )
            run = self._loops[shape] = self.backend.compile_generation_loop(
                self.model, loop, on_trace=functools.partial(self._count, "loop_traces")
            )
        self.stats["loop_calls"] += 1
        tokens, steps, caches = run(logits, caches, key_mask, length, count, draws, eos_ids, values)
        self.stats["head_copy"] = getattr(run, "head_copy", False)
        steps = int(keras.ops.convert_to_numpy(steps))
        return np.asarray(keras.ops.convert_to_numpy(tokens))[:, :steps], caches

    def device_loop(self, shape, logits, caches, key_mask, length, count, draws, eos_ids, values):
        """PyTorch: `(tokens (B, n), caches)` with the tokens chosen on the device, the
        steps replayed from CUDA graphs on `cuda_graph` (`self.stats["path"]`)."""
        home = self.backend.generation
        if self.stats["path"] == "cuda_graph":
            if self._cuda_step is None:
                self._cuda_step = home.cuda_graph_step(self._forward)
                self.stats["loop_traces"] += 1
            step = self._cuda_step
        else:
            step = home.eager_step(self._bound_step or self._eager_forward)
        self.stats["loop_calls"] += 1
        choose = decode_loop.chooser(shape, draws, eos_ids, values)
        if self._bound_step is not None and not shape.sampling_key[0] and not shape.stops:
            choose = home.greedy  # the same argmax without Keras's dispatch
        with self.tuned_steps(step) as step:
            tokens, _ = home.device_loop(
                step, choose, logits, caches, key_mask, length, count, shape.batch, shape.stops
            )
        return np.asarray(keras.ops.convert_to_numpy(tokens)), caches

    def _count(self, key):
        self.stats[key] += 1


def _decoder_for(model, compile_torch, kv_cache_dtype=None):
    """The model's decoder for these options, kept beside those of other options (a paired
    benchmark alternates float and int8 caches); the latest is `generation_stats`'s."""
    decoders = _DECODERS.setdefault(model, {})
    decoder = decoders.get((compile_torch, kv_cache_dtype))
    if decoder is None:
        decoder = _CompiledDecoder(model, compile_torch, kv_cache_dtype)
        decoders[compile_torch, kv_cache_dtype] = decoder
    _LATEST[model] = decoder
    return decoder


def check_kv_cache_dtype(kv_cache_dtype, key="kv_cache_dtype"):
    """`kv_cache_dtype` if it is None or a quantized KV dtype `init_cache` takes, else a
    `UsageError` naming `key`, the value and what is accepted.

    Example:
        >>> check_kv_cache_dtype("int8")
        'int8'
    """
    if kv_cache_dtype is None or (
        isinstance(kv_cache_dtype, str) and kv_cache_dtype in RUNTIME_QUANTIZED
    ):
        return kv_cache_dtype
    accepted = ", ".join(repr(name) for name in RUNTIME_QUANTIZED)
    raise UsageError(
        f"{key}={shown(kv_cache_dtype)}; expected None (the model's compute dtype) or a "
        f"quantized KV cache: {accepted}",
        key=key,
    )


def generation_stats(model) -> dict:
    """How `generate` ran on `model`: backend, compiled or eager, traces and calls.

    Example:
        >>> generation_stats(model)  # doctest: +SKIP
        {'backend': 'jax', 'compiled': True, 'prefill_traces': 1, 'step_traces': 1, ...}
    """
    decoder = _LATEST.get(model)
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
    positions = spec.positions.max_position_embeddings
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
    decode_path="auto",
    kv_cache_dtype=None,
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
        compile_torch: on PyTorch, `torch.compile` the prefill, and the step where the
            whole-model step does not serve (on the CPU it measured faster than the
            compiled step; `generation_stats(model)["step"]` says which ran).
        decode_path: how the tokens after the prefill are decoded, one of
            `DECODE_PATHS`: "auto" (the default) takes the fastest measured for the
            backend and device; `generation_stats(model)["path"]` says which ran.
        kv_cache_dtype: None (the model's compute dtype), `"int8"` or `"float8_e4m3fn"`:
            KV caches of codes with one scale per token and KV head
            (`GroupedQueryAttention.init_cache`), about a quarter (float32 models) or
            half (16-bit models) of the float cache's bytes.

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
    kv_cache_dtype = check_kv_cache_dtype(kv_cache_dtype)
    eos = _eos_ids(eos_token_id, model.vocab_size)
    rng = _generator(seed)
    batch, length = ids.shape
    model.check_length(length + int(max_new_tokens), argument="the prompt and max_new_tokens")
    max_length = -(-(length + max_new_tokens) // CACHE_BUCKET) * CACHE_BUCKET
    key_mask = np.ones((batch, max_length), dtype=bool)
    key_mask[:, :length] = mask

    decoder = _decoder_for(model, compile_torch, kv_cache_dtype)
    path = _decode_path(decoder, decode_path)
    sampling = decode_loop.Sampling(float(temperature), top_k, top_p)
    failed = False
    with decoder.borrowed_caches(batch, max_length) as caches:
        # Unpadded prompts need no key mask: causal attention alone, which the fused
        # kernels compute without building a mask (and skip the masked triangle).
        key_mask_tensor = None if mask.all() else keras.ops.convert_to_tensor(key_mask)
        logits, caches = decoder.prefill(keras.ops.convert_to_tensor(ids), key_mask_tensor, caches)
        decoder.bind_step(caches, key_mask_tensor)
        if decode_path == "auto":
            path = decoder.default_path()
        decoder.stats["path"] = path
        if path == "per_token":
            new_tokens = _per_token(
                decoder, logits, caches, key_mask_tensor, length, max_new_tokens, sampling, eos, rng
            )
        else:
            shape = decode_loop.LoopShape(
                batch,
                max_length,
                sampling.key(model.vocab_size),
                stops=bool(eos.size),
                masked=key_mask_tensor is not None,
            )
            draws = None
            if shape.sampling_key[0]:
                draws = decode_loop.uniform_draws(rng, max_new_tokens, batch)
            arguments = (
                shape,
                logits,
                caches,
                key_mask_tensor,
                length,
                int(max_new_tokens),
                None if draws is None else keras.ops.convert_to_tensor(draws),
                keras.ops.convert_to_tensor(eos.astype(np.int32)) if eos.size else None,
                tuple(keras.ops.convert_to_tensor(v) for v in sampling.values())
                if shape.sampling_key[0]
                else None,
            )
            run = decoder.loop if path == "loop" else decoder.device_loop
            try:
                new_tokens, caches = run(*arguments)
            except Exception as error:
                if not (path == "cuda_graph" and decode_path == "auto"):
                    raise
                # Chosen by default and never run on this GPU before: say why, and
                # decode this and every later call one step per token.
                decoder.cuda_graph_error = f"{type(error).__name__}: {error}"[:500]
                decoder.stats["cuda_graph_error"] = decoder.cuda_graph_error
                failed = True
            new_tokens = None if failed else _cut_after_stop(new_tokens, eos)
    if failed:
        return generate(model, token_ids, max_new_tokens, temperature=temperature, top_k=top_k,
                        top_p=top_p, seed=seed, eos_token_id=eos_token_id,
                        padding_mask=padding_mask, decode_path="per_token")  # fmt: skip
    return np.concatenate([ids, new_tokens.astype(np.int32)], axis=1)


def _per_token(decoder, logits, caches, key_mask, length, max_new_tokens, sampling, eos, rng):
    """`(B, n)` tokens, one compiled (or eager) step each, chosen on the host."""
    batch = logits.shape[0]
    finished = np.zeros(batch, dtype=bool)
    new_tokens = []
    to_numpy, to_tensor = decoder.host_conversions()
    with decoder.tuned_steps(decoder.step) as run_step:
        for step in range(max_new_tokens):
            chosen = _choose(
                to_numpy(logits),
                sampling.temperature,
                sampling.top_k,
                sampling.top_p,
                rng,
            ).astype(np.int32)
            if eos.size:
                chosen = np.where(finished, eos[0], chosen)
                finished |= np.isin(chosen, eos)
            new_tokens.append(chosen)
            if step == max_new_tokens - 1 or (eos.size and finished.all()):
                break
            logits, caches = run_step(to_tensor(chosen[:, None]), key_mask, caches, length + step)
    return np.stack(new_tokens, axis=1)


def _to_numpy(tensor):
    return np.asarray(keras.ops.convert_to_numpy(tensor))


def _cut_after_stop(tokens, eos):
    """`tokens` `(B, n)` up to the token at which every row had chosen an EOS id (a loop
    that reads "all ended?" only now and then runs past it), as the per-token path stops."""
    if not eos.size or tokens.shape[1] == 0:
        return tokens
    ended = np.isin(tokens, eos)
    if not ended.any(axis=1).all():
        return tokens
    return tokens[:, : int(ended.argmax(axis=1).max()) + 1]


def _decode_path(decoder, decode_path):
    if decode_path not in DECODE_PATHS:
        raise UsageError(
            f"decode_path={shown(decode_path)}; expected one of {', '.join(DECODE_PATHS)}",
            key="decode_path",
        )
    if decode_path == "auto":
        return decoder.default_path()
    if decode_path not in (*decoder.paths, "per_token"):
        device = "" if "cuda_graph" in decoder.paths else " on this device"
        raise UsageError(
            f"decode_path={decode_path!r} is not available on {backends.name()}{device}: "
            f"{DECODE_PATHS[decode_path]}",
            key="decode_path",
        )
    return decode_path


__all__ = ["CACHE_BUCKET", "DECODE_PATHS", "generate", "generation_stats"]
