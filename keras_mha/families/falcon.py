"""Falcon (tiiuae/falcon-*): parallel attention and MLP, MQA or grouped KV heads, one
fused `query_key_value` grouped per KV head.

Described by `inspect` and rebuilt layer by layer (`load_attention_weights`); the blocks
are not built by `keras_mha.models`. The old remote-code model types `RefinedWebModel`
(Falcon-7B) and `RefinedWeb` (Falcon-40B, new decoder architecture) are read as Falcon.

Example:
    >>> FAMILY.model_types
    ('falcon', 'RefinedWebModel', 'RefinedWeb')
"""

from keras_mha.families._family import Family
from keras_mha.families._presets import (
    ALL_BIASES,
    CLASSIC_TRAITS,
    COMMON_KEYS,
    NO_BIASES,
    ROPE_KEYS,
)
from keras_mha.families._weights import attention_only, fused_qkv, output_projection

# Old remote-code Falcon model types and whether they had the new decoder architecture.
FALCON_ALIASES = {"RefinedWebModel": False, "RefinedWeb": True}


def falcon(reader, fields: dict) -> None:
    """Falcon: MQA (`multi_query`), or grouped KV heads with `new_decoder_architecture`."""
    heads = fields["num_attention_heads"]
    if reader.has("new_decoder_architecture") or reader.model_type not in FALCON_ALIASES:
        new_architecture = reader.flag("new_decoder_architecture", False)
    else:
        new_architecture = FALCON_ALIASES[reader.model_type]
    if new_architecture:
        kv_heads = reader.integer(
            ("num_kv_heads", "n_head_kv", "num_key_value_heads"),
            "heads",
            default=heads,
            name="num_key_value_heads",
        )
    else:
        kv_heads = 1 if reader.flag("multi_query", True) else heads
    fields["num_key_value_heads"] = kv_heads
    fields["parallel_residual"] = reader.flag("parallel_attn", True)
    if fields["parallel_residual"]:
        fields["norms_per_layer"] = reader.integer(
            "num_ln_in_parallel_attn", "count", low=1, high=2, default=2 if new_architecture else 1
        )
    if reader.flag("alibi", False):
        fields.update(position_embedding="alibi", rope_theta=None)


_ATTENTION = "{prefix}h.{layer}.self_attention"

FAMILY = Family(
    "falcon",
    aliases=tuple(FALCON_ALIASES),
    keys={**COMMON_KEYS, **ROPE_KEYS, "intermediate_size": ("ffn_hidden_size",)},
    traits={**CLASSIC_TRAITS, **NO_BIASES, "mlp_bias": False, "position_embedding": "rope"},
    switches={"bias": (*ALL_BIASES, "mlp_bias")},
    ffn_factor=4,
    hooks=(falcon,),
    defaults={
        "vocab_size": 65024,
        "hidden_size": 4544,
        "num_hidden_layers": 32,
        "num_attention_heads": 71,
        "layer_norm_epsilon": 1e-5,
        "alibi": False,
        "new_decoder_architecture": False,
        "multi_query": True,
        "parallel_attn": True,
        "bias": False,
        "max_position_embeddings": 2048,
        "activation": "gelu",
        "tie_word_embeddings": True,
        "rope_theta": 10000.0,
    },
    not_built="parallel attention/MLP blocks with LayerNorm (only its attention layers load)",
    weights=attention_only(
        ("transformer.", ""),
        "{prefix}word_embeddings.weight",
        fused_qkv(f"{_ATTENTION}.query_key_value", "per_group")
        + output_projection(f"{_ATTENTION}.dense"),
    ),
)
