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
from keras_mha.cards.family_defaults import DBRX_ATTN_DEFAULTS
    >>> reader = ConfigReader({"n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 10,
    ...                        "n_positions": 32}, model_type="gpt2")
    >>> fields = read_family(reader, FAMILIES["gpt2"])
    >>> fields["head_dim"], fields["intermediate_size"], fields["layer_kinds"]
    (16, 256, ('full', 'full'))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from keras_mha.cards.config_values import ConfigReader
from keras_mha.cards.family_defaults import DBRX_ATTN_DEFAULTS
from keras_mha.errors import ConfigError

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

# `layer_types` strings (transformers' convention) -> the three kinds used here.
LAYER_TYPE_KINDS = {
    "full_attention": "full",
    "attention": "full",
    "global": "full",
    "sliding_attention": "sliding",
    "local": "sliding",
    "chunked_attention": "sliding",
    "linear_attention": "none",
    "mamba": "none",
    "conv": "none",
    "recurrent": "none",
    "moe": "none",
    "mlp": "none",
}
# `rope_scaling` / `rope_parameters`: numeric fields and their kinds; rope types needing a factor.
_ROPE_NUMBERS = {
    "factor": "positive",
    "attention_factor": "positive",
    "low_freq_factor": "positive",
    "high_freq_factor": "positive",
    "rope_theta": "positive",
    "partial_rotary_factor": "fraction",
    "beta_fast": "finite",
    "beta_slow": "finite",
    "mscale": "finite",
    "mscale_all_dim": "finite",
}
_ROPE_TYPES_WITH_FACTOR = ("linear", "dynamic", "yarn", "llama3")


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
    fields["max_position_embeddings"] = reader.integer(
        keys["max_position_embeddings"], "tokens", default=None
    )
    fields["norm_eps"] = reader.number(keys["norm_eps"], "epsilon")
    activation_key, _ = reader.lookup(keys["hidden_act"])
    fields["hidden_act"] = reader.text(activation_key) if activation_key else None
    fields["tie_word_embeddings"] = reader.flag("tie_word_embeddings", True)
    if "rope_theta" in keys:
        fields.update(_rope_fields(reader, keys))
    for key, targets in family.switches.items():
        value = reader.flag(key, fields.get(targets[0], False))
        fields.update(dict.fromkeys(targets, value))
    if family.moe:
        fields.update(_MOE_RULES[family.moe](reader, fields["num_hidden_layers"]))
    if family.window is not None:
        fields["layer_kinds"], fields["sliding_window"] = _window_layer_kinds(
            reader, family.window, fields
        )
    for hook in family.hooks:
        hook(reader, fields)
    if "head_dim" not in fields:
        fields["head_dim"] = derived_head_dim(reader, fields)
    fields.setdefault("layer_kinds", ("full",) * fields["num_hidden_layers"])
    return fields


def derived_head_dim(reader: ConfigReader, fields: dict) -> int:
    """hidden / heads, for families that derive the head size (transformers refuses a rest)."""
    hidden, heads = fields["hidden_size"], fields["num_attention_heads"]
    reader.require(
        hidden % heads == 0,
        reader.found["hidden_size"],
        hidden,
        f"is not divisible by {reader.found['num_attention_heads']}={heads}; expected a "
        f"multiple of the head count (the head size is hidden / heads here)",
    )
    return hidden // heads


def _rope_fields(reader: ConfigReader, keys: Mapping[str, tuple[str, ...]]) -> dict:
    """RoPE base, partial rotary factor and scaling (`rope_scaling` or transformers 5's
    `rope_parameters`, one dict or one per layer type)."""
    theta = reader.number(keys["rope_theta"], "positive")
    factor = reader.number(keys["partial_rotary_factor"], "fraction", default=1.0)
    scaling = _rope_dict(reader, "rope_scaling", reader.config.get("rope_scaling"))
    parameters = _rope_dict(reader, "rope_parameters", reader.config.get("rope_parameters"))
    if parameters is not None:
        by_layer_type = {
            name: _rope_dict(reader, f"rope_parameters.{name}", parameters[name])
            for name in ("full_attention", "sliding_attention")
            if name in parameters
        }
        flat = by_layer_type.get("full_attention", parameters) or {}
        theta = flat.get("rope_theta") or theta
        factor = flat.get("partial_rotary_factor") or factor
        if scaling is None and flat.get("rope_type", "default") != "default":
            scaling = {key: value for key, value in flat.items() if key != "rope_theta"}
    return {
        "rope_theta": theta,
        "partial_rotary_factor": factor,
        "rope_scaling": scaling or None,
    }


def _rope_dict(reader: ConfigReader, key: str, value: Any) -> dict | None:
    """A `rope_scaling`-style dict with its numeric fields checked; None for null."""
    if value is None:
        return None
    reader.require(isinstance(value, Mapping), key, value, "must be a JSON object or null")
    checked = dict(value)
    rope_type = checked.get("rope_type", checked.get("type"))
    if rope_type is not None:
        reader.require(
            isinstance(rope_type, str), f"{key}.rope_type", rope_type, "must be a string"
        )
    for name, kind in _ROPE_NUMBERS.items():
        if checked.get(name) is not None:
            checked[name] = reader.check_number(f"{key}.{name}", checked[name], kind)
    if checked.get("original_max_position_embeddings") is not None:
        reader.check_integer(
            f"{key}.original_max_position_embeddings",
            checked["original_max_position_embeddings"],
            "tokens",
        )
    if rope_type in _ROPE_TYPES_WITH_FACTOR and checked.get("factor") is None:
        raise reader.error(
            key, value, f"must give a 'factor' for rope_type {rope_type!r} (as transformers does)"
        )
    for name in ("short_factor", "long_factor"):
        if checked.get(name) is not None:
            factors = checked[name]
            reader.require(isinstance(factors, list), f"{key}.{name}", factors, "must be a list")
            for index, item in enumerate(factors):
                reader.check_number(f"{key}.{name}[{index}]", item, "positive")
    return checked


def _layer_types(reader: ConfigReader, num_layers: int) -> tuple[str, ...] | None:
    """Kinds from an explicit `layer_types` list (one known entry per layer), or None."""
    layer_types = reader.config.get("layer_types")
    if layer_types is None:
        return None
    reader.require(
        isinstance(layer_types, list) and len(layer_types) == num_layers,
        "layer_types",
        layer_types,
        f"must list one layer type per layer ({reader.found['num_hidden_layers']}={num_layers})",
    )
    kinds = []
    for index, layer_type in enumerate(layer_types):
        reader.require(
            isinstance(layer_type, str) and layer_type in LAYER_TYPE_KINDS,
            f"layer_types[{index}]",
            layer_type,
            f"must be one of {sorted(LAYER_TYPE_KINDS)}",
        )
        kinds.append(LAYER_TYPE_KINDS[layer_type])
    return tuple(kinds)


def repeat_pattern(pattern: tuple[str, ...], num_layers: int) -> tuple[str, ...]:
    """`pattern` repeated to `num_layers` entries (built by tuple arithmetic, not a loop).

    Example:
        >>> repeat_pattern(("sliding", "full"), 3)
        ('sliding', 'full', 'sliding')
    """
    return (pattern * (num_layers // len(pattern) + 1))[:num_layers]


def _window_layer_kinds(reader: ConfigReader, rule: str, fields: dict) -> tuple:
    """(layer kinds, sliding window) under the family's window `rule` (see `Family`)."""
    num_layers = fields["num_hidden_layers"]
    window = reader.integer(
        ("sliding_window", "sliding_window_size"), "tokens", default=None, nullable=True
    )
    explicit = _layer_types(reader, num_layers)
    if rule == "qwen" and not reader.flag("use_sliding_window", False):
        # Qwen ships `sliding_window` in configs that do not use it (use_sliding_window=false).
        window = None
    if explicit is not None:
        reader.require(
            "sliding" not in explicit or window is not None,
            "layer_types",
            reader.config.get("layer_types"),
            "lists sliding layers, so sliding_window must be set",
        )
        return explicit, window if "sliding" in explicit else None
    if window is None:
        return ("full",) * num_layers, None
    if rule == "ignored":
        fields["notes"].append(
            f"{reader.where}sliding_window={window} is ignored: {reader.model_type} models "
            f"attend to the whole sequence in transformers"
        )
        return ("full",) * num_layers, None
    if rule == "qwen":
        # Layers from `max_window_layers` on use the window (transformers' Qwen2Config).
        first = reader.integer("max_window_layers", "layer_number")
        first = min(first, num_layers)
        return ("full",) * first + ("sliding",) * (num_layers - first), window
    if rule == "alternate":
        return repeat_pattern(("sliding", "full"), num_layers), window
    if rule == "pattern":
        period = reader.integer("sliding_window_pattern", "period")
        return repeat_pattern(("sliding",) * (period - 1) + ("full",), num_layers), window
    return ("sliding",) * num_layers, window


# -- mixture of experts -------------------------------------------------------------------------


def _experts_per_token(reader: ConfigReader, experts: int | None, default: Any = ConfigError):
    return reader.integer(
        "num_experts_per_tok",
        "experts",
        default=default,
        high=experts,
        name="num_experts_per_tok",
        nullable=default is None,
    )


def _moe_mixtral(reader: ConfigReader, num_layers: int) -> dict:
    experts = reader.integer("num_local_experts", "experts", default=None)
    if experts is None:  # a generic config without experts
        return {}
    return {
        "num_experts": experts,
        "num_experts_per_tok": _experts_per_token(reader, experts),
        "moe_intermediate_size": reader.integer(INTERMEDIATE_KEYS, "width"),
        "moe_layers": (True,) * num_layers,
    }


def _moe_qwen3(reader: ConfigReader, num_layers: int) -> dict:
    experts = reader.integer("num_experts", "count")
    step = reader.integer("decoder_sparse_step", "period")
    dense = set(reader.integer_list("mlp_only_layers", "layer_number"))
    return {
        "num_experts": experts,
        "num_experts_per_tok": _experts_per_token(reader, experts or None),
        "moe_intermediate_size": reader.integer("moe_intermediate_size", "width"),
        "moe_layers": tuple(
            experts > 0 and (i + 1) % step == 0 and i not in dense for i in range(num_layers)
        ),
    }


def _moe_deepseek(reader: ConfigReader, num_layers: int) -> dict:
    experts = reader.integer("n_routed_experts", "count", default=0)
    if not experts:
        return {}
    first_dense = reader.integer("first_k_dense_replace", "layer_number", default=0)
    frequency = reader.integer("moe_layer_freq", "period", default=1)
    moe_size = reader.integer("moe_intermediate_size", "width")
    shared = reader.integer("n_shared_experts", "count", default=0)
    return {
        "num_experts": experts,
        # DeepseekV2Config's default is None: the model can be built but not run.
        "num_experts_per_tok": _experts_per_token(reader, experts, default=None),
        "moe_intermediate_size": moe_size,
        "num_shared_experts": shared,
        "shared_expert_intermediate_size": moe_size * shared if shared else None,
        "moe_layers": tuple(i >= first_dense and i % frequency == 0 for i in range(num_layers)),
    }


def _moe_jamba(reader: ConfigReader, num_layers: int) -> dict:
    experts = reader.integer("num_experts", "experts")
    period = reader.integer("expert_layer_period", "period")
    offset = reader.integer("expert_layer_offset", "layer_number", high=period - 1)
    if experts == 1:  # one expert is a dense MLP in JambaConfig
        reader.integer("num_experts_per_tok", "experts")
        return {}
    pattern = tuple(i == offset for i in range(period))
    return {
        "num_experts": experts,
        "num_experts_per_tok": _experts_per_token(reader, experts),
        "moe_intermediate_size": reader.integer(INTERMEDIATE_KEYS, "width"),
        "moe_layers": (pattern * (num_layers // period + 1))[:num_layers],
    }


_MOE_RULES = {
    "mixtral": _moe_mixtral,
    "qwen3_moe": _moe_qwen3,
    "deepseek": _moe_deepseek,
    "jamba": _moe_jamba,
}

# -- hooks: the genuine special cases -----------------------------------------------------------


def _mla(reader: ConfigReader, fields: dict) -> None:
    """DeepSeek's multi-head latent attention (also for any config with `kv_lora_rank`)."""
    if reader.lookup("kv_lora_rank")[0] is None:
        return
    fields["kv_lora_rank"] = reader.integer("kv_lora_rank", "width")
    fields["q_lora_rank"] = reader.integer("q_lora_rank", "width", default=None, nullable=True)
    rope = fields["qk_rope_head_dim"] = reader.integer("qk_rope_head_dim", "width")
    nope = fields["qk_nope_head_dim"] = reader.integer("qk_nope_head_dim", "width")
    fields["value_head_dim"] = reader.integer("v_head_dim", "width")
    # The latent is expanded into one key/value head per query head.
    fields["num_key_value_heads"] = fields["num_attention_heads"]
    reader.found["num_key_value_heads"] = reader.found["num_attention_heads"]
    fields["head_dim"] = rope + nope
    # MLA's biases (with attention_bias) sit on q_a_proj (only with a query LoRA),
    # kv_a_proj_with_mqa and o_proj; q_b_proj, kv_b_proj and a plain q_proj have none.
    bias = fields["o_bias"]
    fields.update(q_bias=bias and fields["q_lora_rank"] is not None, k_bias=bias, v_bias=False)
    scale = (rope + nope) ** -0.5
    scaling = fields.get("rope_scaling") or {}
    mscale_all_dim, factor = scaling.get("mscale_all_dim") or 0, scaling.get("factor") or 1.0
    if mscale_all_dim and factor > 1:
        # YaRN: the softmax scale grows with mscale^2 (DeepSeek's yarn_get_mscale).
        mscale = 0.1 * mscale_all_dim * math.log(factor) + 1.0
        scale *= mscale * mscale
    fields["attention_scale"] = scale


def _gemma_scale_and_caps(reader: ConfigReader, fields: dict) -> None:
    """Gemma 2/3: softmax scale from `query_pre_attn_scalar`, logit soft caps."""
    scalar = fields["query_pre_attn_scalar"] = reader.number("query_pre_attn_scalar")
    if scalar is not None:
        fields["attention_scale"] = scalar**-0.5
    fields["attn_logit_softcapping"] = reader.number("attn_logit_softcapping")
    fields["final_logit_softcapping"] = reader.number("final_logit_softcapping")


def _gemma3_local_rope(reader: ConfigReader, fields: dict) -> None:
    """Gemma 3's sliding layers rotate with their own base (`rope_local_base_freq`, or
    transformers 5's `rope_parameters.sliding_attention`, already checked)."""
    local = (reader.config.get("rope_parameters") or {}).get("sliding_attention") or {}
    theta = local.get("rope_theta")
    fields["rope_local_theta"] = theta or reader.number("rope_local_base_freq")


def _jamba(reader: ConfigReader, fields: dict) -> None:
    """Jamba: attention every `attn_layer_period` layers, Mamba mixers in between."""
    num_layers, hidden = fields["num_hidden_layers"], fields["hidden_size"]
    kinds = _layer_types(reader, num_layers)
    if kinds is None:
        period = reader.integer("attn_layer_period", "period")
        offset = reader.integer("attn_layer_offset", "layer_number", high=period - 1)
        kinds = repeat_pattern(
            tuple("full" if i == offset else "none" for i in range(period)), num_layers
        )
    fields["layer_kinds"] = kinds
    expand = reader.integer("mamba_expand", "period")
    dt_key, dt_rank = reader.lookup("mamba_dt_rank")
    if dt_rank == "auto":
        dt_rank = math.ceil(hidden / 16)
    else:
        dt_rank = reader.check_integer(dt_key or "mamba_dt_rank", dt_rank, "width")
    fields["mamba"] = {  # `cards.spec.MambaSpec` fields
        "d_state": reader.integer("mamba_d_state", "width"),
        "d_conv": reader.integer("mamba_d_conv", "width"),
        "expand": expand,
        "dt_rank": dt_rank,
        "inner_size": expand * hidden,
        "conv_bias": reader.flag("mamba_conv_bias", True),
        "proj_bias": reader.flag("mamba_proj_bias", False),
        "inner_layernorms": True,
    }


def _gpt2(reader: ConfigReader, fields: dict) -> None:
    """GPT-2 and GPTBigCode: a learned position table, optional unscaled attention, MQA."""
    fields["learned_position_rows"] = reader.integer(
        ("n_positions", "max_position_embeddings"), "tokens", shape=True
    )
    if not reader.flag("scale_attn_weights", True):
        fields["attention_scale"] = 1.0
    if reader.model_type == "gpt_bigcode" and reader.flag("multi_query", True):
        fields["num_key_value_heads"] = 1


# Old remote-code Falcon model types and whether they had the new decoder architecture.
FALCON_ALIASES = {"RefinedWebModel": False, "RefinedWeb": True}


def _falcon(reader: ConfigReader, fields: dict) -> None:
    """Falcon: MQA (`multi_query`), or grouped KV heads with `new_decoder_architecture`."""
    heads = fields["num_attention_heads"]
    if reader.has("new_decoder_architecture") or reader.model_type not in FALCON_ALIASES:
        new_architecture = reader.flag("new_decoder_architecture", False)
    else:
        new_architecture = FALCON_ALIASES[reader.model_type]
    if new_architecture:
        kv_heads = reader.integer(
            ("num_kv_heads", "n_head_kv", "num_key_value_heads"),
            "heads",
            default=heads,
            name="num_key_value_heads",
        )
    else:
        kv_heads = 1 if reader.flag("multi_query", True) else heads
    fields["num_key_value_heads"] = kv_heads
    if reader.flag("parallel_attn", True):
        fields["norms_per_layer"] = reader.integer(
            "num_ln_in_parallel_attn", "count", low=1, high=2, default=2 if new_architecture else 1
        )
    if reader.flag("alibi", False):
        fields.update(position_embedding="alibi", rope_theta=None)


def _phi(reader: ConfigReader, fields: dict) -> None:
    """Phi-1/1.5/2: optional LayerNorms on queries and keys."""
    fields["qk_norm"] = "layer" if reader.flag("qk_layernorm", False) else None


def _opt(reader: ConfigReader, fields: dict) -> None:
    """OPT: positions start at row 2, an optional embedding projection, optional final norm."""
    fields["learned_position_rows"] = reader.integer(MAX_POSITION_KEYS, "tokens", shape=True) + 2
    fields["word_embed_proj_dim"] = reader.integer(
        "word_embed_proj_dim", "width", default=fields["hidden_size"]
    )
    fields["final_norms"] = 1 if reader.flag("do_layer_norm_before", True) else 0


def _bert(reader: ConfigReader, fields: dict) -> None:
    """BERT: absolute positions, token types, encoder-only unless `is_decoder`."""
    fields["learned_position_rows"] = reader.integer(MAX_POSITION_KEYS, "tokens", shape=True)
    fields["token_type_vocab_size"] = reader.integer("type_vocab_size", "count", default=0)
    position_type = reader.text("position_embedding_type", "absolute")
    if position_type != "absolute":
        fields["notes"].append(
            f"position_embedding_type={position_type!r} is counted as absolute positions"
        )


def _t5(reader: ConfigReader, fields: dict) -> None:
    """T5: `num_layers` encoder layers, `num_decoder_layers` decoder layers, gated or not."""
    fields.setdefault("head_dim", derived_head_dim(reader, fields))
    encoder_layers = fields["num_encoder_layers"] = fields["num_hidden_layers"]
    fields["num_hidden_layers"] = reader.integer(
        "num_decoder_layers", "layers", default=encoder_layers
    )
    projection = reader.text("feed_forward_proj", "relu")
    activation = projection.removeprefix("gated-")
    reader.require(
        bool(activation) and "-" not in activation,
        "feed_forward_proj",
        projection,
        "must be an activation name or 'gated-' and one (e.g. 'relu', 'gated-gelu')",
    )
    fields.update(
        mlp_kind="gated" if projection.startswith("gated-") else "plain",
        hidden_act=activation,
        relative_attention_num_buckets=reader.integer(
            "relative_attention_num_buckets", "count", low=1, default=None
        ),
        encoder_attention_heads=fields["num_attention_heads"],
        encoder_head_dim=fields["head_dim"],
        encoder_intermediate_size=fields["intermediate_size"],
    )


def _bart(reader: ConfigReader, fields: dict) -> None:
    """BART: separate encoder heads, layers and FFN size; learned positions from row 2.

    transformers' BartConfig aliases `num_attention_heads` and `num_hidden_layers` to the
    *encoder's* heads and layers; when a config holds both spellings the generic one wins.
    """
    hidden = fields["hidden_size"]
    heads = reader.integer(("num_attention_heads", "encoder_attention_heads"), "heads")
    reader.require(
        hidden % heads == 0,
        "encoder_attention_heads",
        heads,
        f"must divide the hidden size {hidden} (BART derives the head size from it)",
    )
    fields.update(
        learned_position_rows=reader.integer(MAX_POSITION_KEYS, "tokens", shape=True) + 2,
        num_encoder_layers=reader.integer(("num_hidden_layers", "encoder_layers"), "layers"),
        encoder_attention_heads=heads,
        encoder_head_dim=hidden // heads,
        encoder_intermediate_size=reader.integer("encoder_ffn_dim", "width", shape=True),
    )


def _dbrx(reader: ConfigReader, fields: dict) -> None:
    """DBRX: KV heads, RoPE and clipping in `attn_config`; the experts in `ffn_config`.

    Both objects are required, with the keys that decide the model's size: a config
    without them is malformed, not a config to read with DbrxConfig's defaults.
    """
    attention = reader.sub_config("attn_config", defaults=DBRX_ATTN_DEFAULTS)
    ffn = reader.sub_config("ffn_config")
    for name, sub in (("attn_config", attention), ("ffn_config", ffn)):
        reader.require(sub is not None, name, reader.config.get(name), "must be a JSON object")
    fields["num_key_value_heads"] = attention.integer(
        "kv_n_heads", "heads", name="num_key_value_heads"
    )
    reader.found["num_key_value_heads"] = "attn_config.kv_n_heads"
    experts = ffn.integer("moe_num_experts", "experts")
    size = ffn.integer("ffn_hidden_size", "width")
    fields.update(
        qkv_clip=attention.number("clip_qkv"),
        rope_theta=attention.number("rope_theta"),
        intermediate_size=size,
        num_experts=experts,
        num_experts_per_tok=ffn.integer("moe_top_k", "experts", high=experts),
        moe_intermediate_size=size,
        moe_layers=(True,) * fields["num_hidden_layers"],
    )


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
    "hooks": (_mla,),
}

FAMILIES: dict[str, Family] = {
    "llama": _llama_like(
        switches={**_ATTENTION_BIAS, "mlp_bias": ("mlp_bias",)}, window="ignored", hooks=(_mla,)
    ),
    "mistral": _llama_like(_NO_BIASES, switches={}),
    "mixtral": _llama_like(_NO_BIASES, switches={}, moe="mixtral"),
    "phi3": _llama_like(_NO_BIASES, switches={}),
    "qwen2": _llama_like(_QWEN_BIASES, switches={}, window="qwen"),
    "qwen3": _llama_like({"qk_norm": "rms"}, window="qwen"),
    "qwen3_moe": _llama_like({"qk_norm": "rms"}, window="qwen", moe="qwen3_moe"),
    "gemma": _llama_like(window="ignored"),
    "gemma2": _llama_like(_GEMMA2_TRAITS, window="alternate", hooks=(_gemma_scale_and_caps,)),
    "gemma3_text": _llama_like(
        {**_GEMMA2_TRAITS, "qk_norm": "rms"},
        window="pattern",
        hooks=(_gemma_scale_and_caps, _gemma3_local_rope),
    ),
    "deepseek_v2": _llama_like(**_MLA_FAMILY),
    "deepseek_v3": _llama_like(**{**_MLA_FAMILY, "switches": _ATTENTION_BIAS}),
    # Jamba's attention layers apply no position encoding: its Mamba layers carry the order.
    "jamba": _llama_like(
        {**_NO_BIASES, "position_embedding": "none"},
        switches={},
        window=None,
        moe="jamba",
        hooks=(_jamba,),
    ),
    "gpt2": Family(
        keys={**_COMMON_KEYS, "intermediate_size": ("n_inner",)},
        traits={**_CLASSIC_TRAITS, **_LEARNED_POSITIONS},
        ffn_factor=4,
        hooks=(_gpt2,),
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
        hooks=(_falcon,),
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
        hooks=(_phi,),
    ),
    "opt": Family(
        keys={**_COMMON_KEYS, "intermediate_size": ("ffn_dim",)},
        traits={**_CLASSIC_TRAITS, **_LEARNED_POSITIONS},
        switches={
            "enable_bias": (*_ALL_BIASES, "mlp_bias"),
            "layer_norm_elementwise_affine": ("norm_affine",),
        },
        hooks=(_opt,),
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
        hooks=(_bert,),
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
        hooks=(_t5,),
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
        hooks=(_bart,),
    ),
    "dbrx": Family(
        keys=_COMMON_KEYS,
        traits={**_LLAMA_TRAITS, "norm_type": "layer", "norm_bias": False},
        hooks=(_dbrx,),
    ),
    "generic": _llama_like(keys=_GENERIC_KEYS, moe="mixtral", hooks=(_mla,)),
}
FAMILIES["gpt_bigcode"] = FAMILIES["gpt2"]


__all__ = [
    "FALCON_ALIASES",
    "FAMILIES",
    "Family",
    "LAYER_TYPE_KINDS",
    "read_family",
    "repeat_pattern",
]
