"""BART (facebook/bart-*): an encoder-decoder with learned positions from row 2 and
cross-attention.

Described by `inspect`; its encoder, decoder and cross-attention layers are rebuilt one
by one (`load_attention_weights(..., attention="encoder" | "self" | "cross")`).

Example:
    >>> FAMILY.default_head, FAMILY.traits["is_encoder_decoder"]
    ('base', True)
"""

from keras_mha.families._family import Family
from keras_mha.families._presets import CLASSIC_TRAITS, COMMON_KEYS, LEARNED_POSITIONS
from keras_mha.families._weights import attention_only, projections


def bart(reader, fields: dict) -> None:
    """BART: separate encoder heads, layers and FFN size; learned positions from row 2.

    transformers' BartConfig aliases `num_attention_heads` and `num_hidden_layers` to the
    *encoder's* heads and layers; when a config holds both spellings the generic one wins.
    """
    hidden = fields["hidden_size"]
    heads = reader.integer(("num_attention_heads", "encoder_attention_heads"), "heads")
    reader.require(
        hidden % heads == 0,
        "encoder_attention_heads",
        heads,
        f"must divide the hidden size {hidden} (BART derives the head size from it)",
    )
    fields.update(
        learned_position_rows=fields["max_position_embeddings"] + 2,
        num_encoder_layers=reader.integer(("num_hidden_layers", "encoder_layers"), "layers"),
        encoder_attention_heads=heads,
        encoder_head_dim=hidden // heads,
        encoder_intermediate_size=reader.integer("encoder_ffn_dim", "width", shape=True),
    )


FAMILY = Family(
    "bart",
    keys={
        **COMMON_KEYS,
        "hidden_size": ("hidden_size", "d_model"),
        "num_attention_heads": ("decoder_attention_heads",),
        "num_hidden_layers": ("decoder_layers",),
        "intermediate_size": ("decoder_ffn_dim",),
    },
    traits={
        **CLASSIC_TRAITS,
        **LEARNED_POSITIONS,
        "learned_position_tables": 2,
        "norms_per_layer": 3,
        "final_norms": 0,
        "embedding_norms": 2,
        "is_encoder_decoder": True,
        "encoder_norms_per_layer": 2,
    },
    hooks=(bart,),
    defaults={
        "vocab_size": 50265,
        "max_position_embeddings": 1024,
        "encoder_layers": 12,
        "encoder_ffn_dim": 4096,
        "encoder_attention_heads": 16,
        "decoder_layers": 12,
        "decoder_ffn_dim": 4096,
        "decoder_attention_heads": 16,
        "activation_function": "gelu",
        "d_model": 1024,
        "tie_word_embeddings": True,
    },
    default_head="base",
    not_built="an encoder-decoder with cross-attention",
    weights=attention_only(
        ("model.", ""),
        "{prefix}decoder.embed_positions.weight",
        projections("{prefix}decoder.layers.{layer}.self_attn", output="out_proj")
        + projections(
            "{prefix}decoder.layers.{layer}.encoder_attn",
            "blocks.{layer}.cross_attention",
            output="out_proj",
        )
        + projections(
            "{prefix}encoder.layers.{layer}.self_attn",
            "encoder_blocks.{layer}.attention",
            output="out_proj",
        ),
    ),
)
