"""What each supported family adds to the `ModelSpec`: a small trait table (data over code).

`ModelSpec` (from `keras_mha.cards.spec.from_config`) already says the head counts, head
size, biases, q/k norms, RoPE, sliding windows, soft caps and tying. The traits below
say the rest of a block that differs between families: the norm's parametrisation,
the default activation, Gemma's embedding scale, Gemma 2/3's extra norms around each
sublayer, and which weight-name table (`weight_names.FAMILY_WEIGHT_NAMES`) reads it.

Example:
    >>> FAMILY_TRAITS["gemma2"].sandwich_norms, FAMILY_TRAITS["gemma2"].norm_scale_offset
    (True, 1.0)
    >>> FAMILY_TRAITS["bert"].kind
    'encoder'
"""

from __future__ import annotations

from dataclasses import dataclass

from keras_mha.errors import UnsupportedModelError


@dataclass(frozen=True)
class FamilyTraits:
    """Block traits a `ModelSpec` does not carry.

    Attributes:
        kind: "decoder" (causal LM, `DecoderModel`) or "encoder" (`EncoderModel`).
        weight_naming: key of `weight_names.FAMILY_WEIGHT_NAMES`.
        default_activation: used when the config names none.
        norm_scale_offset: RMSNorm multiplies by `offset + weight` (Gemma: 1).
        embedding_scale: multiply token embeddings by sqrt(hidden_size) (Gemma).
        sandwich_norms: norms after attention and after the MLP too (Gemma 2/3).
        default_norm_epsilon: used when the config names none.
    """

    kind: str
    weight_naming: str
    default_activation: str = "silu"
    norm_scale_offset: float = 0.0
    embedding_scale: bool = False
    sandwich_norms: bool = False
    default_norm_epsilon: float = 1e-6


_GEMMA = dict(default_activation="gelu_pytorch_tanh", norm_scale_offset=1.0, embedding_scale=True)

FAMILY_TRAITS: dict[str, FamilyTraits] = {
    "llama": FamilyTraits("decoder", "llama"),
    "mistral": FamilyTraits("decoder", "llama"),
    "qwen2": FamilyTraits("decoder", "llama"),
    "qwen3": FamilyTraits("decoder", "llama"),
    "gemma": FamilyTraits("decoder", "llama", **_GEMMA),
    "gemma2": FamilyTraits("decoder", "gemma2", sandwich_norms=True, **_GEMMA),
    "gemma3_text": FamilyTraits("decoder", "gemma3", sandwich_norms=True, **_GEMMA),
    "phi3": FamilyTraits("decoder", "phi3", default_norm_epsilon=1e-5),
    "bert": FamilyTraits("encoder", "bert", default_activation="gelu", default_norm_epsilon=1e-12),
}

# What a family that is not in the table would need, for the error message.
_MISSING_PARTS = {
    "gpt2": "learned position embeddings, LayerNorm blocks and GPT-2's fused c_attn/Conv1D",
    "gpt_bigcode": "learned position embeddings, LayerNorm blocks and a fused c_attn",
    "gpt_neox": "parallel attention/MLP blocks with LayerNorm and per-head interleaved qkv",
    "falcon": "parallel attention/MLP blocks with LayerNorm (only its attention layers load)",
    "phi": "parallel attention/MLP blocks with LayerNorm and a biased LM head",
    "opt": "learned position embeddings with an offset and LayerNorm blocks",
    "mixtral": "a mixture-of-experts MLP",
    "qwen3_moe": "a mixture-of-experts MLP",
    "deepseek_v2": "multi-head latent attention and a mixture-of-experts MLP",
    "deepseek_v3": "multi-head latent attention and a mixture-of-experts MLP",
    "jamba": "Mamba layers and a mixture-of-experts MLP",
    "dbrx": "clipped q/k/v and a mixture-of-experts MLP",
    "t5": "an encoder-decoder with relative position biases",
    "bart": "an encoder-decoder with cross-attention",
}

# Hugging Face activation names -> (keras activation, keyword arguments).
ACTIVATIONS = {
    "silu": ("silu", {}),
    "swish": ("silu", {}),
    "gelu": ("gelu", {"approximate": False}),
    "gelu_pytorch_tanh": ("gelu", {"approximate": True}),
    "gelu_new": ("gelu", {"approximate": True}),
    "relu": ("relu", {}),
}


def traits_for(spec) -> FamilyTraits:
    """The traits of `spec`'s family, or UnsupportedModelError naming what is missing.

    Example:
        >>> traits_for(spec).kind  # doctest: +SKIP
        'decoder'
    """
    traits = FAMILY_TRAITS.get(spec.family)
    if traits is None:
        missing = _MISSING_PARTS.get(spec.family, "a block layout keras-mha does not describe")
        raise UnsupportedModelError(
            f"model_type={spec.model_type!r} (family {spec.family!r}) is not supported by "
            f"keras_mha.models: it needs {missing}; supported families are "
            f"{sorted(FAMILY_TRAITS)}",
            value=spec.model_type,
        )
    where = f"model_type={spec.model_type!r}"
    if spec.num_experts or any(spec.moe_layers):
        raise UnsupportedModelError(f"{where}: a mixture-of-experts MLP is not supported")
    if traits.kind == "decoder":
        if spec.mlp_kind != "gated" or spec.position_embedding != "rope":
            raise UnsupportedModelError(
                f"{where}: keras_mha.models builds gated-MLP RoPE decoders; this config has "
                f"mlp_kind={spec.mlp_kind!r}, position_embedding={spec.position_embedding!r}"
            )
    else:
        position_type = spec.raw.get("position_embedding_type", "absolute")
        if position_type not in (None, "absolute"):
            raise UnsupportedModelError(
                f"{where}: position_embedding_type={position_type!r} is not supported; "
                f"keras_mha.models builds BERT encoders with absolute positions"
            )
    activation_name(spec, traits)
    return traits


def activation_name(spec, traits: FamilyTraits) -> str:
    """The config's Hugging Face activation name, checked against `ACTIVATIONS`."""
    name = spec.hidden_act or traits.default_activation
    if name not in ACTIVATIONS:
        raise UnsupportedModelError(
            f"model_type={spec.model_type!r}: hidden_act={name!r} is not supported; "
            f"expected one of {sorted(ACTIVATIONS)}",
            key="hidden_act",
            value=name,
        )
    return name


__all__ = ["ACTIVATIONS", "FAMILY_TRAITS", "FamilyTraits", "activation_name", "traits_for"]
