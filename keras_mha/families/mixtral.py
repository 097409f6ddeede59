"""Mixtral (mistralai/Mixtral-8x7B-*): Mistral's attention with a mixture-of-experts MLP.

Described by `inspect` and rebuilt layer by layer (`load_attention_weights`); the MoE
MLP is not built by `keras_mha.models`.

Example:
    >>> FAMILY.moe, FAMILY.blocks is None
    ('mixtral', True)
"""

from keras_mha.families._presets import NO_BIASES, llama_like
from keras_mha.families._weights import LLAMA_PREFIXES, attention_only, projections

FAMILY = llama_like(
    "mixtral",
    traits=NO_BIASES,
    switches={},
    moe="mixtral",
    defaults={
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    },
    not_built="a mixture-of-experts MLP",
    weights=attention_only(
        LLAMA_PREFIXES,
        "{prefix}embed_tokens.weight",
        projections("{prefix}layers.{layer}.self_attn"),
    ),
)
