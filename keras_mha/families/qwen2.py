"""Qwen2 / Qwen2.5 (Qwen/*): Llama's blocks with q/k/v biases and Qwen's window layout.

Example:
    >>> FAMILY.traits["q_bias"], FAMILY.traits["o_bias"], FAMILY.window
    (True, False, 'qwen')
"""

from keras_mha.families._presets import LLAMA_BLOCKS, llama_like
from keras_mha.families._weights import llama_style

FAMILY = llama_like(
    "qwen2",
    traits={"q_bias": True, "k_bias": True, "v_bias": True, "o_bias": False},
    switches={},
    window="qwen",
    defaults={
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
    },
    blocks=LLAMA_BLOCKS,
    weights=llama_style(),
    head_size_in_config="explicit",
)
