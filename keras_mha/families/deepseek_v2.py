"""DeepSeek-V2 (deepseek-ai/DeepSeek-V2, -Lite): multi-head latent attention (MLA) and
DeepSeekMoE.

Described by `keras-mha inspect` (parameters, the latent KV cache); not built by
`keras_mha.models`, and keras-mha layers cannot represent MLA.

Example:
    >>> FAMILY.moe, FAMILY.blocks is None
    ('deepseek', True)
"""

from keras_mha.families._presets import ATTENTION_BIAS, llama_like
from keras_mha.families._rules import mla
from keras_mha.families.llama import FAMILY as LLAMA

NOT_BUILT = "multi-head latent attention and a mixture-of-experts MLP"

FAMILY = llama_like(
    "deepseek_v2",
    switches={**ATTENTION_BIAS, "mlp_bias": ("mlp_bias",)},
    window="ignored",
    moe="deepseek",
    hooks=(mla,),
    not_built=NOT_BUILT,
    # DeepseekV2Config takes LlamaConfig's defaults for what the two share.
    defaults={
        **LLAMA.defaults,
        "vocab_size": 102400,
        "first_k_dense_replace": 0,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "num_experts_per_tok": None,
        "moe_intermediate_size": 1407,
        "moe_layer_freq": 1,
    },
)
