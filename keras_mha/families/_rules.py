"""Config rules several families share: layer layouts, MoE layouts, RoPE objects, MLA.

`read_family` (in `_family.py`) reads what every family declares as data; what cannot be
a table entry and serves more than one family lives here, one small function per rule,
each reading through the same `ConfigReader` (so every value is validated the same
way): how `sliding_window`, `layer_types` and the Qwen/Gemma patterns lay out layer
kinds, how each MoE family places its experts, what a `rope_scaling` object may hold,
and multi-head latent attention (DeepSeek's, read for any config with `kv_lora_rank`).
A rule of one family only (Falcon's KV heads, GPT-2's positions, ...) is a hook in that
family's own module.

Example:
    >>> repeat_pattern(("sliding",) * 5 + ("full",), 8)
    ('sliding', 'sliding', 'sliding', 'sliding', 'sliding', 'full', 'sliding', 'sliding')
"""

from __future__ import annotations

import math
from collections.abc import Mapping

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


def derived_head_dim(reader, fields: dict) -> int:
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


def note_ignored_head_dim(reader, fields: dict) -> None:
    """A `head_dim` key that contradicts hidden / heads, in a family whose transformers
    class derives the head size and never reads it: noted, and the derived size used (the
    checkpoint's tensors have it), so the planner and `from_pretrained` agree."""
    stated = reader.config.get("head_dim")
    if stated is not None and stated != fields["head_dim"]:
        fields["notes"].append(
            f"{reader.where}head_dim={repr(stated)[:24]} is ignored: {reader.model_type} "
            f"models derive the head size as hidden_size / num_attention_heads = "
            f"{fields['head_dim']}, as transformers does"
        )


def rope_fields(reader, keys: Mapping[str, tuple[str, ...]]) -> dict:
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


def _rope_dict(reader, key: str, value: object) -> dict | None:
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


def explicit_layer_kinds(reader, num_layers: int) -> tuple[str, ...] | None:
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


def window_layer_kinds(reader, rule: str, fields: dict) -> tuple:
    """(layer kinds, sliding window) under the family's window `rule` (see `Family`)."""
    num_layers = fields["num_hidden_layers"]
    window = reader.integer(
        ("sliding_window", "sliding_window_size"), "tokens", default=None, nullable=True
    )
    explicit = explicit_layer_kinds(reader, num_layers)
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


def _experts_per_token(reader, experts: int | None) -> int:
    """`num_experts_per_tok`, required wherever there are MoE layers: without it no token
    can be routed (DeepseekV2Config defaults it to None; such a model cannot run)."""
    return reader.integer(
        "num_experts_per_tok", "experts", high=experts, name="num_experts_per_tok"
    )


def _moe_mixtral(reader, fields: dict) -> dict:
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


def _moe_qwen3(reader, fields: dict) -> dict:
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


def _moe_deepseek(reader, fields: dict) -> dict:
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


def _moe_jamba(reader, fields: dict) -> dict:
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

# -- multi-head latent attention ----------------------------------------------------------------


def mla(reader, fields: dict) -> None:
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


__all__ = [
    "LAYER_TYPE_KINDS",
    "explicit_layer_kinds",
    "mla",
    "MOE_RULES",
    "derived_head_dim",
    "note_ignored_head_dim",
    "repeat_pattern",
    "rope_fields",
    "window_layer_kinds",
]
