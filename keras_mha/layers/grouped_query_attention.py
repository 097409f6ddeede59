"""Grouped-query attention: the one attention layer of keras-mha.

Multi-head attention (`num_key_value_heads == num_heads`) and multi-query
attention (`num_key_value_heads == 1`) are this layer with a fixed KV-head
count; see `multi_head_attention.py` and `multi_query_attention.py`. Its `call` is a
pipeline of steps whose kernels live in their own modules (docs/concepts/attention-paths.md).

Example:
    >>> layer = GroupedQueryAttention(num_heads=8, num_key_value_heads=2, causal=True)
    >>> tuple(layer(keras.random.normal((2, 10, 64))).shape)
    (2, 10, 64)
"""

from __future__ import annotations

import keras
from keras import ops

from keras_mha import backends
from keras_mha.backends.common import attention_probe, kv_cache, padding_masks
from keras_mha.backends.common.linear import linear
from keras_mha.layers import (
    attention_paths,
    kv_quantization,
    quantization,
    validation,
)
from keras_mha.layers.rotary_embedding import RotaryEmbedding, check_rope_scaling

_positive_int = validation.positive_int


def _standard_dtype(dtype):
    """Keras's name of `dtype`, or the value itself when it names no dtype (refused then)."""
    try:
        return keras.backend.standardize_dtype(dtype)
    except (ValueError, TypeError):
        return dtype


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
        kernel_initializer: as in `keras.layers.Dense`.
        bias_initializer: as in `keras.layers.Dense`.
        kernel_regularizer: as in `keras.layers.Dense`.
        bias_regularizer: as in `keras.layers.Dense`.
        activity_regularizer: as in `keras.layers.Dense`.
        kernel_constraint: as in `keras.layers.Dense`.
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
        >>> tuple(layer(x).shape)
        (2, 10, 64)
        >>> cache = layer.init_cache(batch_size=2, max_length=16)
        >>> out, cache = layer(x, cache=cache, cache_index=0)        # prefill
        >>> step, cache = layer(x[:, -1:], cache=cache, cache_index=10)  # one token
        >>> tuple(step.shape)
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
        rotary_embedding = (
            RotaryEmbedding(
                max_wavelength=self.rope_theta,
                partial_rotary_factor=self.partial_rotary_factor,
                rope_scaling=self.rope_scaling,
                dtype=quantization.float_policy(self.dtype_policy),
                name="rotary_embedding",
            )
            if self.use_rope
            else None
        )
        # Held untracked: RoPE has no weights, and a tracked sublayer would hide this layer
        # from `Model.quantize`, which visits only leaf layers (layers/quantization.py).
        object.__setattr__(self, "rotary_embedding", rotary_embedding)

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

    def __call__(self, *args, **kwargs):
        # A decode call (`layer(x, cache=..., cache_index=...)`) where Keras's bookkeeping
        # would add nothing goes straight to the backend's step (eager PyTorch: as fast
        # as the decode function); anything else is Keras's call.
        if len(args) == 1 and "cache" in kwargs:
            done = backends.current().layer_call(self, args[0], kwargs)
            if done is not None:
                return done
        return super().__call__(*args, **kwargs)

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
        heads, head_dim = self.num_heads, self.head_dim
        if self.quantization_mode is not None:  # a quantized layer from a `.keras` file
            quantization.build_quantized(
                self, query_features, key_features, value_features, output_dim
            )
        else:
            self._build_kernels(query_features, key_features, value_features, output_dim)
        if self.use_qk_norm:
            self.query_norm_scale = self.add_weight(
                name="query_norm_scale", shape=(head_dim,), initializer="ones"
            )
            self.key_norm_scale = self.add_weight(
                name="key_norm_scale", shape=(head_dim,), initializer="ones"
            )
        if self.rotary_embedding is not None:
            # No weights; built here so that its first call does not build it.
            self.rotary_embedding.build((None, None, heads, head_dim))
        # The pruning hook: 1 keeps a head, 0 silences it. Not trained; saved with
        # the weights, so a half-pruned model resumes where it stopped.
        self.head_gates = self.add_weight(
            name="head_gates", shape=(heads,), initializer="ones", trainable=False
        )
        self.built = True

    def _build_kernels(self, query_features, key_features, value_features, output_dim):
        shapes = quantization.float_shapes(
            self, query_features, key_features, value_features, output_dim
        )
        for name, shape in shapes.items():
            add = self._add_kernel if name.endswith("_kernel") else self._add_bias
            setattr(self, name, add(name, shape))

    # ----------------------------------------------------------- quantization
    def quantize(self, mode=None, type_check=True, config=None):
        """Quantize the four projections in place, as `Model.quantize(mode)` does.

        Each projection becomes a `keras.layers.Dense` quantized by Keras itself
        (`"int8"`, `"int4"`, `"float8"`, `"gptq"`, `"awq"`); see
        `keras_mha.layers.quantization`. `type_check` is accepted for Keras's call and
        ignored: MHA and MQA are this layer.

        Example:
            >>> layer = GroupedQueryAttention(4, 2, head_dim=8)
            >>> layer.build((None, None, 32))
            >>> layer.quantize("int8")
            >>> layer.quantization_mode
            'int8'
        """
        quantization.quantize_attention(self, mode, config)

    def quantized_call(self, *args, **kwargs):
        # `call` reaches the quantized Dense projections itself.
        return self.call(*args, **kwargs)

    # ---------------------------------------------------------------- helpers
    def _project_heads(self, inputs, name):
        """`inputs` `(B, T, features)` through `{name}_kernel`: `(B, T, heads, head_dim)`.

        One matmul against the kernel viewed as `(features, heads * head_dim)` (torch's
        einsum copies a permuted kernel on every call); queries and keys are then
        RMS-normalised per head with `use_qk_norm`.
        """
        if self.quantization_mode is not None:
            projected = getattr(self, f"{name}_dense")(inputs)
            heads = self.num_heads if name == "query" else self.num_key_value_heads
            shape = ops.shape(inputs)
            projected = ops.reshape(projected, (shape[0], shape[1], heads, self.head_dim))
            return self._normalize_heads(projected, name)
        kernel, bias = getattr(self, f"{name}_kernel"), getattr(self, f"{name}_bias", None)
        features, heads, head_dim = kernel.shape
        if bias is not None:
            bias = ops.reshape(bias, (heads * head_dim,))
        projected = linear(inputs, ops.reshape(kernel, (features, heads * head_dim)), bias)
        shape = ops.shape(inputs)
        projected = ops.reshape(projected, (shape[0], shape[1], heads, head_dim))
        return self._normalize_heads(projected, name)

    def _normalize_heads(self, projected, name):
        norm_scale = getattr(self, f"{name}_norm_scale", None) if self.use_qk_norm else None
        return projected if norm_scale is None else self._rms_norm(projected, norm_scale)

    def _rms_norm(self, heads, scale):
        # In float32: mean of squares of float16 activations overflows easily.
        x = ops.cast(heads, "float32")
        x = x * ops.rsqrt(ops.mean(ops.square(x), axis=-1, keepdims=True) + self.qk_norm_epsilon)
        return ops.cast(x * ops.cast(scale, "float32"), heads.dtype)

    def _rotate(self, q, k, offset=None):
        """RoPE on queries and keys (None: none to rotate) at positions `offset ..`."""
        if not self.use_rope:
            return q, k
        positions = None  # 0 .. length - 1 of each tensor
        if offset is not None:
            positions = ops.arange(ops.shape(q)[1], dtype="int32") + offset
        q = self.rotary_embedding(q, positions=positions)
        return q, None if k is None else self.rotary_embedding(k, positions=positions)

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
            dtype: None or the layer's compute dtype (Keras converts floating call
                arguments to the compute dtype, so a float cache of another dtype
                would be copied at every step); or `"int8"` / `"float8_e4m3fn"`: a
                `QuantizedKVCache` of codes with one scale per token and KV head, in
                the compute dtype (`kv_quantization.py`; the bytes the planner states
                for an int8 / float8 KV cache).
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
        dtype = dtype or self.compute_dtype
        quantized = dtype in kv_quantization.RUNTIME_QUANTIZED
        if not quantized and _standard_dtype(dtype) != self.compute_dtype:
            raise ValueError(
                f"`dtype`={dtype!r} of a KV cache: expected None or the layer's compute dtype "
                f"{self.compute_dtype!r}, or a quantized cache: "
                f"{', '.join(map(repr, kv_quantization.RUNTIME_QUANTIZED))}."
            )
        validation.flag("variables", variables)
        shape = (batch_size, self.num_key_value_heads, max_length, self.head_dim)
        if quantized:
            kind = kv_cache.QuantizedKVCache
            make = kind.variables if variables else kind.zeros
            return make(*shape, dtype, self.compute_dtype)
        make = kv_cache.KVCache.variables if variables else kv_cache.KVCache.zeros
        return make(*shape, self.compute_dtype)

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
            k, v = self._project_heads(key, "key"), self._project_heads(value, "value")
            _, k = self._rotate(k, k)
        return kv_cache.KVCache(ops.transpose(k, (0, 2, 1, 3)), ops.transpose(v, (0, 2, 1, 3)))

    def make_decode_function(self, *, compile_torch=False, jit_compile=True):
        """`decode(query, cache, cache_index, attention_mask=None) -> (output, cache)`.

        The backend's fastest way to run this layer on a KV cache, picked once:
        `jax.jit` with the cache donated (XLA updates it in place: use the cache
        `decode` returns, never the one passed in), `tf.function(jit_compile=True)`
        on TensorFlow (pass a cache from `init_cache(..., variables=True)`, updated
        in place), and on PyTorch eager steps under `torch.no_grad()` that skip
        Keras's per-call bookkeeping where it would change nothing
        (`torch.compile` with `compile_torch=True`). `cache_index=0` (a Python
        int) is the prefill, compiled apart from the steps so that it keeps the
        fused causal kernels; other indices share one compiled step.

        Args:
            compile_torch: PyTorch: `torch.compile` the step instead of eager calls.
            jit_compile: TensorFlow: XLA-compile the step (False: a plain `tf.function`).

        Returns:
            `decode`, returning what `layer(query, cache=cache, cache_index=cache_index,
            attention_mask=attention_mask)` returns.

        Example:
            >>> layer = GroupedQueryAttention(8, 2, head_dim=16, causal=True)
            >>> prompt = keras.random.normal((1, 5, 64))
            >>> _ = layer(prompt)
            >>> decode = layer.make_decode_function()
            >>> cache = layer.init_cache(1, 16, variables=keras.backend.backend() == "tensorflow")
            >>> output, cache = decode(prompt, cache, 0)
            >>> output, cache = decode(prompt[:, -1:], cache, 5)
            >>> tuple(output.shape)
            (1, 1, 64)
        """
        return backends.current().decode_function(
            self, compile_torch=compile_torch, jit_compile=jit_compile
        )

    def _attention_options(self, use_causal_mask, return_attention_scores, training):
        causal = self.causal if use_causal_mask is None else bool(use_causal_mask)
        return attention_paths.AttentionOptions(
            num_heads=self.num_heads,
            scale=self.attention_scale if self.attention_scale is not None else self.head_dim**-0.5,
            causal=causal,
            use_fused=self._can_use_fused(return_attention_scores, training),
            sliding_window=self.sliding_window,
            logit_soft_cap=self.logit_soft_cap,
            dropout=self.dropout,
            seed_generator=self.seed_generator,
            training=bool(training),
        )

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
        inputs = padding_masks.gather(
            query,
            value,
            key,
            query_mask=query_mask,
            value_mask=value_mask,
            key_mask=key_mask,
            mask=mask,
        )
        cache, start = self._check_call(inputs, cache, cache_index)
        options = self._attention_options(use_causal_mask, return_attention_scores, training)
        if cache is not None:  # an eager decode step of the backend's own, or None
            done = backends.current().eager_step(
                self, inputs, query, cache, start, attention_mask, options
            )
            if done is not None:
                return done

        q = self._project_heads(inputs.query, "query")
        k = v = None
        if cache is None or cache_index is not None:  # else keys and values are in the cache
            k, v = (
                self._project_heads(inputs.key, "key"),
                self._project_heads(inputs.value, "value"),
            )
        q, k = self._rotate(q, k, self._position_offset(cache_index, start))
        if isinstance(cache, kv_cache.QuantizedKVCache):
            k, v, written, valid, read = self._write_quantized(cache, k, v, cache_index, start)
            before, after = read, read
        else:
            written, valid = self._write_cache(cache, k, v, cache_index, start)
            before, after = cache, written
        heads, scores = self._compute_attention(
            q, k, v, options, inputs, attention_mask, before, after, cache_index, start
        )
        # The attention weights (None on the fused paths, which a recording turns off).
        attention_probe.observe(self, scores)
        return self._output(heads, scores, valid, return_attention_scores, written)

    def _check_call(self, inputs, cache, cache_index):
        """Check the call's tensors and cache; return `(cache, static cache_index or None)`."""
        validation.check_call_inputs(inputs.query, inputs.value, inputs.key)
        if cache_index is not None:
            validation.check_cache_index(cache_index)
        validation.check_cache_use(cache, cache_index, inputs.self_attention)
        if cache is not None:
            validation.check_query_length(inputs.query.shape)
        self._check_features("query", inputs.query, self._query_features)
        if cache is None or cache_index is not None:  # value and key are projected
            for name in ("value", "key"):
                tensor, expected = getattr(inputs, name), getattr(self, f"_{name}_features")
                if tensor is not inputs.query or expected != self._query_features:
                    self._check_features(name, tensor, expected)
        if cache is None:
            return None, None
        cache = kv_cache.as_kv_cache(
            cache,
            batch_size=inputs.query.shape[0],
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            layer_dtype=self.compute_dtype,
        )
        start = kv_cache.static_index(cache_index)
        if cache_index is not None:
            kv_cache.check_static_write(start, inputs.query.shape[1], cache.max_length)
        return cache, start

    @staticmethod
    def _position_offset(cache_index, start):
        """Position of the first query token: None (0), `start` or the traced index."""
        if cache_index is None or start == 0:
            return None
        return start if start is not None else ops.cast(cache_index, "int32")

    @staticmethod
    def _write_cache(cache, k, v, cache_index, start):
        """`(cache after the write, valid)`; `valid` is whether a traced index fitted."""
        if cache_index is None:  # no cache, or a read-only one
            return cache, None
        return kv_cache.write(cache, k, v, cache_index, start)

    def _write_quantized(self, cache, k, v, cache_index, start):
        """`(k, v, written, valid, read)` for an int8 / float8 cache (`kv_quantization.py`).

        `k`, `v` are this call's keys and values as the cache now holds them, `written`
        the cache of codes after the write, `read` that cache dequantized: attention
        reads it as the cache both before and after the write (a path that takes the
        cache before the write masks the step's position there and adds the step's key).
        """
        written, valid = cache, None
        if cache_index is not None:
            k, v, written, valid = kv_quantization.write(cache, k, v, cache_index, start)
        return k, v, written, valid, kv_quantization.dequantize_cache(written, self.compute_dtype)

    def _compute_attention(
        self, q, k, v, options, inputs, attention_mask, cache, written, cache_index, start
    ):
        """`(heads, weights or None)`: the kernel `attention_paths` picks for this call."""
        if cache is None and q.shape[1] == 0:
            # An empty query attends to nothing: an empty output, as Keras's own layers
            # give (TensorFlow's einsum fails on the grouped product of an empty query).
            batch, keys = ops.shape(q)[0], ops.shape(k)[1]
            heads = ops.zeros((batch, 0, self.num_heads, self.output_kernel.shape[1]), q.dtype)
            return heads, ops.zeros((batch, self.num_heads, 0, keys), q.dtype)
        if cache is not None:
            cache = attention_paths.CacheUse(cache, written, cache_index, start)
        return attention_paths.attend(q, k, v, options, inputs, attention_mask, cache)

    def _output(self, heads, scores, valid, return_attention_scores, cache):
        """Gate the heads, project the output, and assemble the call's results."""
        if self.quantization_mode is not None:
            return self._quantized_output(heads, scores, valid, return_attention_scores, cache)
        num_heads, head_dim, output_dim = self.output_kernel.shape
        kernel = self.output_kernel
        # Eager PyTorch with no head pruned skips the product: a copy of the kernel
        # (or heads) times 1.
        if not backends.current().gates_are_ones(self):
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
        return self._results(output, scores, valid, return_attention_scores, cache)

    def _quantized_output(self, heads, scores, valid, return_attention_scores, cache):
        """`_output` through the quantized output Dense (the gates scale the heads)."""
        heads = heads * ops.cast(self.head_gates, heads.dtype)[:, None]
        shape = ops.shape(heads)
        flat = ops.reshape(heads, (shape[0], shape[1], self.num_heads * self.head_dim))
        output = self.output_dense(flat)
        return self._results(output, scores, valid, return_attention_scores, cache)

    @staticmethod
    def _results(output, scores, valid, return_attention_scores, cache):
        if valid is not None:
            # A traced cache_index overran the cache: the write was skipped, and
            # NaN outputs make sure the step cannot pass for a good one.
            output = ops.where(valid, output, ops.cast(float("nan"), output.dtype))
        results = [output]
        if return_attention_scores:
            results.append(scores)
        if cache is not None:
            results.append(cache)
        return results[0] if len(results) == 1 else tuple(results)

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
            kind = kv_cache.QuantizedKVCache if len(cache) == 4 else kv_cache.KVCache
            results.append(
                kind(*(keras.KerasTensor(part.shape, dtype=part.dtype) for part in cache))
            )
        return results[0] if len(results) == 1 else tuple(results)

    def compute_mask(self, query, previous_mask=None):
        # The output has one row per query, so it keeps the query's padding mask.
        if previous_mask is not None and not isinstance(previous_mask, (list, tuple)):
            return previous_mask
        return padding_masks.propagated_mask(query)

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
