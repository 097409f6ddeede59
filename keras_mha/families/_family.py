"""How each model family spells its config keys, what its blocks always are, and its quirks.

One `Family` per `model_type`: `keys` maps each canonical `ModelSpec` field to the
config keys that hold it, tried in order (transformers' `attribute_map`, written out);
`traits` are the `ModelSpec` fields the family fixes (biases, norms, MLP kind, position
encoding); `switches` are boolean config keys copied into boolean fields; `window`
and `moe` name how layer kinds and MoE layers are laid out; `hooks` are the few genuine
special cases (Falcon's KV heads, MLA, DBRX's nested configs, T5/BART encoders, ...).
`read_family` applies them through a `ConfigReader`, so every value is validated the
same way (see `keras_mha.cards.config_values`).

Example:
    >>> from keras_mha.cards.config_values import ConfigReader
    >>> reader = ConfigReader({"n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 10,
    ...                        "n_positions": 32}, model_type="gpt2")
    >>> fields = read_family(reader, FAMILIES["gpt2"])
    >>> fields["head_dim"], fields["intermediate_size"], fields["layer_kinds"]
    (16, 256, ('full', 'full'))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from keras_mha.cards import family_rules as rules
from keras_mha.cards.config_values import ConfigReader
from keras_mha.errors import ConfigError

# `typing` costs ~5 ms to import, a tenth of `inspect`'s budget; `Any` only annotates.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# -- spellings ----------------------------------------------------------------------------------

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

_COMMON_KEYS = {
    "hidden_size": HIDDEN_KEYS,
    "num_attention_heads": HEADS_KEYS,
    "num_hidden_layers": LAYERS_KEYS,
    "vocab_size": VOCAB_KEYS,
    "max_position_embeddings": MAX_POSITION_KEYS,
    "norm_eps": NORM_EPS_KEYS,
    "hidden_act": ACTIVATION_KEYS,
}
# Llama and the families built like it: GQA spellings, an explicit head_dim, RoPE.
_LLAMA_KEYS = {
    **_COMMON_KEYS,
    **ROPE_KEYS,
    "num_key_value_heads": KV_HEADS_KEYS,
    "head_dim": ("head_dim",),
    "intermediate_size": INTERMEDIATE_KEYS,
}
# An unknown model_type: every spelling any family uses.
_GENERIC_KEYS = {
    **_LLAMA_KEYS,
    "num_attention_heads": HEADS_KEYS + ("decoder_attention_heads", "encoder_attention_heads"),
    "num_hidden_layers": LAYERS_KEYS + ("decoder_layers",),
    "head_dim": ("head_dim", "d_kv"),
    "intermediate_size": INTERMEDIATE_KEYS + ("decoder_ffn_dim",),
    "partial_rotary_factor": ("partial_rotary_factor", "rotary_pct"),
}

# -- traits -------------------------------------------------------------------------------------

_ALL_BIASES = ("q_bias", "k_bias", "v_bias", "o_bias")
_NO_BIASES = dict.fromkeys(_ALL_BIASES, False)
_LLAMA_TRAITS = {"mlp_kind": "gated", "norm_type": "rms", "position_embedding": "rope"}
# LayerNorm with bias, biased plain MLP, biases on every projection (GPT-2, BERT, ...).
_CLASSIC_TRAITS = {
    **dict.fromkeys(_ALL_BIASES, True),
    "mlp_kind": "plain",
    "mlp_bias": True,
    "norm_type": "layer",
    "norm_bias": True,
    "norm_affine": True,
}
_LEARNED_POSITIONS = {"position_embedding": "learned", "learned_position_tables": 1}
_ATTENTION_BIAS = {"attention_bias": _ALL_BIASES}


@dataclass(frozen=True)
class Family:
    """A model family's config vocabulary and fixed traits (see the module docstring).

    Attributes:
        keys: canonical field -> spellings in the order tried; a field without spellings
            is derived (`num_key_value_heads` = heads, `head_dim` = hidden / heads).
        traits: `ModelSpec` fields the family fixes.
        switches: boolean config key -> the boolean `ModelSpec` fields it sets.
        window: how layer kinds are laid out: None (all full), "all" (every layer slides
            when a window is set), "qwen" (`use_sliding_window` + `max_window_layers`),
            "alternate" (Gemma 2), "pattern" (Gemma 3's `sliding_window_pattern`),
            "ignored" (the family has no windows; a window is noted and dropped).
        moe: "mixtral", "qwen3_moe", "deepseek", "jamba" or None.
        ffn_factor: intermediate size = `ffn_factor * hidden_size` when no key gives it.
        hooks: the family's special cases, `hook(reader, fields)`, in order.

    Example:
        >>> FAMILIES["qwen2"].traits["o_bias"], FAMILIES["gemma2"].window
        (False, 'alternate')
    """

    keys: Mapping[str, tuple[str, ...]]
    traits: Mapping[str, Any] = field(default_factory=dict)
    switches: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    window: str | None = None
    moe: str | None = None
    ffn_factor: int | None = None
    hooks: tuple[Callable[[ConfigReader, dict], None], ...] = ()


# -- reading ------------------------------------------------------------------------------------


def read_family(reader: ConfigReader, family: Family) -> dict:
    """Every `ModelSpec` field `family` defines, read and validated through `reader`.

    Returns a dict of `ModelSpec` fields plus "layer_kinds" (and "notes": remarks for
    `ModelSpec.warnings`); `cards.spec.from_config` adds the rest and the cross-field checks.
    """
    keys = family.keys
    fields: dict[str, Any] = dict(family.traits)
    fields["notes"] = []
    fields["hidden_size"] = reader.integer(
        keys["hidden_size"], "width", name="hidden_size", shape=True
    )
    heads = reader.integer(
        keys["num_attention_heads"], "heads", name="num_attention_heads", shape=True
    )
    fields["num_attention_heads"] = heads
    fields["num_hidden_layers"] = reader.integer(
        keys["num_hidden_layers"], "layers", name="num_hidden_layers", shape=True
    )
    fields["vocab_size"] = reader.integer(keys["vocab_size"], "vocab", shape=True)
    fields["num_key_value_heads"] = reader.integer(
        keys.get("num_key_value_heads", ()),
        "heads",
        default=heads,
        name="num_key_value_heads",
        shape=True,
    )
    head_dim = reader.integer(
        keys.get("head_dim", ()), "width", default=None, name="head_dim", shape=True
    )
    if head_dim is not None:
        fields["head_dim"] = head_dim
    if "intermediate_size" in keys:
        fields["intermediate_size"] = reader.integer(
            keys["intermediate_size"],
            "width",
            default=ConfigError  # required, unless the family derives it from the width
            if family.ffn_factor is None
            else family.ffn_factor * fields["hidden_size"],
            shape=family.ffn_factor is None,
        )
    # A learned position table needs its row count; otherwise positions are informative.
    learned = family.traits.get("position_embedding") == "learned"
    fields["max_position_embeddings"] = reader.integer(
        keys["max_position_embeddings"],
        "tokens",
        default=ConfigError if learned else None,
        shape=learned,
    )
    fields["norm_eps"] = reader.number(keys["norm_eps"], "epsilon")
    activation_key, _ = reader.lookup(keys["hidden_act"])
    fields["hidden_act"] = reader.text(activation_key) if activation_key else None
    fields["tie_word_embeddings"] = reader.flag("tie_word_embeddings", True)
    if "rope_theta" in keys:
        fields.update(rules.rope_fields(reader, keys))
    for key, targets in family.switches.items():
        value = reader.flag(key, fields.get(targets[0], False))
        fields.update(dict.fromkeys(targets, value))
    if family.moe:
        fields.update(rules.MOE_RULES[family.moe](reader, fields))
    if family.window is not None:
        fields["layer_kinds"], fields["sliding_window"] = rules.window_layer_kinds(
            reader, family.window, fields
        )
    for hook in family.hooks:
        hook(reader, fields)
    if "head_dim" not in fields:
        fields["head_dim"] = rules.derived_head_dim(reader, fields)
    fields.setdefault("layer_kinds", ("full",) * fields["num_hidden_layers"])
    return fields


# -- the table ----------------------------------------------------------------------------------


def _llama_like(traits: Mapping | None = None, **options) -> Family:
    """A family built like Llama: pre-norm attention and a gated MLP, RMS norms, RoPE."""
    switches = options.pop("switches", _ATTENTION_BIAS)
    return Family(
        keys=options.pop("keys", _LLAMA_KEYS),
        traits={**_LLAMA_TRAITS, **(traits or {})},
        switches=switches,
        window=options.pop("window", "all"),
        **options,
    )


_QWEN_BIASES = {"q_bias": True, "k_bias": True, "v_bias": True, "o_bias": False}
_GEMMA2_TRAITS = {"norms_per_layer": 4}
_MLA_FAMILY = {
    "switches": {**_ATTENTION_BIAS, "mlp_bias": ("mlp_bias",)},
    "window": "ignored",
    "moe": "deepseek",
    "hooks": (rules.mla,),
}

FAMILIES: dict[str, Family] = {
    "llama": _llama_like(
        switches={**_ATTENTION_BIAS, "mlp_bias": ("mlp_bias",)},
        window="ignored",
        hooks=(rules.mla,),
    ),
    "mistral": _llama_like(_NO_BIASES, switches={}),
    "mixtral": _llama_like(_NO_BIASES, switches={}, moe="mixtral"),
    "phi3": _llama_like(_NO_BIASES, switches={}),
    "qwen2": _llama_like(_QWEN_BIASES, switches={}, window="qwen"),
    "qwen3": _llama_like({"qk_norm": "rms"}, window="qwen"),
    "qwen3_moe": _llama_like({"qk_norm": "rms"}, window="qwen", moe="qwen3_moe"),
    "gemma": _llama_like(window="ignored"),
    "gemma2": _llama_like(_GEMMA2_TRAITS, window="alternate", hooks=(rules.gemma_scale_and_caps,)),
    "gemma3_text": _llama_like(
        {**_GEMMA2_TRAITS, "qk_norm": "rms"},
        window="pattern",
        hooks=(rules.gemma_scale_and_caps, rules.gemma3_local_rope),
    ),
    "deepseek_v2": _llama_like(**_MLA_FAMILY),
    "deepseek_v3": _llama_like(**{**_MLA_FAMILY, "switches": _ATTENTION_BIAS}),
    # Jamba's attention layers apply no position encoding: its Mamba layers carry the order.
    "jamba": _llama_like(
        {**_NO_BIASES, "position_embedding": "none"},
        switches={},
        window=None,
        moe="jamba",
        hooks=(rules.jamba,),
    ),
    "gpt2": Family(
        keys={**_COMMON_KEYS, "intermediate_size": ("n_inner",)},
        traits={**_CLASSIC_TRAITS, **_LEARNED_POSITIONS},
        ffn_factor=4,
        hooks=(rules.gpt2,),
    ),
    "gpt_neox": Family(
        keys={
            **_COMMON_KEYS,
            "head_dim": ("head_dim",),
            "intermediate_size": ("intermediate_size",),
            "rope_theta": ("rope_theta", "rotary_emb_base"),
            "partial_rotary_factor": ("partial_rotary_factor", "rotary_pct"),
        },
        traits={**_CLASSIC_TRAITS, "position_embedding": "rope"},
        switches=_ATTENTION_BIAS,
    ),
    "falcon": Family(
        keys={**_COMMON_KEYS, **ROPE_KEYS, "intermediate_size": ("ffn_hidden_size",)},
        traits={**_CLASSIC_TRAITS, **_NO_BIASES, "mlp_bias": False, "position_embedding": "rope"},
        switches={"bias": (*_ALL_BIASES, "mlp_bias")},
        ffn_factor=4,
        hooks=(rules.falcon,),
    ),
    "phi": Family(
        keys={
            **_COMMON_KEYS,
            **ROPE_KEYS,
            "num_key_value_heads": KV_HEADS_KEYS,
            "head_dim": ("head_dim",),
            "intermediate_size": ("intermediate_size",),
        },
        traits={
            **_CLASSIC_TRAITS,
            "norms_per_layer": 1,
            "lm_head_bias": True,
            "position_embedding": "rope",
        },
        hooks=(rules.phi,),
    ),
    "opt": Family(
        keys={**_COMMON_KEYS, "intermediate_size": ("ffn_dim",)},
        traits={**_CLASSIC_TRAITS, **_LEARNED_POSITIONS},
        switches={
            "enable_bias": (*_ALL_BIASES, "mlp_bias"),
            "layer_norm_elementwise_affine": ("norm_affine",),
        },
        hooks=(rules.opt,),
    ),
    "bert": Family(
        keys={**_COMMON_KEYS, "intermediate_size": ("intermediate_size",)},
        traits={
            **_CLASSIC_TRAITS,
            **_LEARNED_POSITIONS,
            "final_norms": 0,
            "embedding_norms": 1,
            "is_decoder": False,
        },
        switches={"is_decoder": ("is_decoder",)},
        hooks=(rules.bert,),
    ),
    "t5": Family(
        keys={
            **_COMMON_KEYS,
            "hidden_size": ("hidden_size", "d_model"),
            "num_attention_heads": ("num_attention_heads", "num_heads"),
            "num_hidden_layers": ("num_hidden_layers", "num_layers"),
            "head_dim": ("head_dim", "d_kv"),
            "intermediate_size": ("d_ff",),
        },
        traits={
            **_NO_BIASES,
            "attention_scale": 1.0,  # T5 folds the scale into its initialisation
            "norm_type": "rms",
            "norms_per_layer": 3,
            "final_norms": 2,
            "position_embedding": "relative",
            "is_encoder_decoder": True,
            "encoder_norms_per_layer": 2,
        },
        hooks=(rules.t5,),
    ),
    "bart": Family(
        keys={
            **_COMMON_KEYS,
            "hidden_size": ("hidden_size", "d_model"),
            "num_attention_heads": ("decoder_attention_heads",),
            "num_hidden_layers": ("decoder_layers",),
            "intermediate_size": ("decoder_ffn_dim",),
        },
        traits={
            **_CLASSIC_TRAITS,
            **_LEARNED_POSITIONS,
            "learned_position_tables": 2,
            "norms_per_layer": 3,
            "final_norms": 0,
            "embedding_norms": 2,
            "is_encoder_decoder": True,
            "encoder_norms_per_layer": 2,
        },
        hooks=(rules.bart,),
    ),
    "dbrx": Family(
        keys=_COMMON_KEYS,
        traits={**_LLAMA_TRAITS, "norm_type": "layer", "norm_bias": False},
        hooks=(rules.dbrx,),
    ),
    "generic": _llama_like(keys=_GENERIC_KEYS, moe="mixtral", hooks=(rules.mla,)),
}
FAMILIES["gpt_bigcode"] = FAMILIES["gpt2"]


__all__ = ["FAMILIES", "Family", "read_family"]
