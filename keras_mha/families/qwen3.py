"""Qwen3 (Qwen/Qwen3-*): Llama's blocks with RMS q/k norms and Qwen's window layout.

Example:
    >>> FAMILY.traits["qk_norm"]
    'rms'
"""

from keras_mha.families._presets import LLAMA_BLOCKS, llama_like
from keras_mha.families._weights import llama_style
from keras_mha.families.qwen2 import FAMILY as QWEN2

FAMILY = llama_like(
    "qwen3",
    traits={"qk_norm": "rms"},
    window="qwen",
    # Qwen3Config's defaults are Qwen2Config's, with an explicit head size.
    defaults={**QWEN2.defaults, "head_dim": 128, "attention_bias": False},
    blocks=LLAMA_BLOCKS,
    weights=llama_style(),
    head_size_in_config="explicit",
)
