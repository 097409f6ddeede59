"""Normalise a Hugging Face Hub `config.json` into a `ModelSpec`.

Every family spells the same idea differently (`num_attention_heads`, `n_head`,
`num_heads`, `n_heads`; `hidden_size`, `n_embd`, `d_model`; Falcon's `multi_query`,
DBRX's `attn_config.kv_n_heads`, ...). `from_config` reads the raw dict, never
transformers, and returns one frozen `ModelSpec` with the same names for every
family: head counts, head size, which layers hold full, sliding-window or no
attention, MLA ranks, MoE sizes, biases, norms, RoPE and soft caps. The cost model
(`keras_mha.cards.costs`) and the layer rebuilder read only this dataclass.

When a known family's config leaves a key out, the value transformers' config class
would use is taken (Gemma 3's multimodal configs, for one, omit the head counts of
their `text_config`); when that key describes the model's shape, the spec says so in
`warnings`. An unknown `model_type` is read through the generic spellings with a
`UserWarning`; a key that no spelling provides raises `ConfigError` naming the keys
looked for and the model type.

Only the standard library is imported, so `keras-mha inspect` starts fast.

Example:
    >>> from keras_mha.cards.spec import from_config
    >>> spec = from_config({
    ...     "model_type": "llama", "architectures": ["LlamaForCausalLM"],
    ...     "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
    ...     "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 128256,
    ... })
    >>> spec.attention_kind, spec.head_dim, spec.layer_kind_counts()
    ('GQA', 128, {'full': 32, 'sliding': 0, 'none': 0})
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from keras_mha.cards.errors import ConfigError
from keras_mha.cards.family_defaults import (
    DBRX_ATTN_DEFAULTS,
    DBRX_FFN_DEFAULTS,
    FAMILY_DEFAULTS,
)

LAYER_KINDS = ("full", "sliding", "none")
ATTENTION_KINDS = ("MHA", "GQA", "MQA", "MLA")

# Spellings of the same idea across families, in the order they are tried.
HEADS_KEYS = (
    "num_attention_heads",
    "n_head",
    "num_heads",
    "n_heads",
    "decoder_attention_heads",
    "encoder_attention_heads",
)
KV_HEADS_KEYS = ("num_key_value_heads", "num_kv_heads", "n_head_kv")
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")
LAYERS_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers")
VOCAB_KEYS = ("vocab_size", "padded_vocab_size")
HEAD_DIM_KEYS = ("head_dim", "d_kv")
INTERMEDIATE_KEYS = (
    "intermediate_size",
    "n_inner",
    "ffn_dim",
    "d_ff",
    "ffn_hidden_size",
    "decoder_ffn_dim",
)
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

# Multimodal wrappers whose `text_config` holds the language model, and the model type a
# `text_config` without its own `model_type` has.
_TEXT_MODEL_TYPE_OF_WRAPPER = {"gemma3": "gemma3_text"}
# Old Falcon checkpoints (remote code) used these model types.
_FALCON_ALIASES = {"RefinedWebModel": False, "RefinedWeb": True}

# Families whose blocks are "pre-norm attention + gated MLP" (Llama and its descendants).
_LLAMA_LIKE = frozenset(
    {
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "gemma",
        "gemma2",
        "gemma3_text",
        "phi3",
        "deepseek_v2",
        "deepseek_v3",
        "jamba",
    }
)
KNOWN_MODEL_TYPES = frozenset(FAMILY_DEFAULTS) - {"siglip_vision_model"} | {
    "gemma3",
    *_FALCON_ALIASES,
}

# `layer_types` strings (transformers' convention) -> the three kinds used here.
_LAYER_TYPE_KINDS = {
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


@dataclass(frozen=True)
class VisionSpec:
    """The vision tower of a multimodal model (SigLIP-style ViT) and its projector.

    Only what the parameter count needs: the language model is described by `ModelSpec`.

    Example:
        >>> VisionSpec(model_type="siglip_vision_model", hidden_size=1152,
        ...            intermediate_size=4304, num_layers=27, num_attention_heads=16,
        ...            num_channels=3, image_size=896, patch_size=14, use_head=False,
        ...            projector="gemma3").num_patches
        4096
    """

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_channels: int
    image_size: int
    patch_size: int
    use_head: bool
    projector: str

    @property
    def num_patches(self) -> int:
        """Number of patch positions (rows of the position embedding)."""
        return (self.image_size // self.patch_size) ** 2


@dataclass(frozen=True)
class MambaSpec:
    """Sizes of the Mamba mixer that hybrid models (Jamba) use in layers without attention.

    Example:
        >>> MambaSpec(d_state=16, d_conv=4, expand=2, dt_rank=256, inner_size=8192,
        ...           conv_bias=True, proj_bias=False, inner_layernorms=True).inner_size
        8192
    """

    d_state: int
    d_conv: int
    expand: int
    dt_rank: int
    inner_size: int
    conv_bias: bool
    proj_bias: bool
    inner_layernorms: bool


@dataclass(frozen=True)
class AttentionLayerSpec:
    """Everything needed to build one attention layer of a model (see `ModelSpec.attention_layer`).

    Example:
        >>> spec = from_config({"model_type": "mistral", "hidden_size": 4096,
        ...     "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 2,
        ...     "intermediate_size": 14336, "vocab_size": 32000, "sliding_window": 4096})
        >>> layer = spec.attention_layer(0)
        >>> layer.kind, layer.sliding_window, layer.num_key_value_heads
        ('sliding', 4096, 8)
    """

    layer_index: int
    kind: str
    hidden_size: int
    num_heads: int
    num_key_value_heads: int
    head_dim: int
    value_head_dim: int
    sliding_window: int | None
    use_rope: bool
    rope_theta: float | None
    partial_rotary_factor: float
    rope_scaling: Mapping[str, Any] | None
    q_bias: bool
    k_bias: bool
    v_bias: bool
    o_bias: bool
    qk_norm: str | None
    norm_eps: float | None
    logit_soft_cap: float | None
    scale: float
    causal: bool
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None


@dataclass(frozen=True)
class ModelSpec:
    """A Hub model described with one vocabulary for every family.

    The first fields are the stable public ones (see DESIGN.md); the rest give the
    cost model and the layer rebuilder the detail they need.

    Attributes:
        model_type: `model_type` of the config (the wrapper's for multimodal configs).
        architecture: `architectures[0]`, or None when the config names none.
        attention_kind: "MHA", "GQA", "MQA" or "MLA".
        num_layers: layers that hold attention (decoder stack of an encoder-decoder).
        num_hidden_layers: all layers of that stack, with and without attention.
        num_attention_heads, num_key_value_heads, head_dim: of the attention layers.
            For MLA, `num_key_value_heads` equals the query heads (the heads the latent
            is expanded into) and `head_dim` is the query/key head size
            (`qk_nope_head_dim + qk_rope_head_dim`); `value_head_dim` is `v_head_dim`.
        hidden_size, vocab_size: of the language model.
        sliding_window: the window of the sliding layers, None when there are none.
        layer_kinds: one of "full", "sliding", "none" per layer of the stack.
        is_encoder_decoder: T5, BART, ...; the encoder is described by `num_encoder_layers`,
            `encoder_attention_heads` and `encoder_intermediate_size`.
        warnings: what the reader had to guess or could not use.
        raw: the config exactly as given.

    Example:
        >>> spec = from_config({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
        ...     "n_embd": 768, "n_head": 12, "n_layer": 12, "vocab_size": 50257})
        >>> spec.num_layers, spec.attention_kind, spec.position_embedding
        (12, 'MHA', 'learned')
    """

    model_type: str
    architecture: str | None
    attention_kind: str
    num_layers: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    sliding_window: int | None
    layer_kinds: tuple[str, ...]
    is_encoder_decoder: bool
    warnings: tuple[str, ...]
    raw: dict = field(compare=False, repr=False)

    # -- identity and head ---------------------------------------------------------------------
    model_id: str | None = None
    text_model_type: str | None = None
    family: str = "generic"
    head_kind: str = "causal_lm"
    is_decoder: bool = True
    tie_word_embeddings: bool = False
    lm_head_bias: bool = False
    pooler: bool = False

    # -- attention -----------------------------------------------------------------------------
    value_head_dim: int = 0
    q_bias: bool = False
    k_bias: bool = False
    v_bias: bool = False
    o_bias: bool = False
    qk_norm: str | None = None
    attention_scale: float = 1.0
    query_pre_attn_scalar: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    qkv_clip: float | None = None
    relative_attention_num_buckets: int | None = None
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None

    # -- positions -----------------------------------------------------------------------------
    position_embedding: str = "rope"  # "rope" | "learned" | "alibi" | "relative" | "none"
    max_position_embeddings: int | None = None
    learned_position_rows: int = 0
    learned_position_tables: int = 0
    token_type_vocab_size: int = 0
    rope_theta: float | None = None
    rope_local_theta: float | None = None
    partial_rotary_factor: float = 1.0
    rope_scaling: Mapping[str, Any] | None = None

    # -- feed-forward --------------------------------------------------------------------------
    intermediate_size: int = 0
    mlp_kind: str = "gated"
    mlp_bias: bool = False
    hidden_act: str | None = None
    num_experts: int | None = None
    num_experts_per_tok: int | None = None
    moe_intermediate_size: int | None = None
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int | None = None
    moe_layers: tuple[bool, ...] = ()

    # -- norms and embeddings --------------------------------------------------------------------
    norm_type: str = "rms"
    norm_bias: bool = False
    norm_affine: bool = True
    norm_eps: float | None = None
    norms_per_layer: int = 2
    final_norms: int = 1
    embedding_norms: int = 0
    word_embed_proj_dim: int | None = None

    # -- encoder of an encoder-decoder --------------------------------------------------------
    num_encoder_layers: int = 0
    encoder_attention_heads: int = 0
    encoder_head_dim: int = 0
    encoder_intermediate_size: int = 0
    encoder_norms_per_layer: int = 0

    # -- other blocks --------------------------------------------------------------------------
    mamba: MambaSpec | None = None
    vision: VisionSpec | None = None

    def layer_kind_counts(self) -> dict[str, int]:
        """How many layers are "full", "sliding" and "none" (always all three keys).

        Example:
            >>> spec = from_config({"model_type": "gemma2", "hidden_size": 64,
            ...     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            ...     "num_hidden_layers": 4, "intermediate_size": 128, "vocab_size": 100})
            >>> spec.layer_kind_counts()
            {'full': 2, 'sliding': 2, 'none': 0}
        """
        return {kind: self.layer_kinds.count(kind) for kind in LAYER_KINDS}

    @property
    def attention_layer_indices(self) -> tuple[int, ...]:
        """Indices of the layers that hold attention.

        Example:
            >>> spec = from_config({"model_type": "jamba", "num_hidden_layers": 16})
            >>> spec.attention_layer_indices
            (4, 12)
        """
        return tuple(i for i, kind in enumerate(self.layer_kinds) if kind != "none")

    @property
    def qk_head_dim(self) -> int:
        """Size of one query/key head (for MLA: `qk_nope_head_dim + qk_rope_head_dim`)."""
        return self.head_dim

    def attention_layer(self, layer_index: int = 0) -> AttentionLayerSpec:
        """The attention configuration of one layer, for rebuilding it.

        Args:
            layer_index: index into `layer_kinds`; the layer must hold attention.

        Raises:
            ValueError: the index is out of range or the layer has no attention.

        Example:
            >>> spec = from_config({"model_type": "gemma3_text", "num_hidden_layers": 6})
            >>> spec.attention_layer(0).rope_theta, spec.attention_layer(5).rope_theta
            (10000.0, 1000000.0)
        """
        if not isinstance(layer_index, int) or not 0 <= layer_index < len(self.layer_kinds):
            raise ValueError(
                f"layer_index={layer_index!r} must be an integer in [0, {len(self.layer_kinds)})"
            )
        kind = self.layer_kinds[layer_index]
        if kind == "none":
            raise ValueError(
                f"layer_index={layer_index} holds no attention in this {self.model_type} model; "
                f"attention layers are {list(self.attention_layer_indices)}"
            )
        sliding = kind == "sliding"
        rope_theta = self.rope_theta
        rope_scaling = self.rope_scaling
        if sliding and self.rope_local_theta is not None:
            # Gemma 3: sliding layers rotate with their own base and without scaling.
            rope_theta, rope_scaling = self.rope_local_theta, None
        return AttentionLayerSpec(
            layer_index=layer_index,
            kind=kind,
            hidden_size=self.hidden_size,
            num_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            value_head_dim=self.value_head_dim,
            sliding_window=self.sliding_window if sliding else None,
            use_rope=self.position_embedding == "rope",
            rope_theta=rope_theta if self.position_embedding == "rope" else None,
            partial_rotary_factor=self.partial_rotary_factor,
            rope_scaling=rope_scaling,
            q_bias=self.q_bias,
            k_bias=self.k_bias,
            v_bias=self.v_bias,
            o_bias=self.o_bias,
            qk_norm=self.qk_norm,
            norm_eps=self.norm_eps,
            logit_soft_cap=self.attn_logit_softcapping,
            scale=self.attention_scale,
            causal=self.is_decoder,
            kv_lora_rank=self.kv_lora_rank,
            q_lora_rank=self.q_lora_rank,
            qk_rope_head_dim=self.qk_rope_head_dim,
            qk_nope_head_dim=self.qk_nope_head_dim,
        )


# -- reading the raw dict ---------------------------------------------------------------------

_MISSING = object()


class _Reader:
    """Reads one (sub-)config: first the dict itself, then the family's defaults.

    `where` prefixes key names in messages (e.g. "text_config.") so that errors point at
    the right place.
    """

    def __init__(self, config: Mapping, model_type: str, defaults: Mapping, where: str = ""):
        self.config = config
        self.model_type = model_type
        self.defaults = defaults
        self.where = where
        self.notes: list[str] = []

    def has(self, key: str) -> bool:
        return key in self.config

    def get(self, key: str, default: Any = None) -> Any:
        """The config's value (None included), else the family default, else `default`."""
        if key in self.config:
            return self.config[key]
        return self.defaults.get(key, default)

    def first(self, keys: Sequence[str], *, shape: bool = False) -> tuple[str | None, Any]:
        """(key, value) of the first key holding a non-null value, config first, defaults next.

        With `shape=True` a value taken from the family defaults is noted as a warning.
        """
        for key in keys:
            value = self.config.get(key)
            if value is not None:
                return key, value
        for key in keys:
            value = self.defaults.get(key)
            if value is not None:
                if shape:
                    self.notes.append(
                        f"{self.where}{key} is not in the config; used the {self.model_type} "
                        f"default {value!r}, as transformers does"
                    )
                return key, value
        return None, None

    def require_int(self, keys: Sequence[str], *, what: str, minimum: int = 1) -> int:
        key, value = self.first(keys, shape=True)
        if key is None:
            looked_for = ", ".join(f"{self.where}{k}" for k in keys)
            raise ConfigError(
                f"config.json (model_type={self.model_type!r}) has no {what}: looked for "
                f"{looked_for}"
            )
        return self.as_int(key, value, minimum=minimum)

    def optional_int(self, keys: Sequence[str], *, minimum: int = 1) -> int | None:
        key, value = self.first(keys)
        return None if key is None else self.as_int(key, value, minimum=minimum)

    def as_int(self, key: str, value: Any, *, minimum: int = 1) -> int:
        if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
            raise ConfigError(
                f"{self.where}{key}={value!r} in config.json (model_type={self.model_type!r}) "
                f"must be an integer"
            )
        if int(value) < minimum:
            raise ConfigError(
                f"{self.where}{key}={value!r} in config.json (model_type={self.model_type!r}) "
                f"must be >= {minimum}"
            )
        return int(value)

    def as_float(self, key: str, default: float | None = None) -> float | None:
        value = self.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(
                f"{self.where}{key}={value!r} in config.json (model_type={self.model_type!r}) "
                f"must be a number"
            )
        return float(value)

    def as_bool(self, key: str, default: bool = False) -> bool:
        value = self.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(
                f"{self.where}{key}={value!r} in config.json (model_type={self.model_type!r}) "
                f"must be true or false"
            )
        return value


def from_config(config: Mapping[str, Any], *, model_id: str | None = None) -> ModelSpec:
    """Normalise a Hub `config.json` (as a dict) into a `ModelSpec`.

    Args:
        config: the parsed `config.json`.
        model_id: the Hub id or path it came from (only recorded, never fetched).

    Returns:
        The frozen `ModelSpec`.

    Raises:
        ConfigError: the config is not a JSON object, lacks a key that no spelling
            provides, or holds a value of the wrong type (the message names the keys
            looked for and the model type).

    Example:
        >>> spec = from_config({"model_type": "falcon", "architectures": ["FalconForCausalLM"],
        ...     "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 32,
        ...     "multi_query": True, "new_decoder_architecture": False, "vocab_size": 65024})
        >>> spec.attention_kind, spec.num_key_value_heads, spec.head_dim
        ('MQA', 1, 64)
    """
    if not isinstance(config, Mapping):
        raise ConfigError(
            f"config must be a JSON object (a dict), got {type(config).__name__}: {config!r:.80}"
        )
    # A deep copy: the spec is frozen, so later edits of the caller's dict must not reach it.
    raw = copy.deepcopy(dict(config))
    model_type = raw.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ConfigError(f"model_type={model_type!r} in config.json must be a string")
    model_type = model_type or ""
    architecture = _architecture(raw)
    spec_warnings: list[str] = []

    # Multimodal wrappers keep the language model in `text_config`.
    text_config: Mapping = raw
    text_model_type = model_type
    where = ""
    vision = None
    if isinstance(raw.get("text_config"), Mapping):
        text_config = raw["text_config"]
        text_model_type = text_config.get("model_type") or _TEXT_MODEL_TYPE_OF_WRAPPER.get(
            model_type, model_type
        )
        where = "text_config."

    family = _family_of(text_model_type)
    if family == "generic":
        shown = text_model_type or "(none)"
        message = (
            f"model_type={shown!r} is not a family keras-mha knows; read with the generic "
            f"config keys, so the counts may be approximate"
        )
        warnings.warn(message, UserWarning, stacklevel=2)
        spec_warnings.append(message)
    defaults = FAMILY_DEFAULTS.get(family, {})
    reader = _Reader(text_config, text_model_type or model_type, defaults, where)

    fields = _READERS.get(family, _read_llama_like)(reader, family)
    fields.update(_head_fields(architecture, family, spec_warnings))
    if isinstance(raw.get("vision_config"), Mapping):
        vision = _read_vision(raw["vision_config"], model_type)
        if vision is None:
            spec_warnings.append(
                f"vision_config.model_type={raw['vision_config'].get('model_type')!r} is not "
                f"read; its parameters are not counted"
            )
    if where:
        # The wrapper decides tying for the whole model (Gemma3Config.tie_word_embeddings).
        tie = raw.get("tie_word_embeddings", fields["tie_word_embeddings"])
        fields["tie_word_embeddings"] = bool(tie)

    fields.setdefault("is_encoder_decoder", False)
    layer_kinds = fields.pop("layer_kinds")
    num_hidden_layers = len(layer_kinds)
    heads, kv_heads = fields["num_attention_heads"], fields["num_key_value_heads"]
    attention_kind = _attention_kind(heads, kv_heads, fields.get("kv_lora_rank"))
    spec_warnings.extend(reader.notes)
    spec_warnings.extend(fields.pop("notes", ()))
    sliding_window = fields.pop("sliding_window") if "sliding" in layer_kinds else None
    fields.pop("sliding_window", None)
    return ModelSpec(
        model_type=model_type or text_model_type,
        architecture=architecture,
        attention_kind=attention_kind,
        num_layers=sum(kind != "none" for kind in layer_kinds),
        num_hidden_layers=num_hidden_layers,
        sliding_window=sliding_window,
        layer_kinds=layer_kinds,
        warnings=tuple(spec_warnings),
        raw=raw,
        model_id=model_id,
        text_model_type=text_model_type if where else None,
        family=family,
        vision=vision,
        **fields,
    )


def _architecture(raw: Mapping) -> str | None:
    architectures = raw.get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        return architectures[0]
    return None


def _family_of(model_type: str) -> str:
    if model_type in _FALCON_ALIASES:
        return "falcon"
    if model_type in FAMILY_DEFAULTS and model_type != "siglip_vision_model":
        return model_type
    return "generic"


def _attention_kind(heads: int, kv_heads: int, kv_lora_rank: int | None) -> str:
    if kv_lora_rank:
        return "MLA"
    if kv_heads == heads:
        return "MHA"
    if kv_heads == 1:
        return "MQA"
    return "GQA"


def _check_heads(reader: _Reader, heads: int, kv_heads: int) -> None:
    if heads % kv_heads:
        raise ConfigError(
            f"{reader.where}num_key_value_heads={kv_heads} must divide "
            f"num_attention_heads={heads} (model_type={reader.model_type!r})"
        )


def _head_dim(reader: _Reader, hidden: int, heads: int) -> int:
    key, explicit = reader.first(HEAD_DIM_KEYS, shape=True)
    if explicit is not None:
        return reader.as_int(key, explicit)
    if hidden % heads:
        raise ConfigError(
            f"{reader.where}hidden_size={hidden} is not divisible by num_attention_heads={heads} "
            f"and config.json has no head_dim (model_type={reader.model_type!r})"
        )
    return hidden // heads


def _rope_fields(reader: _Reader, theta_keys: Sequence[str] = ("rope_theta",)) -> dict:
    """RoPE base, partial rotary factor and scaling (`rope_scaling` or `rope_parameters`)."""
    scaling = reader.get("rope_scaling")
    parameters = reader.get("rope_parameters")
    theta = None
    for key in theta_keys:
        if reader.get(key) is not None:
            theta = reader.as_float(key)
            break
    factor = 1.0
    for key in ("partial_rotary_factor", "rotary_pct"):
        if reader.get(key) is not None:
            factor = reader.as_float(key)
            break
    if isinstance(parameters, Mapping):
        # transformers >= 5 writes `rope_parameters` (one dict, or one per layer type).
        flat = parameters.get("full_attention", parameters)
        if isinstance(flat, Mapping):
            theta = float(flat.get("rope_theta", theta)) if flat.get("rope_theta") else theta
            factor = float(flat.get("partial_rotary_factor", factor))
            if scaling is None and flat.get("rope_type", "default") != "default":
                scaling = {k: v for k, v in flat.items() if k != "rope_theta"}
    if scaling is not None and not isinstance(scaling, Mapping):
        raise ConfigError(
            f"{reader.where}rope_scaling={scaling!r} (model_type={reader.model_type!r}) "
            f"must be an object or null"
        )
    return {
        "rope_theta": theta,
        "partial_rotary_factor": factor,
        "rope_scaling": dict(scaling) if scaling else None,
    }


def _common_fields(reader: _Reader) -> dict:
    _, eps = reader.first(NORM_EPS_KEYS)
    _, act = reader.first(ACTIVATION_KEYS)
    return {
        "vocab_size": reader.require_int(VOCAB_KEYS, what="vocabulary size"),
        "max_position_embeddings": reader.optional_int(MAX_POSITION_KEYS),
        "norm_eps": float(eps) if isinstance(eps, int | float) else None,
        "hidden_act": act if isinstance(act, str) else None,
        "tie_word_embeddings": reader.as_bool("tie_word_embeddings", True),
    }


def _layer_types_kinds(reader: _Reader, num_layers: int) -> tuple[str, ...] | None:
    """Kinds from an explicit `layer_types` list, or None when the config has none."""
    layer_types = reader.config.get("layer_types")
    if layer_types is None:
        return None
    if not isinstance(layer_types, list) or len(layer_types) != num_layers:
        raise ConfigError(
            f"{reader.where}layer_types must list one entry per layer ({num_layers}), got "
            f"{layer_types!r:.120} (model_type={reader.model_type!r})"
        )
    kinds = []
    for index, layer_type in enumerate(layer_types):
        kind = _LAYER_TYPE_KINDS.get(layer_type)
        if kind is None:
            reader.notes.append(
                f"{reader.where}layer_types[{index}]={layer_type!r} is not a known layer type; "
                f"counted as full attention"
            )
            kind = "full"
        kinds.append(kind)
    return tuple(kinds)


def _sliding_window_value(reader: _Reader, keys: Sequence[str] = ("sliding_window",)) -> Any:
    for key in keys:
        if reader.get(key) is not None:
            return reader.as_int(key, reader.get(key))
    return None


def _llama_like_layer_kinds(reader: _Reader, family: str, num_layers: int) -> tuple:
    """(layer kinds, sliding window) for the Llama-like families."""
    window = _sliding_window_value(reader, ("sliding_window", "sliding_window_size"))
    explicit = _layer_types_kinds(reader, num_layers)
    if family in ("qwen2", "qwen3", "qwen3_moe") and not reader.as_bool("use_sliding_window"):
        # Qwen ships `sliding_window` in configs that do not use it (use_sliding_window=false).
        window = None
    if explicit is not None:
        if "sliding" in explicit and window is None:
            raise ConfigError(
                f"{reader.where}layer_types lists sliding layers but sliding_window is not set "
                f"(model_type={reader.model_type!r})"
            )
        return explicit, window
    if window is None:
        return ("full",) * num_layers, None
    if family in ("qwen2", "qwen3"):
        # Layers from `max_window_layers` on use the window (transformers' Qwen2Config).
        first = reader.as_int("max_window_layers", reader.get("max_window_layers"), minimum=0)
        return tuple("sliding" if i >= first else "full" for i in range(num_layers)), window
    if family == "gemma2":
        # Even layers slide, odd layers see everything.
        return tuple("sliding" if (i + 1) % 2 else "full" for i in range(num_layers)), window
    if family == "gemma3_text":
        pattern = reader.as_int("sliding_window_pattern", reader.get("sliding_window_pattern"))
        return tuple("sliding" if (i + 1) % pattern else "full" for i in range(num_layers)), window
    if family in ("llama", "gemma", "deepseek_v2", "deepseek_v3", "jamba"):
        reader.notes.append(
            f"{reader.where}sliding_window={window} is ignored: {family} models attend to the "
            f"whole sequence in transformers"
        )
        return ("full",) * num_layers, None
    return ("sliding",) * num_layers, window


def _read_llama_like(reader: _Reader, family: str) -> dict:
    """Llama and the families built like it (Mistral, Qwen, Gemma, Phi-3, DeepSeek, Jamba)."""
    hidden = reader.require_int(HIDDEN_KEYS, what="hidden size")
    heads = reader.require_int(HEADS_KEYS, what="number of attention heads")
    num_layers = reader.require_int(LAYERS_KEYS, what="number of layers")
    fields = _common_fields(reader)
    fields["tie_word_embeddings"] = reader.as_bool(
        "tie_word_embeddings", family in ("gemma", "gemma2", "gemma3_text", "generic")
    )
    kv_key, kv_heads = reader.first(KV_HEADS_KEYS, shape=True)
    kv_heads = heads if kv_heads is None else reader.as_int(kv_key, kv_heads)
    fields["intermediate_size"] = reader.require_int(
        INTERMEDIATE_KEYS, what="feed-forward size (intermediate_size)"
    )
    fields.update(_rope_fields(reader))

    attention_bias = reader.as_bool("attention_bias", False)
    q_bias = k_bias = v_bias = o_bias = attention_bias
    if family == "qwen2":
        # Qwen2 hard-codes biases on the q/k/v projections and none on o_proj.
        q_bias = k_bias = v_bias = True
        o_bias = False
    if family in ("mistral", "mixtral", "phi3", "jamba"):
        q_bias = k_bias = v_bias = o_bias = False

    layer_kinds, window = _llama_like_layer_kinds(reader, family, num_layers)
    notes: list[str] = []
    fields.update(
        hidden_size=hidden,
        num_attention_heads=heads,
        q_bias=q_bias,
        k_bias=k_bias,
        v_bias=v_bias,
        o_bias=o_bias,
        qk_norm="rms" if family in ("qwen3", "qwen3_moe", "gemma3_text") else None,
        mlp_kind="gated",
        mlp_bias=reader.as_bool("mlp_bias", False) if family in ("llama", "deepseek_v2") else False,
        norm_type="rms",
        norms_per_layer=4 if family in ("gemma2", "gemma3_text") else 2,
        # Jamba's attention layers apply no position encoding: its Mamba layers
        # carry the order, although the config inherits rope keys.
        position_embedding="none" if family == "jamba" else "rope",
        sliding_window=window,
        notes=notes,
    )

    if family in ("deepseek_v2", "deepseek_v3") or reader.get("kv_lora_rank"):
        fields.update(_mla_fields(reader))
        kv_heads = heads
        head_dim = fields["qk_nope_head_dim"] + fields["qk_rope_head_dim"]
        value_head_dim = fields["v_head_dim"]
        fields.pop("v_head_dim")
        # MLA's biases (when attention_bias) sit on q_a_proj (only with a query LoRA),
        # kv_a_proj_with_mqa and o_proj; q_b_proj, kv_b_proj and a plain q_proj have none.
        fields["q_bias"] = attention_bias and fields["q_lora_rank"] is not None
        fields["k_bias"] = attention_bias
        fields["v_bias"] = False
    else:
        head_dim = _head_dim(reader, hidden, heads)
        value_head_dim = head_dim
    _check_heads(reader, heads, kv_heads)
    fields.update(num_key_value_heads=kv_heads, head_dim=head_dim, value_head_dim=value_head_dim)

    scale = head_dim**-0.5
    if family in ("gemma2", "gemma3_text"):
        scalar = reader.as_float("query_pre_attn_scalar")
        fields["query_pre_attn_scalar"] = scalar
        scale = scalar**-0.5
        fields["attn_logit_softcapping"] = reader.as_float("attn_logit_softcapping")
        fields["final_logit_softcapping"] = reader.as_float("final_logit_softcapping")
    if family == "gemma3_text":
        fields["rope_local_theta"] = reader.as_float("rope_local_base_freq")
        if isinstance(reader.get("rope_parameters"), Mapping):
            local = reader.get("rope_parameters").get("sliding_attention") or {}
            if local.get("rope_theta") is not None:
                fields["rope_local_theta"] = float(local["rope_theta"])
    if fields.get("kv_lora_rank"):
        scale = _mla_scale(head_dim, fields["rope_scaling"])
    fields["attention_scale"] = scale

    fields.update(_moe_fields(reader, family, num_layers))
    if family == "jamba":
        layer_kinds = _jamba_layer_kinds(reader, num_layers)
        fields["mamba"] = _mamba_spec(reader, hidden)
    fields["layer_kinds"] = layer_kinds
    return fields


def _mla_fields(reader: _Reader) -> dict:
    """DeepSeek's multi-head latent attention ranks."""
    q_lora_rank = reader.get("q_lora_rank")
    return {
        "kv_lora_rank": reader.require_int(("kv_lora_rank",), what="MLA latent rank"),
        "q_lora_rank": None if q_lora_rank is None else reader.as_int("q_lora_rank", q_lora_rank),
        "qk_rope_head_dim": reader.require_int(("qk_rope_head_dim",), what="MLA rope head size"),
        "qk_nope_head_dim": reader.require_int(("qk_nope_head_dim",), what="MLA nope head size"),
        "v_head_dim": reader.require_int(("v_head_dim",), what="MLA value head size"),
    }


def _mla_scale(qk_head_dim: int, rope_scaling: Mapping | None) -> float:
    """Softmax scale of MLA: 1/sqrt(qk_head_dim), times mscale^2 under YaRN with mscale_all_dim."""
    scale = qk_head_dim**-0.5
    if rope_scaling:
        mscale_all_dim = rope_scaling.get("mscale_all_dim", 0) or 0
        factor = rope_scaling.get("factor", 1.0) or 1.0
        if mscale_all_dim and factor > 1:
            mscale = 0.1 * mscale_all_dim * math.log(factor) + 1.0
            scale *= mscale * mscale
    return scale


def _moe_fields(reader: _Reader, family: str, num_layers: int) -> dict:
    """Experts, active experts and which layers are MoE (all-false for dense models)."""
    dense = {"moe_layers": (False,) * num_layers}
    if family == "mixtral" or (family == "generic" and reader.get("num_local_experts")):
        experts = reader.as_int("num_local_experts", reader.get("num_local_experts"))
        return {
            "num_experts": experts,
            "num_experts_per_tok": reader.as_int(
                "num_experts_per_tok", reader.get("num_experts_per_tok")
            ),
            "moe_intermediate_size": reader.get("intermediate_size"),
            "moe_layers": (True,) * num_layers,
        }
    if family == "qwen3_moe":
        experts = reader.as_int("num_experts", reader.get("num_experts"), minimum=0)
        step = reader.as_int("decoder_sparse_step", reader.get("decoder_sparse_step"))
        mlp_only = set(reader.get("mlp_only_layers") or [])
        layers = tuple(
            i not in mlp_only and experts > 0 and (i + 1) % step == 0 for i in range(num_layers)
        )
        return {
            "num_experts": experts,
            "num_experts_per_tok": reader.as_int(
                "num_experts_per_tok", reader.get("num_experts_per_tok")
            ),
            "moe_intermediate_size": reader.as_int(
                "moe_intermediate_size", reader.get("moe_intermediate_size")
            ),
            "moe_layers": layers,
        }
    if family in ("deepseek_v2", "deepseek_v3"):
        experts = reader.get("n_routed_experts")
        if not experts:
            return dense
        experts = reader.as_int("n_routed_experts", experts)
        first_dense = reader.as_int(
            "first_k_dense_replace", reader.get("first_k_dense_replace", 0), minimum=0
        )
        frequency = reader.as_int("moe_layer_freq", reader.get("moe_layer_freq", 1))
        moe_size = reader.as_int("moe_intermediate_size", reader.get("moe_intermediate_size"))
        shared = reader.as_int("n_shared_experts", reader.get("n_shared_experts") or 0, minimum=0)
        top_k = reader.get("num_experts_per_tok")
        return {
            "num_experts": experts,
            "num_experts_per_tok": None
            if top_k is None
            else reader.as_int("num_experts_per_tok", top_k),
            "moe_intermediate_size": moe_size,
            "num_shared_experts": shared,
            "shared_expert_intermediate_size": moe_size * shared if shared else None,
            "moe_layers": tuple(i >= first_dense and i % frequency == 0 for i in range(num_layers)),
        }
    if family == "jamba":
        experts = reader.as_int("num_experts", reader.get("num_experts"))
        period = reader.as_int("expert_layer_period", reader.get("expert_layer_period"))
        offset = reader.as_int("expert_layer_offset", reader.get("expert_layer_offset"), minimum=0)
        return {
            "num_experts": experts if experts > 1 else None,
            "num_experts_per_tok": reader.as_int(
                "num_experts_per_tok", reader.get("num_experts_per_tok")
            ),
            "moe_intermediate_size": reader.get("intermediate_size"),
            "moe_layers": tuple(experts > 1 and i % period == offset for i in range(num_layers)),
        }
    return dense


def _jamba_layer_kinds(reader: _Reader, num_layers: int) -> tuple[str, ...]:
    explicit = _layer_types_kinds(reader, num_layers)
    if explicit is not None:
        return explicit
    period = reader.as_int("attn_layer_period", reader.get("attn_layer_period"))
    offset = reader.as_int("attn_layer_offset", reader.get("attn_layer_offset"), minimum=0)
    if offset >= period:
        raise ConfigError(
            f"attn_layer_offset={offset} must be smaller than attn_layer_period={period} "
            f"(model_type={reader.model_type!r})"
        )
    return tuple("full" if i % period == offset else "none" for i in range(num_layers))


def _mamba_spec(reader: _Reader, hidden: int) -> MambaSpec:
    expand = reader.as_int("mamba_expand", reader.get("mamba_expand"))
    dt_rank = reader.get("mamba_dt_rank")
    dt_rank = (
        math.ceil(hidden / 16) if dt_rank == "auto" else reader.as_int("mamba_dt_rank", dt_rank)
    )
    return MambaSpec(
        d_state=reader.as_int("mamba_d_state", reader.get("mamba_d_state")),
        d_conv=reader.as_int("mamba_d_conv", reader.get("mamba_d_conv")),
        expand=expand,
        dt_rank=dt_rank,
        inner_size=expand * hidden,
        conv_bias=reader.as_bool("mamba_conv_bias", True),
        proj_bias=reader.as_bool("mamba_proj_bias", False),
        inner_layernorms=True,
    )


def _read_gpt2_like(reader: _Reader, family: str) -> dict:
    """GPT-2 and GPTBigCode (StarCoder): learned positions, fused c_attn, biases everywhere."""
    hidden = reader.require_int(HIDDEN_KEYS, what="hidden size")
    heads = reader.require_int(HEADS_KEYS, what="number of attention heads")
    num_layers = reader.require_int(LAYERS_KEYS, what="number of layers")
    fields = _common_fields(reader)
    head_dim = _head_dim(reader, hidden, heads)
    kv_heads = heads
    if family == "gpt_bigcode" and reader.as_bool("multi_query", True):
        kv_heads = 1
    inner = reader.optional_int(("n_inner",)) or 4 * hidden
    positions = reader.require_int(("n_positions", "max_position_embeddings"), what="positions")
    scale = head_dim**-0.5 if reader.as_bool("scale_attn_weights", True) else 1.0
    fields.update(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        value_head_dim=head_dim,
        q_bias=True,
        k_bias=True,
        v_bias=True,
        o_bias=True,
        attention_scale=scale,
        intermediate_size=inner,
        mlp_kind="plain",
        mlp_bias=True,
        norm_type="layer",
        norm_bias=True,
        norms_per_layer=2,
        position_embedding="learned",
        learned_position_rows=positions,
        learned_position_tables=1,
        rope_theta=None,
        layer_kinds=("full",) * num_layers,
        moe_layers=(False,) * num_layers,
    )
    return fields


def _read_gpt_neox(reader: _Reader, family: str) -> dict:
    """GPT-NeoX (Pythia): fused query_key_value, partial rotary, LayerNorms with bias."""
    hidden = reader.require_int(HIDDEN_KEYS, what="hidden size")
    heads = reader.require_int(HEADS_KEYS, what="number of attention heads")
    num_layers = reader.require_int(LAYERS_KEYS, what="number of layers")
    fields = _common_fields(reader)
    fields["tie_word_embeddings"] = reader.as_bool("tie_word_embeddings", False)
    fields.update(_rope_fields(reader, ("rope_theta", "rotary_emb_base")))
    head_dim = _head_dim(reader, hidden, heads)
    bias = reader.as_bool("attention_bias", True)
    fields.update(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=head_dim,
        value_head_dim=head_dim,
        q_bias=bias,
        k_bias=bias,
        v_bias=bias,
        o_bias=bias,
        attention_scale=head_dim**-0.5,
        intermediate_size=reader.require_int(("intermediate_size",), what="feed-forward size"),
        mlp_kind="plain",
        mlp_bias=True,
        norm_type="layer",
        norm_bias=True,
        norms_per_layer=2,
        position_embedding="rope",
        layer_kinds=("full",) * num_layers,
        moe_layers=(False,) * num_layers,
    )
    return fields


def _read_falcon(reader: _Reader, family: str) -> dict:
    """Falcon: MQA (`multi_query`) or grouped KV (`new_decoder_architecture` + `num_kv_heads`)."""
    hidden = reader.require_int(HIDDEN_KEYS, what="hidden size")
    heads = reader.require_int(HEADS_KEYS, what="number of attention heads")
    num_layers = reader.require_int(LAYERS_KEYS, what="number of layers")
    fields = _common_fields(reader)
    if reader.has("new_decoder_architecture") or reader.model_type not in _FALCON_ALIASES:
        new_architecture = reader.as_bool("new_decoder_architecture", False)
    else:
        # Remote-code Falcon configs: "RefinedWeb" (40B) had the new architecture.
        new_architecture = _FALCON_ALIASES[reader.model_type]
    if new_architecture:
        _, kv_heads = reader.first(("num_kv_heads", "n_head_kv", "num_key_value_heads"))
        kv_heads = heads if kv_heads is None else reader.as_int("num_kv_heads", kv_heads)
    elif reader.as_bool("multi_query", True):
        kv_heads = 1
    else:
        kv_heads = heads
    head_dim = _head_dim(reader, hidden, heads)
    _check_heads(reader, heads, kv_heads)
    bias = reader.as_bool("bias", False)
    if reader.as_bool("parallel_attn", True):
        norms = reader.get("num_ln_in_parallel_attn")
        norms = 2 if norms is None and new_architecture else (norms or 1)
    else:
        norms = 2
    alibi = reader.as_bool("alibi", False)
    fields.update(_rope_fields(reader))
    fields.update(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        value_head_dim=head_dim,
        q_bias=bias,
        k_bias=bias,
        v_bias=bias,
        o_bias=bias,
        attention_scale=head_dim**-0.5,
        intermediate_size=reader.optional_int(("ffn_hidden_size",)) or 4 * hidden,
        mlp_kind="plain",
        mlp_bias=bias,
        norm_type="layer",
        norm_bias=True,
        norms_per_layer=norms,
        position_embedding="alibi" if alibi else "rope",
        layer_kinds=("full",) * num_layers,
        moe_layers=(False,) * num_layers,
    )
    if alibi:
        fields["rope_theta"] = None
    return fields


def _read_phi(reader: _Reader, family: str) -> dict:
    """Phi-1/1.5/2: partial rotary, biases everywhere, one LayerNorm per block, biased LM head."""
    hidden = reader.require_int(HIDDEN_KEYS, what="hidden size")
    heads = reader.require_int(HEADS_KEYS, what="number of attention heads")
    num_layers = reader.require_int(LAYERS_KEYS, what="number of layers")
    fields = _common_fields(reader)
    fields["tie_word_embeddings"] = reader.as_bool("tie_word_embeddings", False)
    _, kv_heads = reader.first(KV_HEADS_KEYS)
    kv_heads = heads if kv_heads is None else reader.as_int("num_key_value_heads", kv_heads)
    head_dim = _head_dim(reader, hidden, heads)
    _check_heads(reader, heads, kv_heads)
    fields.update(_rope_fields(reader))
    fields.update(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        value_head_dim=head_dim,
        q_bias=True,
        k_bias=True,
        v_bias=True,
        o_bias=True,
        qk_norm="layer" if reader.as_bool("qk_layernorm", False) else None,
        attention_scale=head_dim**-0.5,
        intermediate_size=reader.require_int(("intermediate_size",), what="feed-forward size"),
        mlp_kind="plain",
        mlp_bias=True,
        norm_type="layer",
        norm_bias=True,
        norms_per_layer=1,
        lm_head_bias=True,
        position_embedding="rope",
        layer_kinds=("full",) * num_layers,
        moe_layers=(False,) * num_layers,
    )
    return fields


def _read_opt(reader: _Reader, family: str) -> dict:
    """OPT: learned positions with an offset of 2 rows, optional embedding projection."""
    hidden = reader.require_int(HIDDEN_KEYS, what="hidden size")
    heads = reader.require_int(HEADS_KEYS, what="number of attention heads")
    num_layers = reader.require_int(LAYERS_KEYS, what="number of layers")
    fields = _common_fields(reader)
    head_dim = _head_dim(reader, hidden, heads)
    bias = reader.as_bool("enable_bias", True)
    projection = reader.optional_int(("word_embed_proj_dim",)) or hidden
    fields.update(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=head_dim,
        value_head_dim=head_dim,
        q_bias=bias,
        k_bias=bias,
        v_bias=bias,
        o_bias=bias,
        attention_scale=head_dim**-0.5,
        intermediate_size=reader.require_int(("ffn_dim",), what="feed-forward size (ffn_dim)"),
        mlp_kind="plain",
        mlp_bias=bias,
        norm_type="layer",
        norm_bias=True,
        norm_affine=reader.as_bool("layer_norm_elementwise_affine", True),
        norms_per_layer=2,
        final_norms=1 if reader.as_bool("do_layer_norm_before", True) else 0,
        position_embedding="learned",
        # OPT's position table has two extra rows (positions start at offset 2).
        learned_position_rows=reader.require_int(MAX_POSITION_KEYS, what="positions") + 2,
        learned_position_tables=1,
        word_embed_proj_dim=projection,
        rope_theta=None,
        layer_kinds=("full",) * num_layers,
        moe_layers=(False,) * num_layers,
    )
    return fields


def _read_bert(reader: _Reader, family: str) -> dict:
    """BERT: encoder-only, learned absolute positions and token types, post-norm."""
    hidden = reader.require_int(HIDDEN_KEYS, what="hidden size")
    heads = reader.require_int(HEADS_KEYS, what="number of attention heads")
    num_layers = reader.require_int(LAYERS_KEYS, what="number of layers")
    fields = _common_fields(reader)
    head_dim = _head_dim(reader, hidden, heads)
    position_type = reader.get("position_embedding_type", "absolute")
    if position_type not in (None, "absolute"):
        fields.setdefault("notes", []).append(
            f"position_embedding_type={position_type!r} is counted as absolute positions"
        )
    fields.update(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=head_dim,
        value_head_dim=head_dim,
        q_bias=True,
        k_bias=True,
        v_bias=True,
        o_bias=True,
        attention_scale=head_dim**-0.5,
        intermediate_size=reader.require_int(("intermediate_size",), what="feed-forward size"),
        mlp_kind="plain",
        mlp_bias=True,
        norm_type="layer",
        norm_bias=True,
        norms_per_layer=2,
        final_norms=0,
        embedding_norms=1,
        position_embedding="learned",
        learned_position_rows=reader.require_int(MAX_POSITION_KEYS, what="positions"),
        learned_position_tables=1,
        token_type_vocab_size=reader.optional_int(("type_vocab_size",), minimum=0) or 0,
        rope_theta=None,
        is_decoder=reader.as_bool("is_decoder", False),
        layer_kinds=("full",) * num_layers,
        moe_layers=(False,) * num_layers,
    )
    return fields


def _read_t5(reader: _Reader, family: str) -> dict:
    """T5 / Flan-T5: encoder-decoder, relative position buckets, no biases, RMS norms.

    As in transformers' T5Config, the generic aliases (`hidden_size`, `num_attention_heads`,
    `num_hidden_layers`, `head_dim`) win over `d_model`, `num_heads`, `num_layers`, `d_kv`.
    """
    hidden = reader.require_int(("hidden_size", "d_model"), what="hidden size")
    heads = reader.require_int(("num_attention_heads", "num_heads"), what="number of heads")
    encoder_layers = reader.require_int(
        ("num_hidden_layers", "num_layers"), what="number of encoder layers"
    )
    decoder_layers = reader.optional_int(("num_decoder_layers",)) or encoder_layers
    fields = _common_fields(reader)
    head_dim = reader.require_int(("head_dim", "d_kv"), what="head size (d_kv)")
    projection = reader.get("feed_forward_proj", "relu") or "relu"
    gated = projection.startswith("gated-")
    d_ff = reader.require_int(("d_ff",), what="feed-forward size (d_ff)")
    fields.update(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=head_dim,
        value_head_dim=head_dim,
        attention_scale=1.0,  # T5 folds the scale into its initialisation
        relative_attention_num_buckets=reader.optional_int(("relative_attention_num_buckets",)),
        intermediate_size=d_ff,
        mlp_kind="gated" if gated else "plain",
        hidden_act=projection.split("-")[-1],
        norm_type="rms",
        norms_per_layer=3,
        final_norms=2,
        position_embedding="relative",
        rope_theta=None,
        is_encoder_decoder=True,
        num_encoder_layers=encoder_layers,
        encoder_attention_heads=heads,
        encoder_head_dim=head_dim,
        encoder_intermediate_size=d_ff,
        encoder_norms_per_layer=2,
        layer_kinds=("full",) * decoder_layers,
        moe_layers=(False,) * decoder_layers,
    )
    return fields


def _read_bart(reader: _Reader, family: str) -> dict:
    """BART: encoder-decoder, learned positions (offset 2) in each stack, post-norm.

    transformers' BartConfig aliases `hidden_size`, `num_attention_heads` and
    `num_hidden_layers` to `d_model` and the *encoder's* heads and layers; when a config
    holds both spellings the generic one wins, so it is read first here too.
    """
    hidden = reader.require_int(("hidden_size", "d_model"), what="hidden size")
    decoder_heads = reader.require_int(("decoder_attention_heads",), what="decoder heads")
    encoder_heads = reader.require_int(
        ("num_attention_heads", "encoder_attention_heads"), what="encoder heads"
    )
    decoder_layers = reader.require_int(("decoder_layers",), what="number of decoder layers")
    fields = _common_fields(reader)
    head_dim = _head_dim(reader, hidden, decoder_heads)
    rows = reader.require_int(MAX_POSITION_KEYS, what="positions") + 2
    fields.update(
        hidden_size=hidden,
        num_attention_heads=decoder_heads,
        num_key_value_heads=decoder_heads,
        head_dim=head_dim,
        value_head_dim=head_dim,
        q_bias=True,
        k_bias=True,
        v_bias=True,
        o_bias=True,
        attention_scale=head_dim**-0.5,
        intermediate_size=reader.require_int(("decoder_ffn_dim",), what="decoder ffn size"),
        mlp_kind="plain",
        mlp_bias=True,
        norm_type="layer",
        norm_bias=True,
        norms_per_layer=3,
        final_norms=0,
        embedding_norms=2,
        position_embedding="learned",
        learned_position_rows=rows,
        learned_position_tables=2,
        rope_theta=None,
        is_encoder_decoder=True,
        num_encoder_layers=reader.require_int(
            ("num_hidden_layers", "encoder_layers"), what="encoder layers"
        ),
        encoder_attention_heads=encoder_heads,
        encoder_head_dim=_head_dim(reader, hidden, encoder_heads),
        encoder_intermediate_size=reader.require_int(("encoder_ffn_dim",), what="encoder ffn"),
        encoder_norms_per_layer=2,
        layer_kinds=("full",) * decoder_layers,
        moe_layers=(False,) * decoder_layers,
    )
    return fields


def _read_dbrx(reader: _Reader, family: str) -> dict:
    """DBRX: nested `attn_config` (kv_n_heads, rope_theta, clip_qkv) and `ffn_config` (MoE)."""
    hidden = reader.require_int(HIDDEN_KEYS, what="hidden size")
    heads = reader.require_int(HEADS_KEYS, what="number of attention heads")
    num_layers = reader.require_int(LAYERS_KEYS, what="number of layers")
    fields = _common_fields(reader)
    fields["tie_word_embeddings"] = reader.as_bool("tie_word_embeddings", False)
    attn = _Reader(
        reader.get("attn_config") or {}, reader.model_type, DBRX_ATTN_DEFAULTS, "attn_config."
    )
    ffn = _Reader(
        reader.get("ffn_config") or {}, reader.model_type, DBRX_FFN_DEFAULTS, "ffn_config."
    )
    kv_heads = attn.as_int("kv_n_heads", attn.get("kv_n_heads"))
    head_dim = _head_dim(reader, hidden, heads)
    _check_heads(reader, heads, kv_heads)
    experts = ffn.as_int("moe_num_experts", ffn.get("moe_num_experts"))
    ffn_size = ffn.as_int("ffn_hidden_size", ffn.get("ffn_hidden_size"))
    fields.update(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        value_head_dim=head_dim,
        attention_scale=head_dim**-0.5,
        qkv_clip=attn.as_float("clip_qkv"),
        rope_theta=attn.as_float("rope_theta"),
        intermediate_size=ffn_size,
        mlp_kind="gated",
        norm_type="layer",
        norm_bias=False,
        norms_per_layer=2,
        position_embedding="rope",
        num_experts=experts,
        num_experts_per_tok=ffn.as_int("moe_top_k", ffn.get("moe_top_k")),
        moe_intermediate_size=ffn_size,
        moe_layers=(True,) * num_layers,
        layer_kinds=("full",) * num_layers,
    )
    return fields


_READERS = {
    "gpt2": _read_gpt2_like,
    "gpt_bigcode": _read_gpt2_like,
    "gpt_neox": _read_gpt_neox,
    "falcon": _read_falcon,
    "phi": _read_phi,
    "opt": _read_opt,
    "bert": _read_bert,
    "t5": _read_t5,
    "bart": _read_bart,
    "dbrx": _read_dbrx,
}


def _head_fields(architecture: str | None, family: str, notes: list[str]) -> dict:
    """What sits on top of the stack, from the class `architectures[0]` names."""
    if architecture is None:
        kind = {"bert": "base", "t5": "lm", "bart": "base"}.get(family, "lm")
        notes.append(
            f"config.json names no architectures; counted as the {kind!r} head of {family}"
        )
    elif architecture.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")):
        kind = "lm"
    elif architecture.endswith("ForMaskedLM"):
        kind = "masked_lm"
    elif architecture.endswith("Model"):
        kind = "base"
    else:
        kind = "base"
        notes.append(
            f"architectures[0]={architecture!r} has a task head keras-mha does not count; "
            f"the total covers the base model only"
        )
    return {"head_kind": kind, "pooler": family == "bert" and kind == "base"}


def _read_vision(vision_config: Mapping, model_type: str) -> VisionSpec | None:
    vision_type = vision_config.get("model_type", "siglip_vision_model")
    if vision_type != "siglip_vision_model":
        return None
    reader = _Reader(
        vision_config, vision_type, FAMILY_DEFAULTS["siglip_vision_model"], "vision_config."
    )
    return VisionSpec(
        model_type=vision_type,
        hidden_size=reader.require_int(("hidden_size",), what="vision hidden size"),
        intermediate_size=reader.require_int(("intermediate_size",), what="vision mlp size"),
        num_layers=reader.require_int(("num_hidden_layers",), what="vision layers"),
        num_attention_heads=reader.require_int(("num_attention_heads",), what="vision heads"),
        num_channels=reader.require_int(("num_channels",), what="image channels"),
        image_size=reader.require_int(("image_size",), what="image size"),
        patch_size=reader.require_int(("patch_size",), what="patch size"),
        use_head=reader.as_bool("vision_use_head", True),
        projector=model_type,
    )


__all__ = [
    "ATTENTION_KINDS",
    "AttentionLayerSpec",
    "LAYER_KINDS",
    "MambaSpec",
    "ModelSpec",
    "VisionSpec",
    "from_config",
]
