"""Llama 1/2/3 (meta-llama/*): the layout most decoder families share.

GQA with an explicit `head_dim`, RMS norms, a gated SiLU MLP, RoPE (llama3 scaling);
`attention_bias` and `mlp_bias` switch biases on. transformers' LlamaConfig also
requires `hidden_size % num_attention_heads == 0`, so a pruned Llama exports with zero
heads where the kept count does not divide the width.

Example:
    >>> FAMILY.head_size_in_config, FAMILY.blocks.kind
    ('explicit_divisor', 'decoder')
"""

from keras_mha.families._presets import ATTENTION_BIAS, LLAMA_BLOCKS, llama_like
from keras_mha.families._rules import mla
from keras_mha.families._weights import llama_style

FAMILY = llama_like(
    "llama",
    switches={**ATTENTION_BIAS, "mlp_bias": ("mlp_bias",)},
    window="ignored",
    hooks=(mla,),
    defaults={
        "vocab_size": 32000,
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
    },
    blocks=LLAMA_BLOCKS,
    weights=llama_style(),
    head_size_in_config="explicit_divisor",
)
