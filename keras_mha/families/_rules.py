"""The special cases behind the family table: layer layouts, MoE layouts, RoPE objects, hooks.

`keras_mha.cards.families` reads what every family shares declaratively; what cannot
be a table entry lives here, one small function per rule, each reading through the same
`ConfigReader` (so every value is validated the same way): how `sliding_window`,
`layer_types` and the Qwen/Gemma patterns lay out layer kinds, how each MoE family
places its experts, what a `rope_scaling` object may hold, and the per-family hooks
(Falcon's KV heads, MLA, Gemma's scale and soft caps, Jamba's period and Mamba mixers,
GPT-2/OPT/BERT positions, T5/BART encoders, DBRX's nested objects).

Example:
    >>> repeat_pattern(("sliding",) * 5 + ("full",), 8)
    ('sliding', 'sliding', 'sliding', 'sliding', 'sliding', 'full', 'sliding', 'sliding')
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from keras_mha.cards.config_values import ConfigReader
from keras_mha.cards.family_defaults import DBRX_ATTN_DEFAULTS

# `typing` costs ~5 ms to import, a tenth of `inspect`'s budget; `Any` only annotates.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

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


def rope_fields(reader: ConfigReader, keys: Mapping[str, tuple[str, ...]]) -> dict:
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


def window_layer_kinds(reader: ConfigReader, rule: str, fields: dict) -> tuple:
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


def _experts_per_token(reader: ConfigReader, experts: int | None) -> int:
    """`num_experts_per_tok`, required wherever there are MoE layers: without it no token
    can be routed (DeepseekV2Config defaults it to None; such a model cannot run)."""
    return reader.integer(
        "num_experts_per_tok", "experts", high=experts, name="num_experts_per_tok"
    )


def _moe_mixtral(reader: ConfigReader, fields: dict) -> dict:
    num_layers = fields["num_hidden_layers"]
    experts = reader.integer("num_local_experts", "experts", default=None)
    if experts is None:  # a generic config without experts
        return {}
    return {
        "num_experts": experts,
        "num_experts_per_tok": _experts_per_token(reader, experts),
        "moe_intermediate_size": fields["intermediate_size"],
        "moe_layers": (True,) * num_layers,
    }


def _moe_qwen3(reader: ConfigReader, fields: dict) -> dict:
    num_layers = fields["num_hidden_layers"]
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


def _moe_deepseek(reader: ConfigReader, fields: dict) -> dict:
    num_layers = fields["num_hidden_layers"]
    experts = reader.integer("n_routed_experts", "count", default=0)
    if not experts:
        return {}
    first_dense = reader.integer("first_k_dense_replace", "layer_number", default=0)
    frequency = reader.integer("moe_layer_freq", "period", default=1)
    moe_size = reader.integer("moe_intermediate_size", "width")
    shared = reader.integer("n_shared_experts", "count", default=0)
    return {
        "num_experts": experts,
        "num_experts_per_tok": _experts_per_token(reader, experts),
        "moe_intermediate_size": moe_size,
        "num_shared_experts": shared,
        "shared_expert_intermediate_size": moe_size * shared if shared else None,
        "moe_layers": tuple(i >= first_dense and i % frequency == 0 for i in range(num_layers)),
    }


def _moe_jamba(reader: ConfigReader, fields: dict) -> dict:
    num_layers = fields["num_hidden_layers"]
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
        "moe_intermediate_size": fields["intermediate_size"],
        "moe_layers": (pattern * (num_layers // period + 1))[:num_layers],
    }


MOE_RULES = {
    "mixtral": _moe_mixtral,
    "qwen3_moe": _moe_qwen3,
    "deepseek": _moe_deepseek,
    "jamba": _moe_jamba,
}

# -- hooks: the genuine special cases -----------------------------------------------------------


def mla(reader: ConfigReader, fields: dict) -> None:
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


def gemma_scale_and_caps(reader: ConfigReader, fields: dict) -> None:
    """Gemma 2/3: softmax scale from `query_pre_attn_scalar`, logit soft caps."""
    scalar = fields["query_pre_attn_scalar"] = reader.number("query_pre_attn_scalar")
    if scalar is not None:
        fields["attention_scale"] = scalar**-0.5
    fields["attn_logit_softcapping"] = reader.number("attn_logit_softcapping")
    fields["final_logit_softcapping"] = reader.number("final_logit_softcapping")


def gemma3_local_rope(reader: ConfigReader, fields: dict) -> None:
    """Gemma 3's sliding layers rotate with their own base (`rope_local_base_freq`, or
    transformers 5's `rope_parameters.sliding_attention`, already checked)."""
    local = (reader.config.get("rope_parameters") or {}).get("sliding_attention") or {}
    theta = local.get("rope_theta")
    fields["rope_local_theta"] = theta or reader.number("rope_local_base_freq")


def jamba(reader: ConfigReader, fields: dict) -> None:
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


def gpt2(reader: ConfigReader, fields: dict) -> None:
    """GPT-2 and GPTBigCode: a learned position table, optional unscaled attention, MQA."""
    fields["learned_position_rows"] = fields["max_position_embeddings"]
    if not reader.flag("scale_attn_weights", True):
        fields["attention_scale"] = 1.0
    if reader.model_type == "gpt_bigcode" and reader.flag("multi_query", True):
        fields["num_key_value_heads"] = 1


# Old remote-code Falcon model types and whether they had the new decoder architecture.
FALCON_ALIASES = {"RefinedWebModel": False, "RefinedWeb": True}


def falcon(reader: ConfigReader, fields: dict) -> None:
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


def phi(reader: ConfigReader, fields: dict) -> None:
    """Phi-1/1.5/2: optional LayerNorms on queries and keys."""
    fields["qk_norm"] = "layer" if reader.flag("qk_layernorm", False) else None


def opt(reader: ConfigReader, fields: dict) -> None:
    """OPT: positions start at row 2, an optional embedding projection, optional final norm."""
    fields["learned_position_rows"] = fields["max_position_embeddings"] + 2
    fields["word_embed_proj_dim"] = reader.integer(
        "word_embed_proj_dim", "width", default=fields["hidden_size"]
    )
    fields["final_norms"] = 1 if reader.flag("do_layer_norm_before", True) else 0


def bert(reader: ConfigReader, fields: dict) -> None:
    """BERT: absolute positions, token types, encoder-only unless `is_decoder`."""
    fields["learned_position_rows"] = fields["max_position_embeddings"]
    fields["token_type_vocab_size"] = reader.integer("type_vocab_size", "count", default=0)
    position_type = reader.text("position_embedding_type", "absolute")
    if position_type != "absolute":
        fields["notes"].append(
            f"position_embedding_type={position_type!r} is counted as absolute positions"
        )


def t5(reader: ConfigReader, fields: dict) -> None:
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


def bart(reader: ConfigReader, fields: dict) -> None:
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
        learned_position_rows=fields["max_position_embeddings"] + 2,
        num_encoder_layers=reader.integer(("num_hidden_layers", "encoder_layers"), "layers"),
        encoder_attention_heads=heads,
        encoder_head_dim=hidden // heads,
        encoder_intermediate_size=reader.integer("encoder_ffn_dim", "width", shape=True),
    )


def dbrx(reader: ConfigReader, fields: dict) -> None:
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


__all__ = [
    "FALCON_ALIASES",
    "LAYER_TYPE_KINDS",
    "MOE_RULES",
    "derived_head_dim",
    "repeat_pattern",
    "rope_fields",
    "window_layer_kinds",
]
