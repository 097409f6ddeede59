"""The layers whole models are made of: an RMS norm and one decoder / encoder block.

Attention is always a `keras_mha.layers.GroupedQueryAttention` (or its MHA / MQA
subclasses), so head pruning, head-parallel layouts and the KV cache work on every
block as they do on a lone layer. A decoder block's traits (RMS or LayerNorm, gated or
plain MLP, sequential or parallel residual, sandwich norms) are constructor arguments
read from the family data and the `ModelSpec`, never from a family name.

Example:
    >>> from keras_mha.layers import GroupedQueryAttention
    >>> attention = GroupedQueryAttention(4, 2, head_dim=16, causal=True, use_rope=True)
    >>> block = DecoderBlock(64, 128, attention, activation="silu")
    >>> tuple(block(keras.random.normal((1, 5, 64))).shape)
    (1, 5, 64)
"""

from __future__ import annotations

import keras
from keras import ops

from keras_mha.models.direct_calls import activate, add_into, multiply_into, run
from keras_mha.models.sublayer_policies import policy_for, quantized_policies
from keras_mha.models.supported import ACTIVATIONS


def _activation(name):
    function_name, arguments = ACTIVATIONS[name]
    function = getattr(keras.activations, function_name)
    return lambda x: function(x, **arguments)


def make_norm(norm_type, epsilon, *, scale_offset=0.0, bias=False, dtype=None, name=None):
    """An `RMSNorm` (`norm_type="rms"`) or a Keras `LayerNormalization` (`"layer"`, with a
    bias when `bias`): the norm a family's blocks use.

    Example:
        >>> make_norm("layer", 1e-5, bias=True, name="ln").center
        True
    """
    if norm_type == "rms":
        return RMSNorm(epsilon, scale_offset, dtype=dtype, name=name)
    if norm_type != "layer":
        raise ValueError(f"norm_type={norm_type!r}; expected 'rms' or 'layer'")
    return keras.layers.LayerNormalization(epsilon=epsilon, center=bias, dtype=dtype, name=name)


def _attention_layer(attention, hidden_size, dtype):
    """A built attention layer from a layer or its serialized config."""
    if isinstance(attention, dict):
        attention = keras.saving.deserialize_keras_object(attention)
    if not attention.built:
        attention.build((None, None, hidden_size))
    return attention


@keras.saving.register_keras_serializable(package="keras_mha")
class RMSNorm(keras.layers.Layer):
    """Root-mean-square norm computed in float32, as transformers does.

    Args:
        epsilon: added to the mean square.
        scale_offset: the output is multiplied by `scale_offset + scale`: 0 for Llama,
            1 for Gemma, whose checkpoints store `scale - 1`.

    Example:
        >>> tuple(RMSNorm(1e-6)(keras.ops.ones((1, 2, 8))).shape)
        (1, 2, 8)
    """

    def __init__(self, epsilon=1e-6, scale_offset=0.0, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = float(epsilon)
        self.scale_offset = float(scale_offset)

    def build(self, input_shape):
        initializer = "zeros" if self.scale_offset else "ones"
        self.scale = self.add_weight(
            name="scale", shape=(input_shape[-1],), initializer=initializer
        )
        self.built = True

    def call(self, inputs):
        x = ops.cast(inputs, "float32")
        x = x * ops.rsqrt(ops.mean(ops.square(x), axis=-1, keepdims=True) + self.epsilon)
        if self.scale_offset:
            # Gemma: (1 + w) in float32, then cast.
            return ops.cast(x * (self.scale_offset + ops.cast(self.scale, "float32")), inputs.dtype)
        # Llama: cast first, then multiply in the input's dtype.
        return ops.cast(x, inputs.dtype) * ops.cast(self.scale, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon, "scale_offset": self.scale_offset}


@keras.saving.register_keras_serializable(package="keras_mha")
class DecoderBlock(keras.layers.Layer):
    """A pre-norm decoder block: `x + attention(norm(x))`, then `x + mlp(norm(x))`.

    The MLP is gated, `down(activation(gate(x)) * up(x))` (Llama), or plain,
    `down(activation(up(x)))` (GPT-2, GPT-NeoX). With `parallel_residual` (GPT-NeoX) both
    sublayers read the block's input: `x + attention(norm_1(x)) + mlp(norm_2(x))`. With
    `sandwich_norms` (Gemma 2/3) each sublayer's output is normalised too before the
    residual.

    Args:
        hidden_size: model width.
        intermediate_size: MLP width.
        attention: a `GroupedQueryAttention` (or its serialized config).
        activation: a Hugging Face activation name (`supported.ACTIVATIONS`).
        norm_epsilon: epsilon of the norms.
        norm_scale_offset: see `RMSNorm`.
        sandwich_norms: add the post-attention and post-MLP norms.
        mlp_bias: biases on the MLP's projections.
        kernel_initializer: of the MLP's projections.
        norm_type: "rms" (`RMSNorm`) or "layer" (LayerNorm).
        norm_bias: LayerNorms with a bias.
        mlp_kind: "gated" or "plain".
        parallel_residual: attention and MLP both read the block's input.
        sublayer_dtypes: quantized policies of the MLP's Dense layers by name, as
            `get_config` records them after `quantize` (`sublayer_policies.py`).

    Call arguments:
        inputs: `(batch, length, hidden_size)`.
        attention_mask: boolean `(batch, 1, key_length)` key mask, or None.
        cache, cache_index: the attention layer's KV cache and write position.

    Returns:
        `(batch, length, hidden_size)`, and the updated cache when one was given.
    """

    def __init__(
        self,
        hidden_size,
        intermediate_size,
        attention,
        activation="silu",
        norm_epsilon=1e-6,
        norm_scale_offset=0.0,
        sandwich_norms=False,
        mlp_bias=False,
        kernel_initializer="glorot_uniform",
        norm_type="rms",
        norm_bias=False,
        mlp_kind="gated",
        parallel_residual=False,
        sublayer_dtypes=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.hidden_size = int(hidden_size)
        self.intermediate_size = int(intermediate_size)
        self.activation = activation
        self.norm_epsilon = float(norm_epsilon)
        self.norm_scale_offset = float(norm_scale_offset)
        self.sandwich_norms = bool(sandwich_norms)
        self.mlp_bias = bool(mlp_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.norm_type = norm_type
        self.norm_bias = bool(norm_bias)
        if mlp_kind not in ("gated", "plain"):
            raise ValueError(f"mlp_kind={mlp_kind!r}; expected 'gated' or 'plain'")
        self.mlp_kind = mlp_kind
        self.parallel_residual = bool(parallel_residual)
        self._activation_fn = _activation(activation)
        dtype = self.dtype_policy
        self.attention = _attention_layer(attention, self.hidden_size, dtype)

        def norm(name):
            return make_norm(
                norm_type,
                self.norm_epsilon,
                scale_offset=self.norm_scale_offset,
                bias=self.norm_bias,
                dtype=dtype,
                name=name,
            )

        def dense(units, name):
            return keras.layers.Dense(
                units,
                use_bias=self.mlp_bias,
                kernel_initializer=self.kernel_initializer,
                dtype=policy_for(sublayer_dtypes, name, dtype),
                name=name,
            )

        self.attention_norm = norm("attention_norm")
        self.mlp_norm = norm("mlp_norm")
        self.post_attention_norm = norm("post_attention_norm") if self.sandwich_norms else None
        self.post_mlp_norm = norm("post_mlp_norm") if self.sandwich_norms else None
        gated = self.mlp_kind == "gated"
        self.gate_proj = dense(self.intermediate_size, "gate_proj") if gated else None
        self.up_proj = dense(self.intermediate_size, "up_proj")
        self.down_proj = dense(self.hidden_size, "down_proj")

    def build(self, input_shape=None):
        shape = (None, None, self.hidden_size)
        for layer in (
            self.attention_norm,
            self.mlp_norm,
            self.post_attention_norm,
            self.post_mlp_norm,
            self.gate_proj,
            self.up_proj,
        ):
            if layer is not None:
                layer.build(shape)
        self.down_proj.build((None, None, self.intermediate_size))
        self.built = True

    def call(self, inputs, attention_mask=None, cache=None, cache_index=None):
        # `run`: sub-layers skip Keras's __call__ inside `direct_calls` (eager decoding).
        hidden = run(self.attention_norm, inputs)
        if cache is None:
            attended = run(self.attention, hidden, attention_mask=attention_mask)
        else:
            attended, cache = run(
                self.attention,
                hidden,
                attention_mask=attention_mask,
                cache=cache,
                cache_index=cache_index,
            )
        if self.post_attention_norm is not None:
            attended = run(self.post_attention_norm, attended)
        # `add_into(fresh, x)` is `x + fresh`; eager PyTorch writes it into `fresh`.
        if self.parallel_residual:
            outputs = add_into(add_into(attended, inputs), self._mlp(inputs))
        else:
            hidden = add_into(attended, inputs)
            outputs = add_into(self._mlp(hidden), hidden)
        return outputs if cache is None else (outputs, cache)

    def _mlp(self, inputs):
        """The normalised MLP branch (before its residual)."""
        normed = run(self.mlp_norm, inputs)
        if self.gate_proj is None:
            hidden = self._activate(run(self.up_proj, normed))
        else:
            gate = self._activate(run(self.gate_proj, normed))
            hidden = multiply_into(gate, run(self.up_proj, normed))
        mlp = run(self.down_proj, hidden)
        if self.post_mlp_norm is not None:
            mlp = run(self.post_mlp_norm, mlp)
        return mlp

    def _activate(self, inputs):
        # Inside `direct_calls` with eager calls, the backend's kernel
        # (backends/torch/model_calls.py).
        return activate(self.activation, self._activation_fn, inputs)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            # The layer's own config: a pruned layer keeps its smaller head counts.
            "attention": keras.saving.serialize_keras_object(self.attention),
            "activation": self.activation,
            "norm_epsilon": self.norm_epsilon,
            "norm_scale_offset": self.norm_scale_offset,
            "sandwich_norms": self.sandwich_norms,
            "mlp_bias": self.mlp_bias,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "norm_type": self.norm_type,
            "norm_bias": self.norm_bias,
            "mlp_kind": self.mlp_kind,
            "parallel_residual": self.parallel_residual,
            "sublayer_dtypes": quantized_policies((self.gate_proj, self.up_proj, self.down_proj)),
        }


@keras.saving.register_keras_serializable(package="keras_mha")
class EncoderBlock(keras.layers.Layer):
    """A post-norm (BERT) block: `norm(x + attention(x))`, then `norm(h + mlp(h))`.

    Args:
        hidden_size: model width.
        intermediate_size: MLP width.
        attention: a bidirectional `MultiHeadAttention` (or its serialized config).
        activation: a Hugging Face activation name (BERT: exact "gelu").
        norm_epsilon: LayerNorm epsilon.
        kernel_initializer: of the MLP's projections.
        sublayer_dtypes: quantized policies of the MLP's Dense layers by name.

    Call arguments:
        inputs: `(batch, length, hidden_size)`.
        attention_mask: boolean `(batch, 1, length)` key mask, or None.
    """

    def __init__(
        self,
        hidden_size,
        intermediate_size,
        attention,
        activation="gelu",
        norm_epsilon=1e-12,
        kernel_initializer="glorot_uniform",
        sublayer_dtypes=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.hidden_size = int(hidden_size)
        self.intermediate_size = int(intermediate_size)
        self.activation = activation
        self.norm_epsilon = float(norm_epsilon)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self._activation_fn = _activation(activation)
        dtype = self.dtype_policy
        self.attention = _attention_layer(attention, self.hidden_size, dtype)
        self.attention_norm = keras.layers.LayerNormalization(
            epsilon=self.norm_epsilon, dtype=dtype, name="attention_norm"
        )
        self.intermediate = keras.layers.Dense(
            self.intermediate_size,
            kernel_initializer=self.kernel_initializer,
            dtype=policy_for(sublayer_dtypes, "intermediate", dtype),
            name="intermediate",
        )
        self.output_dense = keras.layers.Dense(
            self.hidden_size,
            kernel_initializer=self.kernel_initializer,
            dtype=policy_for(sublayer_dtypes, "output_dense", dtype),
            name="output_dense",
        )
        self.output_norm = keras.layers.LayerNormalization(
            epsilon=self.norm_epsilon, dtype=dtype, name="output_norm"
        )

    def build(self, input_shape=None):
        shape = (None, None, self.hidden_size)
        self.attention_norm.build(shape)
        self.intermediate.build(shape)
        self.output_dense.build((None, None, self.intermediate_size))
        self.output_norm.build(shape)
        self.built = True

    def call(self, inputs, attention_mask=None):
        attended = self.attention(inputs, attention_mask=attention_mask)
        hidden = self.attention_norm(inputs + attended)
        mlp = self.output_dense(self._activation_fn(self.intermediate(hidden)))
        return self.output_norm(hidden + mlp)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "attention": keras.saving.serialize_keras_object(self.attention),
            "activation": self.activation,
            "norm_epsilon": self.norm_epsilon,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "sublayer_dtypes": quantized_policies((self.intermediate, self.output_dense)),
        }


__all__ = ["DecoderBlock", "EncoderBlock", "RMSNorm", "make_norm"]
