"""GPT-NeoX and Pythia (EleutherAI/pythia-*, gpt-neox-20b): LayerNorm blocks with a
parallel residual, partial rotary embeddings, per-head fused q/k/v, an untied head.

Each layer computes `x + attention(norm_1(x)) + mlp(norm_2(x))` (`use_parallel_residual`,
or the sequential form when false). `query_key_value` holds q, k and v of each head in
turn; `embed_out` is the LM head. transformers derives the head size as hidden /
heads (a `head_dim` key is never read, and keras-mha notes and ignores it), so a pruned
model exports with its removed heads as zero weights.

Example:
    >>> FAMILY.traits["parallel_residual"], FAMILY.weights.anchor
    (True, '{prefix}embed_in.weight')
"""

from keras_mha.families._family import Blocks, Family
from keras_mha.families._presets import ATTENTION_BIAS, CLASSIC_TRAITS, COMMON_KEYS
from keras_mha.families._weights import (
    ROTARY_BUFFERS,
    WeightNames,
    WeightRule,
    dense,
    fused_qkv,
    layer_norm,
    output_projection,
)

_LAYER = "{prefix}layers.{layer}"
_BLOCK = "blocks.{layer}"

FAMILY = Family(
    "gpt_neox",
    keys={
        **COMMON_KEYS,
        "intermediate_size": ("intermediate_size",),
        "rope_theta": ("rope_theta", "rotary_emb_base"),
        "partial_rotary_factor": ("partial_rotary_factor", "rotary_pct"),
    },
    traits={**CLASSIC_TRAITS, "position_embedding": "rope", "parallel_residual": True},
    switches={**ATTENTION_BIAS, "use_parallel_residual": ("parallel_residual",)},
    defaults={
        "vocab_size": 50432,
        "hidden_size": 6144,
        "num_hidden_layers": 44,
        "num_attention_heads": 64,
        "intermediate_size": 24576,
        "hidden_act": "gelu",
        "max_position_embeddings": 2048,
        "layer_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "use_parallel_residual": True,
        "attention_bias": True,
        "rotary_pct": 0.25,
        "rotary_emb_base": 10000.0,
    },
    blocks=Blocks("decoder", default_activation="gelu", default_norm_epsilon=1e-5),
    weights=WeightNames(
        prefixes=("gpt_neox.", ""),
        anchor="{prefix}embed_in.weight",
        rules=(
            WeightRule("{prefix}embed_in.weight", ("token_embedding.embeddings",)),
            *layer_norm("{prefix}final_layer_norm", "final_norm"),
            WeightRule("embed_out.weight", ("lm_head.kernel",), "transpose"),
            *layer_norm(f"{_LAYER}.input_layernorm", f"{_BLOCK}.attention_norm"),
            *layer_norm(f"{_LAYER}.post_attention_layernorm", f"{_BLOCK}.mlp_norm"),
            *fused_qkv(f"{_LAYER}.attention.query_key_value", "per_group"),
            *output_projection(f"{_LAYER}.attention.dense"),
            *dense(f"{_LAYER}.mlp.dense_h_to_4h", f"{_BLOCK}.up_proj"),
            *dense(f"{_LAYER}.mlp.dense_4h_to_h", f"{_BLOCK}.down_proj"),
        ),
        # Older checkpoints store the causal mask and rotary caches.
        buffers=(*ROTARY_BUFFERS, r"\.attention\.bias$", r"\.attention\.masked_bias$"),
    ),
    head_size_in_config="derived",
)
