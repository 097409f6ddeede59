"""Jamba (ai21labs/Jamba-*): attention every `attn_layer_period` layers, Mamba mixers in
between, MoE MLPs; its attention layers apply no position encoding.

Described by `inspect` and its attention layers rebuilt one by one; not built whole.

Example:
    >>> FAMILY.moe, FAMILY.traits["position_embedding"]
    ('jamba', 'none')
"""

import math

from keras_mha.families._presets import NO_BIASES, llama_like
from keras_mha.families._rules import explicit_layer_kinds, repeat_pattern
from keras_mha.families._weights import LLAMA_PREFIXES, attention_only, projections


def jamba(reader, fields: dict) -> None:
    """Jamba: attention every `attn_layer_period` layers, Mamba mixers in between."""
    num_layers, hidden = fields["num_hidden_layers"], fields["hidden_size"]
    kinds = explicit_layer_kinds(reader, num_layers)
    if kinds is None:
        period = reader.integer("attn_layer_period", "period")
        offset = reader.integer("attn_layer_offset", "layer_number", high=period - 1)
        kinds = repeat_pattern(
            tuple("full" if i == offset else "none" for i in range(period)), num_layers
        )
    fields["layer_kinds"] = kinds
    expand = reader.integer("mamba_expand", "period")
    dt_key, dt_rank = reader.lookup("mamba_dt_rank")
    if dt_rank == "auto":
        dt_rank = math.ceil(hidden / 16)
    else:
        dt_rank = reader.check_integer(dt_key or "mamba_dt_rank", dt_rank, "width")
    fields["mamba"] = {  # `cards.spec.MambaSpec` fields
        "d_state": reader.integer("mamba_d_state", "width"),
        "d_conv": reader.integer("mamba_d_conv", "width"),
        "expand": expand,
        "dt_rank": dt_rank,
        "inner_size": expand * hidden,
        "conv_bias": reader.flag("mamba_conv_bias", True),
        "proj_bias": reader.flag("mamba_proj_bias", False),
        "inner_layernorms": True,
    }


FAMILY = llama_like(
    "jamba",
    traits={**NO_BIASES, "position_embedding": "none"},
    switches={},
    window=None,
    moe="jamba",
    hooks=(jamba,),
    defaults={
        "vocab_size": 65536,
        "tie_word_embeddings": False,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "num_experts_per_tok": 2,
        "num_experts": 16,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "attn_layer_period": 8,
        "attn_layer_offset": 4,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_dt_rank": "auto",
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
    },
    not_built="Mamba layers and a mixture-of-experts MLP",
    weights=attention_only(
        LLAMA_PREFIXES,
        "{prefix}embed_tokens.weight",
        projections("{prefix}layers.{layer}.self_attn"),
    ),
)
