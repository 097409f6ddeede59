"""Gemma 3's language model (google/gemma-3-1b-pt, and the `text_config` of the
multimodal checkpoints): Gemma 2's blocks with q/k norms and a local RoPE base.

It slides on five layers of six (`sliding_window_pattern` or `layer_types`); sliding
layers rotate with their own base. Its q/k norms multiply by `1 + w` like every Gemma
norm. The multimodal wrapper (`gemma3`) is `keras_mha/families/gemma3.py`.

Example:
    >>> FAMILY.window, FAMILY.traits["qk_norm"]
    ('pattern', 'rms')
"""

from keras_mha.families._presets import llama_like
from keras_mha.families._weights import SANDWICH_NORMS, llama_style
from keras_mha.families.gemma2 import BLOCKS, gemma_scale_and_caps
from keras_mha.families.gemma2 import FAMILY as GEMMA2


def gemma3_local_rope(reader, fields: dict) -> None:
    """Gemma 3's sliding layers rotate with their own base (`rope_local_base_freq`, or
    transformers 5's `rope_parameters.sliding_attention`, already checked)."""
    local = (reader.config.get("rope_parameters") or {}).get("sliding_attention") or {}
    theta = local.get("rope_theta")
    fields["rope_local_theta"] = theta or reader.number("rope_local_base_freq")


FAMILY = llama_like(
    "gemma3_text",
    traits={"norms_per_layer": 4, "qk_norm": "rms"},
    window="pattern",
    hooks=(gemma_scale_and_caps, gemma3_local_rope),
    # Gemma3TextConfig's defaults are Gemma2Config's but for these.
    defaults={
        **GEMMA2.defaults,
        "vocab_size": 262208,
        "max_position_embeddings": 131072,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "sliding_window_pattern": 6,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
    },
    blocks=BLOCKS,
    weights=llama_style(norms=SANDWICH_NORMS, norm_scale_offset=BLOCKS.norm_scale_offset),
    head_size_in_config="explicit_divisor",
)
