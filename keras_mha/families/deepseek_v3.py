"""DeepSeek-V3 (deepseek-ai/DeepSeek-V3): DeepSeek-V2's multi-head latent attention
and DeepSeekMoE at 671B parameters.

Described by `keras-mha inspect`; not built by `keras_mha.models`.

Example:
    >>> FAMILY.defaults["n_routed_experts"]
    256
"""

from keras_mha.families._presets import llama_like
from keras_mha.families._rules import mla
from keras_mha.families.deepseek_v2 import NOT_BUILT

FAMILY = llama_like(
    "deepseek_v3",
    window="ignored",
    moe="deepseek",
    hooks=(mla,),
    not_built=NOT_BUILT,
    defaults={
        "vocab_size": 129280,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "n_shared_experts": 1,
        "n_routed_experts": 256,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "qk_nope_head_dim": 128,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "moe_layer_freq": 1,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "rope_theta": 10000.0,
    },
)
