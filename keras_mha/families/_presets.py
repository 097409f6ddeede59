"""What many families share: config key spellings, trait presets, Llama's shape.

Family modules start from these and change what differs, so a family built like Llama
is a few lines (`llama_like(...)`) and one built like GPT-2 starts from
`CLASSIC_TRAITS`.

Example:
    >>> llama_like("tiny", traits=NO_BIASES).traits["norm_type"]
    'rms'
"""

from __future__ import annotations

from keras_mha.families._family import Blocks, Family

HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")
HEADS_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
LAYERS_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
KV_HEADS_KEYS = ("num_key_value_heads", "num_kv_heads", "n_head_kv")
VOCAB_KEYS = ("vocab_size", "padded_vocab_size")
INTERMEDIATE_KEYS = ("intermediate_size", "n_inner", "ffn_dim", "d_ff", "ffn_hidden_size")
MAX_POSITION_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "max_sequence_length",
    "n_ctx",
)
NORM_EPS_KEYS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps")
ACTIVATION_KEYS = (
    "hidden_act",
    "hidden_activation",
    "activation_function",
    "activation",
    "dense_act_fn",
)
ROPE_KEYS = {"rope_theta": ("rope_theta",), "partial_rotary_factor": ("partial_rotary_factor",)}

COMMON_KEYS = {
    "hidden_size": HIDDEN_KEYS,
    "num_attention_heads": HEADS_KEYS,
    "num_hidden_layers": LAYERS_KEYS,
    "vocab_size": VOCAB_KEYS,
    "max_position_embeddings": MAX_POSITION_KEYS,
    "norm_eps": NORM_EPS_KEYS,
    "hidden_act": ACTIVATION_KEYS,
}
# Llama and the families built like it: GQA spellings, an explicit head_dim, RoPE.
LLAMA_KEYS = {
    **COMMON_KEYS,
    **ROPE_KEYS,
    "num_key_value_heads": KV_HEADS_KEYS,
    "head_dim": ("head_dim",),
    "intermediate_size": INTERMEDIATE_KEYS,
}

ALL_BIASES = ("q_bias", "k_bias", "v_bias", "o_bias")
NO_BIASES = dict.fromkeys(ALL_BIASES, False)
LLAMA_TRAITS = {"mlp_kind": "gated", "norm_type": "rms", "position_embedding": "rope"}
# LayerNorm with bias, biased plain MLP, biases on every projection (GPT-2, BERT, ...).
CLASSIC_TRAITS = {
    **dict.fromkeys(ALL_BIASES, True),
    "mlp_kind": "plain",
    "mlp_bias": True,
    "norm_type": "layer",
    "norm_bias": True,
    "norm_affine": True,
}
LEARNED_POSITIONS = {"position_embedding": "learned", "learned_position_tables": 1}
ATTENTION_BIAS = {"attention_bias": ALL_BIASES}
# A causal LM of Llama-style blocks (`keras_mha.models.DecoderModel`).
LLAMA_BLOCKS = Blocks("decoder")


def llama_like(name: str, *, traits: dict | None = None, **fields) -> Family:
    """A family built like Llama: GQA keys, RMS norms, a gated MLP, RoPE, `attention_bias`.

    Args:
        name: the model type.
        traits: traits added to (or replacing) `LLAMA_TRAITS`.
        **fields: any other `Family` field (`switches`, `window`, `hooks`, ...).
    """
    fields.setdefault("keys", LLAMA_KEYS)
    fields.setdefault("switches", ATTENTION_BIAS)
    fields.setdefault("window", "all")
    return Family(name, traits={**LLAMA_TRAITS, **(traits or {})}, **fields)


__all__ = [
    "ALL_BIASES",
    "ATTENTION_BIAS",
    "CLASSIC_TRAITS",
    "COMMON_KEYS",
    "LEARNED_POSITIONS",
    "LLAMA_BLOCKS",
    "LLAMA_KEYS",
    "LLAMA_TRAITS",
    "NO_BIASES",
    "ROPE_KEYS",
    "llama_like",
]
