"""Qwen3-MoE (Qwen/Qwen3-30B-A3B, ...): Qwen3's attention with sparse MoE layers.

Described by `inspect` and rebuilt layer by layer; the MoE MLP is not built.

Example:
    >>> FAMILY.moe
    'qwen3_moe'
"""

from keras_mha.families._presets import llama_like
from keras_mha.families._weights import LLAMA_PREFIXES, attention_only, projections, qk_norms

_ATTENTION = "{prefix}layers.{layer}.self_attn"

FAMILY = llama_like(
    "qwen3_moe",
    traits={"qk_norm": "rms"},
    window="qwen",
    moe="qwen3_moe",
    # Qwen3MoeConfig's own defaults: no head_dim (hidden / heads) and no max_window_layers.
    defaults={
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 24,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "rope_theta": 10000.0,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "decoder_sparse_step": 1,
        "moe_intermediate_size": 768,
        "num_experts_per_tok": 8,
        "num_experts": 128,
        "mlp_only_layers": [],
    },
    not_built="a mixture-of-experts MLP",
    weights=attention_only(
        LLAMA_PREFIXES,
        "{prefix}embed_tokens.weight",
        projections(_ATTENTION) + qk_norms(_ATTENTION),
    ),
)
