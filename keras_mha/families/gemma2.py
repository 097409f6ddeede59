"""Gemma 2 (google/gemma-2-*): Gemma with sandwich norms, alternating windows, soft caps.

Each sublayer's input and output are normalised (four norms per layer), layers
alternate sliding and full attention, `query_pre_attn_scalar` sets the softmax scale,
and attention and final logits are soft-capped.

Example:
    >>> BLOCKS.sandwich_norms, FAMILY.window
    (True, 'alternate')
"""

from keras_mha.families._presets import llama_like
from keras_mha.families._weights import SANDWICH_NORMS, llama_style
from keras_mha.families.gemma import BLOCKS as GEMMA_BLOCKS


def gemma_scale_and_caps(reader, fields: dict) -> None:
    """Gemma 2/3: softmax scale from `query_pre_attn_scalar`, logit soft caps."""
    scalar = fields["query_pre_attn_scalar"] = reader.number("query_pre_attn_scalar")
    if scalar is not None:
        fields["attention_scale"] = scalar**-0.5
    fields["attn_logit_softcapping"] = reader.number("attn_logit_softcapping")
    fields["final_logit_softcapping"] = reader.number("final_logit_softcapping")


BLOCKS = GEMMA_BLOCKS._replace(sandwich_norms=True)

FAMILY = llama_like(
    "gemma2",
    traits={"norms_per_layer": 4},
    window="alternate",
    hooks=(gemma_scale_and_caps,),
    defaults={
        "vocab_size": 256000,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "rope_theta": 10000.0,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "final_logit_softcapping": 30.0,
        "attn_logit_softcapping": 50.0,
    },
    blocks=BLOCKS,
    weights=llama_style(norms=SANDWICH_NORMS, norm_scale_offset=BLOCKS.norm_scale_offset),
    head_size_in_config="explicit_divisor",
)
