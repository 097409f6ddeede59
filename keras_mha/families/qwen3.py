"""Qwen3 (Qwen/Qwen3-*): Llama's blocks with RMS q/k norms and Qwen's window layout.

Example:
    >>> FAMILY.traits["qk_norm"]
    'rms'
"""

from keras_mha.families._presets import LLAMA_BLOCKS, llama_like
from keras_mha.families._weights import llama_style

FAMILY = llama_like(
    "qwen3",
    traits={"qk_norm": "rms"},
    window="qwen",
    defaults={
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "rope_theta": 10000.0,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
    },
    blocks=LLAMA_BLOCKS,
    weights=llama_style(),
    head_size_in_config="explicit",
)
