"""The fallback for a `model_type` no family module claims: every spelling any family
uses, read as a Llama-like decoder (with a `UserWarning` that counts may be approximate).

Its single attention layers load through whichever family's tensor names the checkpoint
has (`keras_mha.models.load_attention_weights` tries them all).

Example:
    >>> "decoder_layers" in FAMILY.keys["num_hidden_layers"]
    True
"""

from keras_mha.families._presets import (
    HEADS_KEYS,
    INTERMEDIATE_KEYS,
    LAYERS_KEYS,
    LLAMA_KEYS,
    llama_like,
)
from keras_mha.families._rules import mla

FAMILY = llama_like(
    "generic",
    keys={
        **LLAMA_KEYS,
        "num_attention_heads": HEADS_KEYS + ("decoder_attention_heads", "encoder_attention_heads"),
        "num_hidden_layers": LAYERS_KEYS + ("decoder_layers",),
        "head_dim": ("head_dim", "d_kv"),
        "intermediate_size": INTERMEDIATE_KEYS + ("decoder_ffn_dim",),
        "partial_rotary_factor": ("partial_rotary_factor", "rotary_pct"),
    },
    moe="mixtral",
    hooks=(mla,),
    not_built="a block layout keras-mha does not describe",
)
