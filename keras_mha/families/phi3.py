"""Phi-3 (microsoft/Phi-3-*): Llama's blocks with fused `qkv_proj` and `gate_up_proj`.

Example:
    >>> [rule.transform for rule in FAMILY.weights.rules][:1]
    ['split_qkv']
"""

from keras_mha.families._family import Blocks
from keras_mha.families._presets import NO_BIASES, llama_like
from keras_mha.families._weights import llama_style

FAMILY = llama_like(
    "phi3",
    traits=NO_BIASES,
    switches={},
    defaults={
        "vocab_size": 32064,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
        "sliding_window": None,
    },
    blocks=Blocks("decoder", default_norm_epsilon=1e-5),
    weights=llama_style(fused=True),
    head_size_in_config="explicit",
)
