"""DBRX (databricks/dbrx-*): attention settings in `attn_config`, experts in `ffn_config`.

Described by `inspect`; keras-mha layers cannot clip q/k/v, so it is not rebuilt.

Example:
    >>> FAMILY.traits["norm_type"], FAMILY.traits["norm_bias"]
    ('layer', False)
"""

from keras_mha.families._family import Family
from keras_mha.families._presets import COMMON_KEYS, LLAMA_TRAITS

# DBRX nests its attention settings in `attn_config`; the defaults of the keys that do not
# decide the model's size (kv_n_heads, and every ffn_config size, must be given).
DBRX_ATTN_DEFAULTS = {"rope_theta": 10000.0, "clip_qkv": None}


def dbrx(reader, fields: dict) -> None:
    """DBRX: KV heads, RoPE and clipping in `attn_config`; the experts in `ffn_config`.

    Both objects are required, with the keys that decide the model's size: a config
    without them is malformed, not a config to read with DbrxConfig's defaults.
    """
    attention = reader.sub_config("attn_config", defaults=DBRX_ATTN_DEFAULTS)
    ffn = reader.sub_config("ffn_config")
    for name, sub in (("attn_config", attention), ("ffn_config", ffn)):
        reader.require(sub is not None, name, reader.config.get(name), "must be a JSON object")
    fields["num_key_value_heads"] = attention.integer(
        "kv_n_heads", "heads", name="num_key_value_heads"
    )
    reader.found["num_key_value_heads"] = "attn_config.kv_n_heads"
    experts = ffn.integer("moe_num_experts", "experts")
    size = ffn.integer("ffn_hidden_size", "width")
    fields.update(
        qkv_clip=attention.number("clip_qkv"),
        rope_theta=attention.number("rope_theta"),
        intermediate_size=size,
        num_experts=experts,
        num_experts_per_tok=ffn.integer("moe_top_k", "experts", high=experts),
        moe_intermediate_size=size,
        moe_layers=(True,) * fields["num_hidden_layers"],
    )


FAMILY = Family(
    "dbrx",
    keys=COMMON_KEYS,
    traits={**LLAMA_TRAITS, "norm_type": "layer", "norm_bias": False},
    hooks=(dbrx,),
    defaults={
        "d_model": 2048,
        "n_heads": 16,
        "n_layers": 24,
        "max_seq_len": 2048,
        "vocab_size": 32000,
        "tie_word_embeddings": False,
    },
    not_built="clipped q/k/v and a mixture-of-experts MLP",
)
