"""DeepSeek-V2 / V3 (deepseek-ai/*): multi-head latent attention (MLA) and DeepSeekMoE.

Described by `keras-mha inspect` (parameters, the latent KV cache); not built by
`keras_mha.models`, and keras-mha layers cannot represent MLA.

Example:
    >>> FAMILIES[0].moe, FAMILIES[0].blocks is None
    ('deepseek', True)
"""

import math

from keras_mha.families._presets import ATTENTION_BIAS, llama_like


def mla(reader, fields: dict) -> None:
    """DeepSeek's multi-head latent attention (also for any config with `kv_lora_rank`)."""
    if reader.lookup("kv_lora_rank")[0] is None:
        return
    fields["kv_lora_rank"] = reader.integer("kv_lora_rank", "width")
    fields["q_lora_rank"] = reader.integer("q_lora_rank", "width", default=None, nullable=True)
    rope = fields["qk_rope_head_dim"] = reader.integer("qk_rope_head_dim", "width")
    nope = fields["qk_nope_head_dim"] = reader.integer("qk_nope_head_dim", "width")
    fields["value_head_dim"] = reader.integer("v_head_dim", "width")
    # The latent is expanded into one key/value head per query head.
    fields["num_key_value_heads"] = fields["num_attention_heads"]
    reader.found["num_key_value_heads"] = reader.found["num_attention_heads"]
    fields["head_dim"] = rope + nope
    # MLA's biases (with attention_bias) sit on q_a_proj (only with a query LoRA),
    # kv_a_proj_with_mqa and o_proj; q_b_proj, kv_b_proj and a plain q_proj have none.
    bias = fields["o_bias"]
    fields.update(q_bias=bias and fields["q_lora_rank"] is not None, k_bias=bias, v_bias=False)
    scale = (rope + nope) ** -0.5
    scaling = fields.get("rope_scaling") or {}
    mscale_all_dim, factor = scaling.get("mscale_all_dim") or 0, scaling.get("factor") or 1.0
    if mscale_all_dim and factor > 1:
        # YaRN: the softmax scale grows with mscale^2 (DeepSeek's yarn_get_mscale).
        mscale = 0.1 * mscale_all_dim * math.log(factor) + 1.0
        scale *= mscale * mscale
    fields["attention_scale"] = scale


NOT_BUILT = "multi-head latent attention and a mixture-of-experts MLP"

FAMILIES = (
    llama_like(
        "deepseek_v2",
        switches={**ATTENTION_BIAS, "mlp_bias": ("mlp_bias",)},
        window="ignored",
        moe="deepseek",
        hooks=(mla,),
        not_built=NOT_BUILT,
        defaults={
            "vocab_size": 102400,
            "hidden_size": 4096,
            "intermediate_size": 11008,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "hidden_act": "silu",
            "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
            "rope_theta": 10000.0,
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
    ),
    llama_like(
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
    ),
)
