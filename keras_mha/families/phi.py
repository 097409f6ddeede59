"""Phi-1 / 1.5 / 2 (microsoft/phi-2): parallel attention and MLP on one LayerNorm,
partial rotary, a biased LM head, optional LayerNorm q/k norms.

Described by `inspect` and rebuilt layer by layer (without `qk_layernorm`); the blocks
are not built by `keras_mha.models`.

Example:
    >>> FAMILY.traits["norms_per_layer"], FAMILY.traits["parallel_residual"]
    (1, True)
"""

from keras_mha.families._family import Family
from keras_mha.families._presets import (
    CLASSIC_TRAITS,
    COMMON_KEYS,
    KV_HEADS_KEYS,
    ROPE_KEYS,
)
from keras_mha.families._weights import LLAMA_PREFIXES, attention_only, projections


def phi(reader, fields: dict) -> None:
    """Phi-1/1.5/2: optional LayerNorms on queries and keys."""
    fields["qk_norm"] = "layer" if reader.flag("qk_layernorm", False) else None


FAMILY = Family(
    "phi",
    keys={
        **COMMON_KEYS,
        **ROPE_KEYS,
        "num_key_value_heads": KV_HEADS_KEYS,
        "head_dim": ("head_dim",),
        "intermediate_size": ("intermediate_size",),
    },
    traits={
        **CLASSIC_TRAITS,
        "norms_per_layer": 1,
        "parallel_residual": True,
        "lm_head_bias": True,
        "position_embedding": "rope",
    },
    hooks=(phi,),
    defaults={
        "vocab_size": 51200,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 24,
        "num_attention_heads": 32,
        "hidden_act": "gelu_new",
        "max_position_embeddings": 2048,
        "layer_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "qk_layernorm": False,
    },
    not_built="parallel attention/MLP blocks on one LayerNorm and a biased LM head",
    weights=attention_only(
        LLAMA_PREFIXES,
        "{prefix}embed_tokens.weight",
        projections("{prefix}layers.{layer}.self_attn", output="dense"),
    ),
)
