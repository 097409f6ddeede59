"""Rebuild one attention layer of a Hub model as a `keras_mha.layers` layer.

`attention_layer_arguments` turns a `ModelSpec` and a layer index into the
constructor arguments of `GroupedQueryAttention` (pure Python); `build_attention`
builds the layer (the class says what the model uses: `MultiHeadAttention`,
`MultiQueryAttention` or `GroupedQueryAttention`). Its trainable parameters are
exactly those the cost report counts for that layer; `count_params()` adds the
`num_heads` non-trainable head gates used for pruning.

What a layer cannot represent raises `UnsupportedModelError` (a `NotImplementedError`)
naming the model type, the layer and the feature: DeepSeek's multi-head latent attention
(MLA), T5's relative position bias, ALiBi, DBRX's q/k/v clipping, LayerNorm q/k norms (Phi with
`qk_layernorm`), value heads of another size than key heads, different biases on the
q, k and v projections, and RoPE scalings other than linear and llama3 (YaRN,
dynamic NTK, LongRoPE). Layers without attention (Jamba's Mamba layers) raise
`ValueError`.

Its weights come from a checkpoint through the family's tensor names
(`keras_mha.models.load_attention_weights`, the table whole models load with).

Example:
    >>> from keras_mha.models.rebuild import build_attention
    >>> from keras_mha.planning.spec import from_config
    >>> spec = from_config({"model_type": "qwen2", "hidden_size": 64,
    ...     "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
    ...     "intermediate_size": 128, "vocab_size": 100})
    >>> layer = build_attention(spec, layer_index=1)
    >>> type(layer).__name__, layer.use_bias, layer.use_output_bias, layer.causal
    ('GroupedQueryAttention', True, False, True)
"""

from __future__ import annotations

from typing import Any

from keras_mha.errors import UnsupportedModelError
from keras_mha.layers import GroupedQueryAttention, MultiHeadAttention, MultiQueryAttention
from keras_mha.planning.spec import ModelSpec

ATTENTION_PARTS = ("self", "cross", "encoder")
SUPPORTED_ROPE_SCALINGS = ("default", "linear", "llama3")
DEFAULT_ROPE_THETA = 10000.0


def _where(spec: ModelSpec, layer_index: int, attention: str) -> str:
    part = "" if attention == "self" else f" ({attention} attention)"
    return f"layer {layer_index}{part} of this {spec.model_type} model"


def _check_representable(spec: ModelSpec, layer_index: int, attention: str) -> None:
    """Raise UnsupportedModelError for what `GroupedQueryAttention` cannot compute."""
    where = _where(spec, layer_index, attention)
    att = spec.attention
    if att.kv_lora_rank:
        raise UnsupportedModelError(
            f"{where} is multi-head latent attention (MLA: kv_lora_rank={att.kv_lora_rank}, "
            f"q_lora_rank={att.q_lora_rank}, qk_rope_head_dim={att.qk_rope_head_dim}); "
            f"keras-mha layers project keys and values per head and cannot represent it"
        )
    if spec.positions.position_embedding == "relative":
        raise UnsupportedModelError(
            f"{where} adds a relative position bias (relative_attention_num_buckets="
            f"{att.relative_attention_num_buckets}), which keras-mha layers do not compute"
        )
    if spec.positions.position_embedding == "alibi":
        raise UnsupportedModelError(
            f"{where} uses ALiBi position biases (alibi=true), which keras-mha layers do "
            f"not compute"
        )
    if att.qkv_clip is not None:
        raise UnsupportedModelError(
            f"{where} clips q, k and v to +-{att.qkv_clip} (attn_config.clip_qkv), which "
            f"keras-mha layers do not do"
        )
    if att.qk_norm not in (None, "rms"):
        raise UnsupportedModelError(
            f"{where} normalises queries and keys with qk_norm={att.qk_norm!r}; keras-mha "
            f"layers have an RMS q/k norm only"
        )
    if att.value_head_dim != att.head_dim:
        raise UnsupportedModelError(
            f"{where} has value heads of {att.value_head_dim} features and key heads of "
            f"{att.head_dim}; keras-mha layers use one head_dim for both"
        )
    if not att.q_bias == att.k_bias == att.v_bias:
        raise UnsupportedModelError(
            f"{where} has q_bias={att.q_bias}, k_bias={att.k_bias}, v_bias={att.v_bias}; "
            f"keras-mha layers have one use_bias for the three projections"
        )


def _rope_scaling(spec: ModelSpec, scaling, layer_index: int) -> dict | None:
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    if kind not in SUPPORTED_ROPE_SCALINGS:
        raise UnsupportedModelError(
            f"{_where(spec, layer_index, 'self')} scales RoPE with rope_type={kind!r}; "
            f"keras-mha supports {list(SUPPORTED_ROPE_SCALINGS)}"
        )
    return dict(scaling)


def _check_index(name: str, value: Any, count: int, spec: ModelSpec) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
        raise ValueError(
            f"{name}={value!r} must be an integer in [0, {count}) for this {spec.model_type} model"
        )
    return value


def attention_layer_arguments(
    spec: ModelSpec, layer_index: int = 0, *, attention: str = "self"
) -> dict[str, Any]:
    """Constructor arguments of `GroupedQueryAttention` matching one attention layer.

    Pure Python: nothing is built and keras is not called.

    Args:
        spec: a `ModelSpec` from `keras_mha.planning.spec.from_config`.
        layer_index: index of the layer in its stack (`spec.layer_kinds` for "self").
        attention: "self" (the self-attention of the model's main stack: the decoder of
            an encoder-decoder, the only stack otherwise), "cross" (the cross-attention
            of a decoder layer of an encoder-decoder) or "encoder" (the self-attention
            of an encoder layer of an encoder-decoder).

    Returns:
        A dict of keyword arguments (`num_heads`, `num_key_value_heads`, `head_dim`,
        `output_dim`, `use_bias`, `use_output_bias`, `causal`, `sliding_window`,
        `use_rope`, `rope_theta`, `partial_rotary_factor`, `rope_scaling`,
        `use_qk_norm`, `qk_norm_epsilon`, `logit_soft_cap`, `attention_scale`).

    Raises:
        ValueError: a bad `attention` or `layer_index`, or a layer without attention.
        UnsupportedModelError: the layer's attention is not representable (module docstring).

    Example:
        >>> from keras_mha.planning.spec import from_config
        >>> spec = from_config({"model_type": "gemma2", "hidden_size": 64,
        ...     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        ...     "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 100,
        ...     "sliding_window": 8, "query_pre_attn_scalar": 16,
        ...     "attn_logit_softcapping": 50.0})
        >>> arguments = attention_layer_arguments(spec, layer_index=0)
        >>> arguments["sliding_window"], arguments["logit_soft_cap"], arguments["attention_scale"]
        (8, 50.0, 0.25)
    """
    if attention not in ATTENTION_PARTS:
        raise ValueError(f"attention={attention!r} must be one of {list(ATTENTION_PARTS)}")
    if attention != "self" and not spec.is_encoder_decoder:
        raise ValueError(
            f"attention={attention!r} needs an encoder-decoder model; this {spec.model_type} "
            f"model has one stack, use attention='self'"
        )
    if attention == "self":
        # Range and "holds no attention" checks, with the model's own message.
        layer = spec.attention_layer(layer_index)
    elif attention == "encoder":
        _check_index("layer_index", layer_index, spec.encoder.num_encoder_layers, spec)
    else:
        _check_index("layer_index", layer_index, spec.num_hidden_layers, spec)
    _check_representable(spec, layer_index, attention)

    common = {
        "use_bias": spec.attention.q_bias,
        "use_output_bias": spec.attention.o_bias,
        "output_dim": spec.hidden_size,
        "use_qk_norm": False,
        "qk_norm_epsilon": 1e-6,
        "logit_soft_cap": None,
        "use_rope": False,
        "rope_theta": DEFAULT_ROPE_THETA,
        "partial_rotary_factor": 1.0,
        "rope_scaling": None,
        "sliding_window": None,
    }
    if attention in ("encoder", "cross"):
        # Only BART-like encoder-decoders get here (T5's relative bias raised above):
        # plain MHA scaled by 1/sqrt(head size), positions added to the embeddings.
        heads = (
            spec.encoder.encoder_attention_heads
            if attention == "encoder"
            else spec.attention.num_attention_heads
        )
        head_dim = (
            spec.encoder.encoder_head_dim if attention == "encoder" else spec.attention.head_dim
        )
        return {
            **common,
            "num_heads": heads,
            "num_key_value_heads": heads,
            "head_dim": head_dim,
            "causal": False,
            "attention_scale": head_dim**-0.5,
        }

    use_rope = layer.use_rope
    arguments = {
        **common,
        "num_heads": layer.num_heads,
        "num_key_value_heads": layer.num_key_value_heads,
        "head_dim": layer.head_dim,
        "causal": layer.causal,
        "sliding_window": layer.sliding_window,
        "attention_scale": layer.scale,
        "logit_soft_cap": layer.logit_soft_cap,
    }
    if layer.qk_norm == "rms":
        arguments["use_qk_norm"] = True
        arguments["qk_norm_epsilon"] = layer.norm_eps if layer.norm_eps else 1e-6
    if use_rope:
        arguments.update(
            use_rope=True,
            rope_theta=layer.rope_theta if layer.rope_theta is not None else DEFAULT_ROPE_THETA,
            partial_rotary_factor=layer.partial_rotary_factor,
            rope_scaling=_rope_scaling(spec, layer.rope_scaling, layer_index),
        )
    return arguments


def attention_layer_class(num_heads: int, num_key_value_heads: int) -> type:
    """`MultiHeadAttention`, `MultiQueryAttention` or `GroupedQueryAttention` for these counts.

    Example:
        >>> attention_layer_class(8, 1).__name__, attention_layer_class(8, 8).__name__
        ('MultiQueryAttention', 'MultiHeadAttention')
    """
    if num_key_value_heads == num_heads:
        return MultiHeadAttention
    if num_key_value_heads == 1:
        return MultiQueryAttention
    return GroupedQueryAttention


def build_attention(
    spec: ModelSpec,
    layer_index: int = 0,
    *,
    attention: str = "self",
    build: bool = True,
    **layer_kwargs: Any,
) -> GroupedQueryAttention:
    """A keras-mha attention layer configured like layer `layer_index` of the model.

    The layer takes `(batch, length, hidden_size)` and returns the same shape: it
    covers the q/k/v projections, q/k norms, RoPE, the masked softmax and the output
    projection (not the residual, dropout or the block's norms).

    Args:
        spec: a `ModelSpec` from `keras_mha.planning.spec.from_config`.
        layer_index: index of the layer in its stack.
        attention: "self", "cross" or "encoder" (see `attention_layer_arguments`).
        build: build the weights now, for `(None, None, hidden_size)` inputs.
        **layer_kwargs: more constructor arguments (`name`, `dtype`,
            `kernel_initializer`, `flash_attention`, ...).

    Returns:
        A `MultiHeadAttention`, `MultiQueryAttention` or `GroupedQueryAttention`. Its
        trainable parameters equal the report's attention parameters of that layer;
        `count_params()` also counts `num_heads` non-trainable head gates.

    Raises:
        ValueError: a bad `attention` or `layer_index`, or a layer without attention.
        UnsupportedModelError: the layer's attention is not representable (module docstring).

    Example:
        >>> from keras_mha.hub import load_config
        >>> from keras_mha.planning.spec import from_config
        >>> spec = from_config(load_config("bundled:meta-llama/Meta-Llama-3-8B").config)
        >>> layer = build_attention(spec, 0, build=False)
        >>> type(layer).__name__, layer.num_heads, layer.num_key_value_heads, layer.rope_theta
        ('GroupedQueryAttention', 32, 8, 500000.0)
    """
    arguments = attention_layer_arguments(spec, layer_index, attention=attention)
    overlap = sorted(set(arguments) & set(layer_kwargs))
    if overlap:
        raise ValueError(
            f"{overlap} come from the model's config and cannot be passed to build_attention; "
            f"change the spec or build GroupedQueryAttention yourself"
        )
    layer_class = attention_layer_class(arguments["num_heads"], arguments["num_key_value_heads"])
    if layer_class is not GroupedQueryAttention:
        arguments.pop("num_key_value_heads")
    layer = layer_class(**arguments, **layer_kwargs)
    if build:
        layer.build((None, None, spec.hidden_size))
    return layer


__all__ = [
    "ATTENTION_PARTS",
    "attention_layer_arguments",
    "attention_layer_class",
    "build_attention",
]
