"""OPT (facebook/opt-*): learned positions from row 2, LayerNorm blocks, an optional
embedding projection.

Described by `inspect` and rebuilt layer by layer; not built whole.

Example:
    >>> FAMILY.weights.prefixes
    ('model.decoder.', 'decoder.')
"""

from keras_mha.families._family import Family
from keras_mha.families._presets import ALL_BIASES, CLASSIC_TRAITS, COMMON_KEYS, LEARNED_POSITIONS
from keras_mha.families._weights import attention_only, projections


def opt(reader, fields: dict) -> None:
    """OPT: positions start at row 2, an optional embedding projection, optional final norm."""
    fields["learned_position_rows"] = fields["max_position_embeddings"] + 2
    fields["word_embed_proj_dim"] = reader.integer(
        "word_embed_proj_dim", "width", default=fields["hidden_size"]
    )
    fields["final_norms"] = 1 if reader.flag("do_layer_norm_before", True) else 0


FAMILY = Family(
    "opt",
    keys={**COMMON_KEYS, "intermediate_size": ("ffn_dim",)},
    traits={**CLASSIC_TRAITS, **LEARNED_POSITIONS},
    switches={
        "enable_bias": (*ALL_BIASES, "mlp_bias"),
        "layer_norm_elementwise_affine": ("norm_affine",),
    },
    hooks=(opt,),
    defaults={
        "vocab_size": 50272,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "ffn_dim": 3072,
        "max_position_embeddings": 2048,
        "do_layer_norm_before": True,
        "num_attention_heads": 12,
        "activation_function": "relu",
        "enable_bias": True,
        "layer_norm_elementwise_affine": True,
        "tie_word_embeddings": True,
    },
    not_built="learned position embeddings with an offset and LayerNorm blocks",
    weights=attention_only(
        ("model.decoder.", "decoder."),
        "{prefix}embed_tokens.weight",
        projections("{prefix}layers.{layer}.self_attn", output="out_proj"),
    ),
)
