"""Mixtral (mistralai/Mixtral-8x7B-*): Mistral's attention with a mixture-of-experts MLP.

Described by `inspect` and rebuilt layer by layer (`load_attention_weights`); the MoE
MLP is not built by `keras_mha.models`.

Example:
    >>> FAMILY.moe, FAMILY.blocks is None
    ('mixtral', True)
"""

from keras_mha.families._presets import NO_BIASES, llama_like
from keras_mha.families._weights import LLAMA_PREFIXES, attention_only, projections
from keras_mha.families.mistral import FAMILY as MISTRAL

FAMILY = llama_like(
    "mixtral",
    traits=NO_BIASES,
    switches={},
    moe="mixtral",
    defaults={
        **MISTRAL.defaults,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    },
    not_built="a mixture-of-experts MLP",
    weights=attention_only(
        LLAMA_PREFIXES,
        "{prefix}embed_tokens.weight",
        projections("{prefix}layers.{layer}.self_attn"),
    ),
)
