"""Grouped-query attention: the one attention implementation of keras-mha.

Multi-head attention (`num_key_value_heads == num_heads`) and multi-query
attention (`num_key_value_heads == 1`) are this layer with a fixed KV-head
count; see `multi_head_attention.py` and `multi_query_attention.py`.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_mha.layers import (
    attention_kernels,
    attention_probe,
    decode_attention,
    eager_decode,
    kv_cache,
    masks,
    validation,
)
from keras_mha.layers.linear import linear
from keras_mha.layers.rotary_embedding import RotaryEmbedding, check_rope_scaling

_positive_int = validation.positive_int


def _propagated_mask(tensor):
    """The padding mask Keras attached to `tensor` (e.g. by Embedding(mask_zero=True))."""
    return getattr(tensor, "_keras_mask", None)


def _static_int(value):
    """The Python int behind `value`, or None when it is traced / symbolic."""
    if value is None or isinstance(value, (int, np.integer)):
        return None if value is None else int(value)
    if keras.backend.backend() == "torch":
        import torch

        if torch.compiler.is_compiling():
            return None  # Reading the value would break the graph.
        if isinstance(value, torch.Tensor) and value.device.type != "cpu":
            return None  # Reading it back would stall the device's queue every step.
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        if tf.is_tensor(value) and not tf.executing_eagerly():
            # A constant in a graph (`tf.constant(7)` inside `tf.function`) is known when
            # the step is traced, so an overrun is refused there rather than NaN at run time.
            static = tf.get_static_value(value)
            return None if static is None else int(static)
    try:
        return int(ops.convert_to_numpy(value))
    except Exception:  # A tracer (jax.jit, tf.function) has no value yet.
        return None


def _reads_prefix_cheaply():
    """Whether slicing the cache's written prefix is a free view (eager PyTorch).

    Elsewhere the step attends to the whole fixed-length cache under a mask:
    a slice would copy under XLA, and a new length per step would recompile.
    """
    if keras.backend.backend() != "torch":
        return False
    import torch

    return not torch.compiler.is_compiling()


@keras.saving.register_keras_serializable(package="keras_mha")
class GroupedQueryAttention(keras.layers.Layer):
    """Grouped-query attention (GQA), covering multi-head and multi-query attention.

    `num_heads` query heads share `num_key_value_heads` key/value heads, each
    KV head serving `num_heads // num_key_value_heads` consecutive query heads
    (the layout of Llama, Mistral, Qwen, Gemma and `keras.layers.GroupQueryAttention`).
    K/V are never repeated: queries are grouped against their shared KV head.

    Args:
        num_heads: number of query heads.
        num_key_value_heads: number of key/value heads; must divide `num_heads`.
        head_dim: size of each head. Default: query features // `num_heads`.
            May differ from that (Gemma).
        output_dim: features of the output. Default: the query's features.
        dropout: dropout rate on the attention weights during training.
        use_bias: whether the query/key/value projections have biases.
        use_output_bias: whether the output projection has a bias. Default:
            same as `use_bias` (Qwen2: `use_bias=True, use_output_bias=False`).
        causal: each query attends only to keys at its position or before.
        sliding_window: each query attends only to the `sliding_window` most
            recent positions, its own included (Mistral); implies `causal`.
        use_rope: apply rotary position embeddings to queries and keys.
        rope_theta: RoPE base (`max_wavelength`).
        partial_rotary_factor: fraction of each head that rotates (Phi-2).
        rope_scaling: None, linear or llama3 scaling, as a Hugging Face dict.
        use_qk_norm: RMS-normalise each query and key head before RoPE (Qwen3,
            Gemma 3), with a learned scale of size `head_dim` each.
        qk_norm_epsilon: epsilon of that RMS norm.
        logit_soft_cap: cap `c` of `c * tanh(logits / c)` (Gemma 2).
        attention_scale: multiplier of the logits. Default `head_dim ** -0.5`
            (Gemma uses `query_pre_attn_scalar ** -0.5`).
        flash_attention: None picks the backend's fused kernel whenever the call
            allows (no attention weights returned, no active dropout, no soft
            cap); False always uses the generic `keras.ops` path; True requires
            the fused path and raises when the call cannot use it.
        kernel_initializer, bias_initializer, kernel_regularizer,
        bias_regularizer, activity_regularizer, kernel_constraint,
        bias_constraint: as in `keras.layers.Dense`.
        seed: seed of the dropout.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(batch, query_length, query_features)`.
        value: `(batch, key_length, value_features)`; default `query`
            (self-attention).
        key: `(batch, key_length, key_features)`; default `value`.
        attention_mask: boolean, `True` where a query may attend:
            `(batch, query_length, key_length)`, `(query_length, key_length)` or
            `(batch, 1 | num_heads, query_length, key_length)`. Combined with
            the padding masks that Keras propagates (`Embedding(mask_zero=True)`)
            and with the causal / sliding-window constraint.
        return_attention_scores: also return the attention weights,
            `(batch, num_heads, query_length, key_length)`.
        training: whether dropout is active.
        use_causal_mask: overrides the constructor's `causal` for this call.
        cache: KV cache from `init_cache` for self-attention decoding, or from
            `compute_cross_attention_cache` for cross-attention: a
            `KVCache(key, value)` pair, each `(batch, num_key_value_heads,
            max_length, head_dim)`; on TensorFlow, a cache of variables from
            `init_cache(..., variables=True)` is updated in place and returned
            as it is.
        cache_index: position of the first query token when decoding with a
            self-attention cache; the new keys/values are written there.
            None with a cache means the cache is read-only (cross-attention).
        query_mask, value_mask, key_mask, mask: padding masks `(batch, length)`;
            Keras fills them from `Embedding(mask_zero=True)` outputs (`mask`
            when the layer is given a single tensor, i.e. self-attention).

    Returns:
        `output` of shape `(batch, query_length, output_dim)`; with
        `return_attention_scores`, `(output, scores)`; with a `cache`,
        the updated cache is appended: `(output, cache)` or
        `(output, scores, cache)`.

    Example:
        >>> layer = GroupedQueryAttention(num_heads=8, num_key_value_heads=2, causal=True)
        >>> x = keras.random.normal((2, 10, 64))
        >>> layer(x).shape
        (2, 10, 64)
        >>> cache = layer.init_cache(batch_size=2, max_length=16)
        >>> out, cache = layer(x, cache=cache, cache_index=0)        # prefill
        >>> step, cache = layer(x[:, -1:], cache=cache, cache_index=10)  # one token
        >>> step.shape
        (2, 1, 64)
    """

    def __init__(
        self,
        num_heads,
        num_key_value_heads,
        head_dim=None,
        output_dim=None,
        dropout=0.0,
        use_bias=True,
        use_output_bias=None,
        causal=False,
        sliding_window=None,
        use_rope=False,
        rope_theta=10000.0,
        partial_rotary_factor=1.0,
        rope_scaling=None,
        use_qk_norm=False,
        qk_norm_epsilon=1e-6,
        logit_soft_cap=None,
        attention_scale=None,
        flash_attention=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        kernel_regularizer=None,
        bias_regularizer=None,
        activity_regularizer=None,
        kernel_constraint=None,
        bias_constraint=None,
        seed=None,
        **kwargs,
    ):
        super().__init__(activity_regularizer=activity_regularizer, **kwargs)
        self.supports_masking = True
        self.num_heads = _positive_int("num_heads", num_heads)
        self.num_key_value_heads = _positive_int("num_key_value_heads", num_key_value_heads)
        if self.num_heads % self.num_key_value_heads:
            raise ValueError(
                f"`num_key_value_heads`={self.num_key_value_heads} must divide "
                f"`num_heads`={self.num_heads}."
            )
        self.head_dim = _positive_int("head_dim", head_dim, allow_none=True)
        self.output_dim = _positive_int("output_dim", output_dim, allow_none=True)
        self.sliding_window = _positive_int("sliding_window", sliding_window, allow_none=True)
        if flash_attention is not None and not isinstance(flash_attention, bool):
            raise ValueError(
                f"`flash_attention` must be None, True or False; received {flash_attention!r}."
            )
        self.dropout = validation.finite_number("dropout", dropout, at_least=0, below=1)
        self.use_bias = validation.flag("use_bias", use_bias)
        use_output_bias = validation.flag("use_output_bias", use_output_bias, allow_none=True)
        self.use_output_bias = self.use_bias if use_output_bias is None else use_output_bias
        self.causal = validation.flag("causal", causal)
        self.use_rope = validation.flag("use_rope", use_rope)
        self.rope_theta = validation.finite_number("rope_theta", rope_theta, above=0)
        self.partial_rotary_factor = validation.finite_number(
            "partial_rotary_factor", partial_rotary_factor, above=0, at_most=1
        )
        check_rope_scaling(rope_scaling)
        self.rope_scaling = dict(rope_scaling) if rope_scaling is not None else None
        self.use_qk_norm = validation.flag("use_qk_norm", use_qk_norm)
        self.qk_norm_epsilon = validation.finite_number("qk_norm_epsilon", qk_norm_epsilon, above=0)
        self.logit_soft_cap = validation.finite_number(
            "logit_soft_cap", logit_soft_cap, above=0, allow_none=True
        )
        self.attention_scale = validation.finite_number(
            "attention_scale", attention_scale, above=0, allow_none=True
        )
        self.flash_attention = flash_attention
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        self.seed = validation.optional_int("seed", seed)
        self.seed_generator = keras.random.SeedGenerator(seed) if self.dropout > 0 else None
        self.rotary_embedding = (
            RotaryEmbedding(
                max_wavelength=self.rope_theta,
                partial_rotary_factor=self.partial_rotary_factor,
                rope_scaling=self.rope_scaling,
                dtype=self.dtype_policy,
                name="rotary_embedding",
            )
            if self.use_rope
            else None
        )

    @property
    def num_query_groups(self):
        """Query heads per KV head."""
        return self.num_heads // self.num_key_value_heads

    # ------------------------------------------------------------------ build
    def _clone_initializer(self, initializer):
        # A fresh instance per weight so that seeded initializers differ per weight.
        return initializer.__class__.from_config(initializer.get_config())

    def _add_kernel(self, name, shape):
        return self.add_weight(
            name=name,
            shape=shape,
            initializer=self._clone_initializer(self.kernel_initializer),
            regularizer=self.kernel_regularizer,
            constraint=self.kernel_constraint,
        )

    def _add_bias(self, name, shape):
        return self.add_weight(
            name=name,
            shape=shape,
            initializer=self._clone_initializer(self.bias_initializer),
            regularizer=self.bias_regularizer,
            constraint=self.bias_constraint,
        )

    def build(self, query_shape, value_shape=None, key_shape=None):
        validation.check_input_shapes(query_shape, value_shape, key_shape)
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        query_features = query_shape[-1]
        value_features, key_features = value_shape[-1], key_shape[-1]
        for name, shape in (("query", query_shape), ("value", value_shape), ("key", key_shape)):
            if shape[-1] is None:
                raise ValueError(
                    f"The last dimension of `{name}` must be known; received shape {tuple(shape)}."
                )
        if self.head_dim is None:
            if query_features % self.num_heads:
                raise ValueError(
                    f"`head_dim` is None, so it is query features / num_heads, but query "
                    f"features={query_features} is not divisible by `num_heads`={self.num_heads}. "
                    "Pass `head_dim` explicitly."
                )
            self.head_dim = query_features // self.num_heads
        self._query_features = query_features
        self._value_features = value_features
        self._key_features = key_features
        output_dim = self.output_dim or query_features
        heads, kv_heads, head_dim = self.num_heads, self.num_key_value_heads, self.head_dim
        self.query_kernel = self._add_kernel("query_kernel", (query_features, heads, head_dim))
        self.key_kernel = self._add_kernel("key_kernel", (key_features, kv_heads, head_dim))
        self.value_kernel = self._add_kernel("value_kernel", (value_features, kv_heads, head_dim))
        if self.use_bias:
            self.query_bias = self._add_bias("query_bias", (heads, head_dim))
            self.key_bias = self._add_bias("key_bias", (kv_heads, head_dim))
            self.value_bias = self._add_bias("value_bias", (kv_heads, head_dim))
        self.output_kernel = self._add_kernel("output_kernel", (heads, head_dim, output_dim))
        if self.use_output_bias:
            self.output_bias = self._add_bias("output_bias", (output_dim,))
        if self.use_qk_norm:
            self.query_norm_scale = self.add_weight(
                name="query_norm_scale", shape=(head_dim,), initializer="ones"
            )
            self.key_norm_scale = self.add_weight(
                name="key_norm_scale", shape=(head_dim,), initializer="ones"
            )
        if self.rotary_embedding is not None:
            # No weights, but an unbuilt sublayer makes Model.fit/predict run an
            # extra eager pass first to build it.
            self.rotary_embedding.build((None, None, heads, head_dim))
        # The pruning hook: 1 keeps a head, 0 silences it. Not trained; saved with
        # the weights, so a half-pruned model resumes where it stopped.
        self.head_gates = self.add_weight(
            name="head_gates", shape=(heads,), initializer="ones", trainable=False
        )
        self.built = True

    # ---------------------------------------------------------------- helpers
    def _project(self, inputs, kernel, bias):
        # One matmul against the kernel viewed as (features, heads * head_dim):
        # torch's einsum copies a permuted kernel on every call.
        features, heads, head_dim = kernel.shape
        if bias is not None:
            bias = ops.reshape(bias, (heads * head_dim,))
        projected = linear(inputs, ops.reshape(kernel, (features, heads * head_dim)), bias)
        shape = ops.shape(inputs)
        return ops.reshape(projected, (shape[0], shape[1], heads, head_dim))

    def _rms_norm(self, heads, scale):
        # In float32: mean of squares of float16 activations overflows easily.
        x = ops.cast(heads, "float32")
        x = x * ops.rsqrt(ops.mean(ops.square(x), axis=-1, keepdims=True) + self.qk_norm_epsilon)
        return ops.cast(x * ops.cast(scale, "float32"), heads.dtype)

    def _check_features(self, name, tensor, expected):
        validation.check_rank(name, tensor.shape)
        features = tensor.shape[-1]
        if features is not None and expected is not None and features != expected:
            raise ValueError(
                f"`{name}` has {features} features (shape {tuple(tensor.shape)}) but the layer "
                f"was built for {expected}."
            )

    def init_cache(self, batch_size, max_length, dtype=None, *, variables=False):
        """A zero KV cache for self-attention decoding of up to `max_length` tokens.

        Returns a `KVCache(key, value)` pair (a NamedTuple, so a pytree / nest
        that `jax.jit`, `tf.function` and `torch.compile` take as it is), each
        buffer `(batch_size, num_key_value_heads, max_length, head_dim)`. Treat
        it as opaque: pass it to the layer with `cache_index` and keep the cache
        the layer returns. Its shape never changes while decoding, so a compiled
        decode step compiles once. Only the KV heads are stored.

        No decode step copies the whole cache, on the documented serving path
        of each backend (see `kv_cache.py`):

        - PyTorch: the buffers are updated in place (outside autograd: under
          `torch.no_grad()` or when nothing requires a gradient);
        - JAX: the layer returns updated buffers, which XLA writes in place
          when the step donates the cache (`jax.jit(step, donate_argnums=...)`);
        - TensorFlow: `variables=True` makes the buffers `tf.Variable`s, which
          a step inside `tf.function(jit_compile=True)` assigns in place; the
          layer returns the same cache. A TensorFlow function cannot donate
          tensors, so with the default cache XLA copies it at every step.
          Create the variable cache outside the `tf.function`, pass it in, and
          keep your handle rather than returning the cache from the function
          (a returned variable comes back as a copy of its value).

        Args:
            batch_size: rows of the batch to decode.
            max_length: positions the cache holds (prompt plus new tokens).
            dtype: the buffers' dtype; None or the layer's compute dtype
                (Keras converts floating call arguments to the compute dtype,
                so a cache of another dtype would be copied at every step).
            variables: TensorFlow only: non-trainable `tf.Variable` buffers,
                updated in place. Refused (`ValueError`) on JAX and PyTorch,
                and inside a `tf.function`.

        Example:
            >>> layer = GroupedQueryAttention(8, 2, head_dim=16)
            >>> layer.build((None, None, 64))
            >>> cache = layer.init_cache(batch_size=1, max_length=32)
            >>> tuple(cache.key.shape), tuple(cache.value.shape)
            ((1, 2, 32, 16), (1, 2, 32, 16))

            Serving on TensorFlow (the variables are created once, outside):

            >>> cache = layer.init_cache(1, 32, variables=True)  # doctest: +SKIP
            >>> @tf.function(jit_compile=True)  # doctest: +SKIP
            ... def step(token, index):
            ...     output, _ = layer(token, cache=cache, cache_index=index)
            ...     return output  # the cache stays in its variables
        """
        if not self.built:
            raise ValueError(
                "`init_cache` needs a built layer (to know `head_dim`); call the layer once "
                "or `layer.build(query_shape)` first."
            )
        _positive_int("batch_size", batch_size)
        _positive_int("max_length", max_length)
        dtype = keras.backend.standardize_dtype(dtype or self.compute_dtype)
        if dtype != self.compute_dtype:
            raise ValueError(
                f"`dtype` of a KV cache must be the layer's compute dtype "
                f"{self.compute_dtype!r} (or None); received {dtype!r}."
            )
        validation.flag("variables", variables)
        make = kv_cache.KVCache.variables if variables else kv_cache.KVCache.zeros
        return make(batch_size, self.num_key_value_heads, max_length, self.head_dim, dtype)

    def compute_cross_attention_cache(self, value, key=None):
        """Project encoder outputs once into a read-only cross-attention cache.

        Example:
            >>> layer = GroupedQueryAttention(4, 2, head_dim=8)
            >>> enc = keras.random.normal((1, 12, 32)); dec = keras.random.normal((1, 1, 32))
            >>> _ = layer(dec, enc)
            >>> cache = layer.compute_cross_attention_cache(enc)
            >>> out, _ = layer(dec, cache=cache)  # no cache_index: read-only
        """
        key = value if key is None else key
        with keras.name_scope(self.name):
            k = self._project(key, self.key_kernel, getattr(self, "key_bias", None))
            v = self._project(value, self.value_kernel, getattr(self, "value_bias", None))
            if self.use_qk_norm:
                k = self._rms_norm(k, self.key_norm_scale)
            if self.use_rope:
                k = self.rotary_embedding(k)
        return kv_cache.KVCache(ops.transpose(k, (0, 2, 1, 3)), ops.transpose(v, (0, 2, 1, 3)))

    def _can_use_fused(self, return_attention_scores, training):
        if attention_probe.is_recording(self):
            return False  # record_attention needs the probabilities (attention_probe.py)
        reasons = []
        if return_attention_scores:
            reasons.append("return_attention_scores=True needs the attention weights")
        if training and self.dropout > 0:
            reasons.append("dropout on attention weights is active")
        if self.logit_soft_cap is not None:
            # keras.ops.dot_product_attention's soft cap is x / (1 + |x| / c), not
            # Gemma 2's c * tanh(x / c), and torch SDPA has none.
            reasons.append("logit_soft_cap needs the generic path")
        if self.flash_attention is True and reasons:
            raise ValueError(
                "`flash_attention=True` but this call cannot use the fused kernel: "
                + "; ".join(reasons)
                + "."
            )
        return self.flash_attention is not False and not reasons

    # ------------------------------------------------------------------- call
    def __call__(self, *args, **kwargs):
        # An eager PyTorch decode step: when Keras's bookkeeping would hand the
        # arguments to `call` unchanged, skip it (it costs as much as the step).
        if eager_decode.skips_keras_call(self, args, kwargs):
            if not self._called:
                self._called = True
            return self._call_decode_step(args[0], **kwargs)
        return super().__call__(*args, **kwargs)

    def _call_decode_step(
        self, query, cache, cache_index, attention_mask=None, use_causal_mask=None, training=None
    ):
        """`call` for the arguments `eager_decode.skips_keras_call` admits."""
        self._check_features("query", query, self._query_features)
        causal = self.causal if use_causal_mask is None else bool(use_causal_mask)
        use_fused = self._can_use_fused(False, training)
        result = self._eager_decode_step(
            query, cache, cache_index, attention_mask, None, causal, use_fused, True
        )
        if result is not None:
            return result
        return self.call(
            query,
            attention_mask=attention_mask,
            training=training,
            use_causal_mask=use_causal_mask,
            cache=cache,
            cache_index=cache_index,
        )

    def _eager_decode_step(
        self,
        query,
        cache,
        cache_index,
        attention_mask,
        query_mask,
        causal,
        use_fused,
        outside_keras_scopes=False,
    ):
        """The step in plain torch ops (eager_decode.py) where it applies, else None."""
        start = _static_int(cache_index)
        if not eager_decode.applies(self, query, cache, start, query_mask, causal, use_fused):
            return None
        cache = self._checked_cache(cache, query)
        kv_cache.check_static_write(start, query.shape[1], cache.max_length)
        return eager_decode.step(
            self, query, cache, start, attention_mask, causal, outside_keras_scopes
        )

    def call(
        self,
        query,
        value=None,
        key=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=None,
        cache=None,
        cache_index=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        mask=None,
    ):
        self_attention = value is None
        # Padding masks propagated by Keras (e.g. Embedding(mask_zero=True)):
        # with one tensor argument Keras passes `mask`, with several it passes
        # `query_mask` / `value_mask` / `key_mask`.
        if query_mask is None:
            query_mask = mask if mask is not None else _propagated_mask(query)
        if self_attention and value_mask is None:
            value_mask = query_mask
        value = query if value is None else value
        key = value if key is None else key
        if value_mask is None:
            value_mask = _propagated_mask(value)
        if key_mask is None and key is not value:
            key_mask = _propagated_mask(key)

        validation.check_call_inputs(query, value, key)
        if cache_index is not None:
            validation.check_cache_index(cache_index)
        self._check_features("query", query, self._query_features)
        causal = self.causal if use_causal_mask is None else bool(use_causal_mask)
        use_fused = self._can_use_fused(return_attention_scores, training)
        if cache is not None and cache_index is not None and self_attention:
            # Eager PyTorch decoding: the step in plain torch ops (eager_decode.py).
            result = self._eager_decode_step(
                query, cache, cache_index, attention_mask, query_mask, causal, use_fused
            )
            if result is not None:
                return result

        q = self._project(query, self.query_kernel, getattr(self, "query_bias", None))
        if self.use_qk_norm:
            q = self._rms_norm(q, self.query_norm_scale)

        if cache is not None and cache_index is None:
            # Read-only cache (cross-attention): keys/values were projected once.
            if not self_attention:
                raise ValueError(
                    "Pass either `value` or a read-only `cache` (cross-attention), not both."
                )
            cache = self._checked_cache(cache, query)
            if self.use_rope:
                q = self.rotary_embedding(q)
            heads, scores = self._attend_cache(
                q, cache, None, None, attention_mask, query_mask, False, use_fused, training
            )
            return self._finish(heads, scores, None, return_attention_scores, cache)

        self._check_features("value", value, self._value_features)
        self._check_features("key", key, self._key_features)
        k = self._project(key, self.key_kernel, getattr(self, "key_bias", None))
        v = self._project(value, self.value_kernel, getattr(self, "value_bias", None))
        if self.use_qk_norm:
            k = self._rms_norm(k, self.key_norm_scale)
        if cache is None:
            if self.use_rope:
                q = self.rotary_embedding(q)
                k = self.rotary_embedding(k)
            heads, scores = self._attend(
                q,
                k,
                v,
                attention_mask,
                query_mask,
                value_mask,
                key_mask,
                causal,
                self_attention,
                use_fused,
                training,
            )
            return self._finish(heads, scores, None, return_attention_scores, None)

        if not self_attention:
            raise ValueError(
                "A cache with `cache_index` is for self-attention decoding; for "
                "cross-attention build one with `compute_cross_attention_cache` and "
                "call without `value` and without `cache_index`."
            )
        cache = self._checked_cache(cache, query)
        start = _static_int(cache_index)
        kv_cache.check_static_write(start, query.shape[1], cache.max_length)
        if self.use_rope:
            positions = ops.arange(ops.shape(query)[1], dtype="int32")
            if start != 0:
                positions = positions + (
                    start if start is not None else ops.cast(cache_index, "int32")
                )
            q = self.rotary_embedding(q, positions=positions)
            k = self.rotary_embedding(k, positions=positions)
        cache, valid = kv_cache.write(cache, k, v, cache_index, start)
        # Keys were padded by the cache, not by this call's mask: the caller
        # passes `attention_mask` over the whole cache instead.
        if start == 0 and k.dtype == cache.key.dtype:
            # A prefill: the cache holds exactly these keys so far, so attend
            # to them as they are, with the fused / blockwise causal paths.
            if attention_mask is not None:
                attention_mask = self._mask_prefix(attention_mask, query, cache.max_length)
            heads, scores = self._attend(
                q, k, v, attention_mask, query_mask, None, None, causal, True, use_fused, training
            )
        else:
            heads, scores = self._attend_cache(
                q,
                cache,
                cache_index,
                start,
                attention_mask,
                query_mask,
                causal,
                use_fused,
                training,
            )
        return self._finish(heads, scores, valid, return_attention_scores, cache)

    def _mask_prefix(self, attention_mask, query, max_length):
        """The first `query_length` keys of a mask given over the whole cache."""
        mask = masks.normalise_attention_mask(
            attention_mask,
            batch=query.shape[0],
            query_length=query.shape[1],
            key_length=max_length,
            num_heads=self.num_heads,
        )
        return mask[..., : query.shape[1]]

    def _attend(
        self,
        q,
        k,
        v,
        attention_mask,
        query_mask,
        value_mask,
        key_mask,
        causal,
        self_attention,
        use_fused,
        training,
    ):
        """Attention of projected `q` `(B, T, H, D)` over `k`, `v` `(B, S, Hkv, D)`."""
        mask, plain_causal = masks.combine_masks(
            query=q,
            key=k,
            num_heads=self.num_heads,
            attention_mask=attention_mask,
            query_mask=query_mask,
            value_mask=value_mask,
            key_mask=key_mask,
            causal=causal,
            sliding_window=self.sliding_window,
        )
        if plain_causal and not use_fused:
            # Only the fused kernels apply a causal mask by themselves.
            mask = attention_kernels.causal_mask_for(q, k)
            plain_causal = False
        scale = self._scale()
        if k.dtype != q.dtype:
            k, v = ops.cast(k, q.dtype), ops.cast(v, q.dtype)
        if not use_fused:
            return self._generic_attention(q, k, v, mask, scale, training)
        if plain_causal and attention_kernels.prefers_blockwise_causal(q, k):
            heads = attention_kernels.blockwise_causal_attention(q, k, v, scale=scale)
            return heads, None
        # Causal, window and cache masks always leave a query its own key in
        # self-attention; only these masks can empty a row.
        rows_may_be_empty = not self_attention or any(
            m is not None for m in (attention_mask, query_mask, value_mask, key_mask)
        )
        heads = attention_kernels.fused_attention(
            q,
            k,
            v,
            mask,
            scale=scale,
            is_causal=plain_causal,
            rows_may_be_empty=rows_may_be_empty,
        )
        return heads, None

    def _attend_cache(
        self, q, cache, cache_index, start, attention_mask, query_mask, causal, use_fused, training
    ):
        """Attention of `q` `(B, T, H, D)` over the cache's written positions.

        `cache_index` is None for a read-only (cross-attention) cache, where
        every position counts; `start` is its Python int when known.
        """
        keys, values = cache.key, cache.value
        query_length = q.shape[1]
        key_length = cache.max_length
        offset = cache_index
        if cache_index is not None and start is not None and _reads_prefix_cheaply():
            # Eager PyTorch: attend to the written prefix only (a view, no copy),
            # which needs no mask for a single token.
            stop = start + query_length
            first = 0
            if self.sliding_window is not None and causal:
                first = max(0, start - self.sliding_window + 1)
            keys, values = keys[:, :, first:stop], values[:, :, first:stop]
            if attention_mask is not None:
                mask = masks.normalise_attention_mask(
                    attention_mask,
                    batch=q.shape[0],
                    query_length=query_length,
                    key_length=key_length,
                    num_heads=self.num_heads,
                )
                attention_mask = mask[..., first:stop]
            key_length, offset = stop - first, start - first
            if query_length == 1 and attention_mask is None and query_mask is None:
                offset = None  # Every key of the prefix is visible: no mask at all.
        mask = None
        if offset is not None or attention_mask is not None or query_mask is not None:
            mask, _ = masks.combine_masks(
                query=q,
                key_length=key_length,
                num_heads=self.num_heads,
                attention_mask=attention_mask,
                query_mask=query_mask,
                causal=causal and offset is not None,
                sliding_window=self.sliding_window if offset is not None else None,
                query_offset=offset,
            )
        if keys.dtype != q.dtype:
            keys, values = ops.cast(keys, q.dtype), ops.cast(values, q.dtype)
        scale = self._scale()
        if not use_fused:
            return self._generic_attention(q, keys, values, mask, scale, training, True)
        rows_may_be_empty = attention_mask is not None or query_mask is not None
        if decode_attention.applies(q, keys):
            heads = decode_attention.single_query_attention(
                q, keys, values, mask, scale=scale, rows_may_be_empty=rows_may_be_empty
            )
            return heads, None
        if decode_attention.applies_flat(q, keys):
            heads = decode_attention.flat_cache_attention(
                q, keys, values, mask, scale=scale, rows_may_be_empty=rows_may_be_empty
            )
            return heads, None
        heads = attention_kernels.fused_attention(
            q,
            keys,
            values,
            mask,
            scale=scale,
            rows_may_be_empty=rows_may_be_empty,
            key_heads_first=True,
        )
        return heads, None

    def _scale(self):
        return self.attention_scale if self.attention_scale is not None else self.head_dim**-0.5

    def _generic_attention(self, q, k, v, mask, scale, training, key_heads_first=False):
        return attention_kernels.grouped_attention(
            q,
            k,
            v,
            mask,
            scale=scale,
            logit_soft_cap=self.logit_soft_cap,
            dropout_rate=self.dropout,
            seed_generator=self.seed_generator,
            training=bool(training),
            return_weights=True,
            key_heads_first=key_heads_first,
        )

    def _finish(self, heads, scores, valid, return_attention_scores, cache):
        """Gate the heads, project the output, and assemble the call's results."""
        num_heads, head_dim, output_dim = self.output_kernel.shape
        kernel = self.output_kernel
        # Eager PyTorch with no head pruned skips the product: a copy of the kernel
        # (or heads) times 1.
        if not eager_decode.gates_are_ones(self):
            gates = ops.cast(self.head_gates, heads.dtype)
            batch, length = heads.shape[0], heads.shape[1]
            if isinstance(batch, int) and isinstance(length, int) and batch * length > output_dim:
                # Gating the kernel (heads x head_dim x output_dim values) costs less
                # than gating the heads (batch x length x heads x head_dim values);
                # with the gates at 1 the products are exact, so the output is too.
                kernel = kernel * gates[:, None, None]
            else:
                heads = heads * gates[:, None]
        shape = ops.shape(heads)
        output = linear(
            ops.reshape(heads, (shape[0], shape[1], num_heads * head_dim)),
            ops.reshape(kernel, (num_heads * head_dim, output_dim)),
            self.output_bias if self.use_output_bias else None,
        )
        if valid is not None:
            # A traced cache_index overran the cache: the write was skipped, and
            # NaN outputs make sure the step cannot pass for a good one.
            output = ops.where(valid, output, ops.cast(float("nan"), output.dtype))
        if scores is not None:
            attention_probe.observe(self, scores)
        results = [output]
        if return_attention_scores:
            results.append(scores)
        if cache is not None:
            results.append(cache)
        return results[0] if len(results) == 1 else tuple(results)

    def _checked_cache(self, cache, query):
        return kv_cache.as_kv_cache(
            cache,
            batch_size=query.shape[0],
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            layer_dtype=self.compute_dtype,
        )

    # ---------------------------------------------------------------- shapes
    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        validation.check_input_shapes(query_shape, value_shape, key_shape)
        output_dim = self.output_dim or query_shape[-1]
        return (*query_shape[:-1], output_dim)

    def compute_output_spec(
        self,
        query,
        value=None,
        key=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=None,
        cache=None,
        cache_index=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        mask=None,
    ):
        output = keras.KerasTensor(
            self.compute_output_shape(
                query.shape,
                None if value is None else value.shape,
                None if key is None else key.shape,
            ),
            dtype=self.compute_dtype,
        )
        results = [output]
        if return_attention_scores:
            if cache is not None:
                key_length = cache[0].shape[2]
            else:
                key_length = (
                    key if key is not None else value if value is not None else query
                ).shape[1]
            results.append(
                keras.KerasTensor(
                    (query.shape[0], self.num_heads, query.shape[1], key_length), dtype="float32"
                )
            )
        if cache is not None:
            results.append(
                kv_cache.KVCache(
                    *(keras.KerasTensor(part.shape, dtype=part.dtype) for part in cache)
                )
            )
        return results[0] if len(results) == 1 else tuple(results)

    def compute_mask(self, query, previous_mask=None):
        # The output has one row per query, so it keeps the query's padding mask.
        if previous_mask is not None and not isinstance(previous_mask, (list, tuple)):
            return previous_mask
        return _propagated_mask(query)

    # ---------------------------------------------------------------- pruning
    def prune_heads(self, heads_to_remove):
        """Remove query heads in place; their KV heads go when a whole group goes.

        The kept query heads must leave every surviving KV group with the same
        number of query heads, so the result is again a regular GQA layer.
        Kernels shrink; the output equals that of this layer with the removed
        heads' gates at zero. After pruning a compiled model, compile it again.

        Args:
            heads_to_remove: indices of query heads, in `[0, num_heads)`.

        Returns:
            The kept query-head indices (into the old numbering).

        Example:
            >>> layer = GroupedQueryAttention(num_heads=8, num_key_value_heads=2)
            >>> layer.build((None, None, 64))
            >>> layer.prune_heads([4, 5, 6, 7])  # the whole second group
            [0, 1, 2, 3]
            >>> (layer.num_heads, layer.num_key_value_heads)
            (4, 1)
        """
        from keras_mha.layers.head_surgery import prune_layer_heads

        return prune_layer_heads(self, heads_to_remove)

    def convert_kv_heads(self, num_key_value_heads, method="mean"):
        """Pool the key/value heads in place down to `num_key_value_heads` (MHA -> GQA/MQA).

        Each new KV head serves the query heads of the old KV heads it replaces;
        `method` is `"mean"` (their mean: Ainslie et al. 2023), `"first"` (the first of
        them) or `"regroup"` (reorder heads so the most alike share a group, then the
        mean). Kernels shrink, the KV cache too; `.keras` save/load keeps the new
        shape. A `MultiHeadAttention` becomes a `GroupedQueryAttention` (or a
        `MultiQueryAttention` for 1). After converting a compiled model, compile it
        again. See `keras_mha.layers.kv_conversion`.

        Args:
            num_key_value_heads: a divisor of the current `num_key_value_heads`.
            method: `"mean"`, `"first"` or `"regroup"`.

        Returns:
            The query-head order: new query head `i` is old query head `order[i]`.

        Example:
            >>> layer = MultiHeadAttention(num_heads=8, head_dim=16)
            >>> layer.build((None, None, 64))
            >>> _ = layer.convert_kv_heads(2)
            >>> type(layer).__name__, layer.num_key_value_heads
            ('GroupedQueryAttention', 2)
        """
        from keras_mha.layers.kv_conversion import convert_layer_kv_heads

        return convert_layer_kv_heads(self, num_key_value_heads, method)

    # ---------------------------------------------------------------- config
    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "num_key_value_heads": self.num_key_value_heads,
                "head_dim": self.head_dim,
                "output_dim": self.output_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "use_output_bias": self.use_output_bias,
                "causal": self.causal,
                "sliding_window": self.sliding_window,
                "use_rope": self.use_rope,
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
                "rope_scaling": self.rope_scaling,
                "use_qk_norm": self.use_qk_norm,
                "qk_norm_epsilon": self.qk_norm_epsilon,
                "logit_soft_cap": self.logit_soft_cap,
                "attention_scale": self.attention_scale,
                "flash_attention": self.flash_attention,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
                "bias_regularizer": keras.regularizers.serialize(self.bias_regularizer),
                "activity_regularizer": keras.regularizers.serialize(self.activity_regularizer),
                "kernel_constraint": keras.constraints.serialize(self.kernel_constraint),
                "bias_constraint": keras.constraints.serialize(self.bias_constraint),
                "seed": self.seed,
            }
        )
        return config
