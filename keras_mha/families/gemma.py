"""Gemma (google/gemma-2b, -7b): Llama's layout with Gemma's norm and embedding rules.

Gemma's RMS norms multiply by `1 + w` (the checkpoint stores `w`), the embeddings are
scaled by sqrt(hidden_size), and the MLP uses tanh-approximated GELU.

Example:
    >>> BLOCKS.norm_scale_offset, BLOCKS.embedding_scale
    (1.0, True)
"""

from keras_mha.families._family import Blocks
from keras_mha.families._presets import llama_like
from keras_mha.families._weights import llama_style

BLOCKS = Blocks(
    "decoder",
    default_activation="gelu_pytorch_tanh",
    norm_scale_offset=1.0,
    embedding_scale=True,
)

FAMILY = llama_like(
    "gemma",
    window="ignored",
    defaults={
        "vocab_size": 256000,
        "hidden_size": 3072,
        "intermediate_size": 24576,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "head_dim": 256,
        "hidden_act": "gelu_pytorch_tanh",
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "rope_theta": 10000.0,
    },
    blocks=BLOCKS,
    weights=llama_style(norm_scale_offset=BLOCKS.norm_scale_offset),
    head_size_in_config="explicit",
)
