"""Mistral (mistralai/Mistral-7B-*): Llama's blocks with a sliding window on every layer.

Example:
    >>> FAMILY.window, FAMILY.defaults["sliding_window"]
    ('all', 4096)
"""

from keras_mha.families._presets import LLAMA_BLOCKS, NO_BIASES, llama_like
from keras_mha.families._weights import llama_style

FAMILY = llama_like(
    "mistral",
    traits=NO_BIASES,
    switches={},
    defaults={
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
        "sliding_window": 4096,
    },
    blocks=LLAMA_BLOCKS,
    weights=llama_style(),
    head_size_in_config="explicit",
)
