"""Gemma 3 (google/gemma-3-*): Gemma 2's blocks with q/k norms and a local RoPE base,
and its multimodal wrapper (a SigLIP tower and a one-matrix projector).

The text model (`gemma3_text`) slides on five layers of six (`sliding_window_pattern`
or `layer_types`); sliding layers rotate with their own base. Its q/k norms multiply by
`1 + w` like every Gemma norm. The wrapper (`gemma3`, e.g. gemma-3-4b-it) holds the
text config in `text_config`.

Example:
    >>> TEXT.window, WRAPPER.wrapper.text_model_type
    ('pattern', 'gemma3_text')
"""

from keras_mha.families._family import Family, Wrapper
from keras_mha.families._presets import llama_like
from keras_mha.families._weights import SANDWICH_NORMS, llama_style
from keras_mha.families.gemma2 import BLOCKS, gemma_scale_and_caps


def gemma3_local_rope(reader, fields: dict) -> None:
    """Gemma 3's sliding layers rotate with their own base (`rope_local_base_freq`, or
    transformers 5's `rope_parameters.sliding_attention`, already checked)."""
    local = (reader.config.get("rope_parameters") or {}).get("sliding_attention") or {}
    theta = local.get("rope_theta")
    fields["rope_local_theta"] = theta or reader.number("rope_local_base_freq")


TEXT = llama_like(
    "gemma3_text",
    traits={"norms_per_layer": 4, "qk_norm": "rms"},
    window="pattern",
    hooks=(gemma_scale_and_caps, gemma3_local_rope),
    defaults={
        "vocab_size": 262208,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
    },
    blocks=BLOCKS,
    weights=llama_style(norms=SANDWICH_NORMS, norm_scale_offset=BLOCKS.norm_scale_offset),
    head_size_in_config="explicit_divisor",
)

WRAPPER = Family(
    "gemma3",
    wrapper=Wrapper(
        text_model_type="gemma3_text",
        vision_model_type="siglip_vision_model",
        tie_word_embeddings=True,
        # An RMS norm over the vision width and a (vision width, text width) matrix.
        projector_parameters=lambda vision, text: vision.hidden_size * text + vision.hidden_size,
    ),
)

FAMILIES = (TEXT, WRAPPER)
