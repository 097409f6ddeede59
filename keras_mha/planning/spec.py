"""Normalise a Hugging Face Hub `config.json` into a `ModelSpec`.

Every family spells the same idea differently (`num_attention_heads`, `n_head`,
`num_heads`, `n_heads`; `hidden_size`, `n_embd`, `d_model`; Falcon's `multi_query`,
DBRX's `attn_config.kv_n_heads`, ...). `from_config` reads the raw dict, never
transformers, and returns one frozen `ModelSpec` with the same names for every
family: head counts, head size, which layers hold full, sliding-window or no
attention, MLA ranks, MoE sizes, biases, norms, RoPE and soft caps. The cost model
(`keras_mha.planning.costs`) and the layer rebuilder read only this dataclass.

The spellings, defaults and traits of each family are data (one module per family in
`keras_mha.families`); every value passes
through one validation layer (`keras_mha.planning.config_values`): a wrong type, NaN, a
negative or absurd size, a malformed sub-object or inconsistent fields raise
`ConfigError` naming the key, the value and what was expected.

When a known family's config leaves a key out, the value transformers' config class
would use is taken (Gemma 3's multimodal configs, for one, omit the head counts of
their `text_config`); when that key describes the model's shape, the spec says so in
`warnings`. An unknown `model_type` is read through the generic spellings with a
`UserWarning`; a key that no spelling provides raises `ConfigError` naming the keys
looked for and the model type.

Only the standard library is imported, so `keras-mha inspect` starts fast.

Example:
    >>> from keras_mha.planning.spec import from_config
    >>> spec = from_config({
    ...     "model_type": "llama", "architectures": ["LlamaForCausalLM"],
    ...     "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
    ...     "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 128256,
    ... })
    >>> spec.attention_kind, spec.attention.head_dim, spec.layer_kind_counts()
    ('GQA', 128, {'full': 32, 'sliding': 0, 'none': 0})
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields

from keras_mha.errors import ConfigError
from keras_mha.families import (
    GENERIC_NAME,
    VISION_TOWER_DEFAULTS,
    VISION_TOWER_LAYOUTS,
    Family,
    family_for,
    generic_family,
    read_family,
)
from keras_mha.planning.config_values import ConfigReader, copy_json_config, shown

LAYER_KINDS = ("full", "sliding", "none")
ATTENTION_KINDS = ("MHA", "GQA", "MQA", "MLA")

VISION_TOWERS = tuple(VISION_TOWER_DEFAULTS)


@dataclass(frozen=True)
class VisionSpec:
    """The vision tower of a multimodal model (a SigLIP or CLIP ViT) and its projector.

    Only what the parameter count needs: the language model is described by `ModelSpec`.

    Attributes:
        model_type: "siglip_vision_model" or "clip_vision_model".
        projector: the wrapper's model type, whose family module (`Wrapper`) decides the
            projector: "gemma3" (RMS norm and one matrix), "llava" (two linear layers),
            "paligemma" (one linear).
        projector_bias: LLaVA's `multimodal_projector_bias`.
        projector_input_layers: how many vision layers LLaVA's projector concatenates
            (the length of a `vision_feature_layer` list, else 1).
        projection_dim: PaliGemma's projector output size.

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
    projector_bias: bool = True
    projector_input_layers: int = 1
    projection_dim: int | None = None

    @property
    def num_patches(self) -> int:
        """Number of patch positions (CLIP's position table has one more row, its class token)."""
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
    rope_scaling: Mapping[str, object] | None
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
class AttentionSpec:
    """The attention layers of the language model: heads, sizes, biases, scales, caps, MLA ranks.

    For MLA, `num_key_value_heads` equals the query heads (the heads the latent is expanded
    into) and `head_dim` is the query/key head size (`qk_nope_head_dim + qk_rope_head_dim`);
    `value_head_dim` is `v_head_dim`.

    Attributes:
        attention_kind: "MHA", "GQA", "MQA" or "MLA".
        sliding_window: the window of the sliding layers, None when there are none.
        layer_kinds: one of "full", "sliding", "none" per layer of the stack.
        inverse_layer_scale: GPT-2's `scale_attn_by_inverse_layer_idx`.

    Example:
        >>> spec = from_config({"model_type": "gpt2", "n_embd": 768, "n_head": 12,
        ...     "n_layer": 12, "vocab_size": 50257})
        >>> spec.attention.attention_kind, spec.attention.head_dim
        ('MHA', 64)
    """

    attention_kind: str
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    sliding_window: int | None
    layer_kinds: tuple[str, ...]
    value_head_dim: int = 0
    q_bias: bool = False
    k_bias: bool = False
    v_bias: bool = False
    o_bias: bool = False
    qk_norm: str | None = None
    attention_scale: float = 1.0
    inverse_layer_scale: bool = False
    query_pre_attn_scalar: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    qkv_clip: float | None = None
    relative_attention_num_buckets: int | None = None
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None


@dataclass(frozen=True)
class PositionSpec:
    """How the model knows where a token is: RoPE, learned tables, ALiBi or relative buckets.

    Attributes:
        position_embedding: "rope", "learned", "alibi", "relative" or "none".
        position_padding_idx: RoBERTa's positions count from it + 1.
        rope_local_theta: Gemma 3's base of the sliding layers.

    Example:
        >>> spec = from_config({"model_type": "gpt2", "n_embd": 768, "n_head": 12,
        ...     "n_layer": 12, "vocab_size": 50257})
        >>> spec.positions.position_embedding, spec.positions.max_position_embeddings
        ('learned', 1024)
    """

    position_embedding: str = "rope"
    max_position_embeddings: int | None = None
    learned_position_rows: int = 0
    learned_position_tables: int = 0
    position_padding_idx: int | None = None
    token_type_vocab_size: int = 0
    rope_theta: float | None = None
    rope_local_theta: float | None = None
    partial_rotary_factor: float = 1.0
    rope_scaling: Mapping[str, object] | None = None


@dataclass(frozen=True)
class MlpSpec:
    """The feed-forward blocks: dense sizes and activation, and the experts of MoE layers.

    Attributes:
        mlp_kind: "gated" (SwiGLU / GeGLU) or "plain".
        moe_layers: per layer of the stack, whether it holds experts.

    Example:
        >>> spec = from_config({"model_type": "mixtral", "num_hidden_layers": 2})
        >>> spec.mlp.num_experts, spec.mlp.num_experts_per_tok
        (8, 2)
    """

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


@dataclass(frozen=True)
class NormSpec:
    """Norms and the embedding-side extras of the stack.

    Attributes:
        parallel_residual: x + attention(norm(x)) + mlp(norm(x)) (GPT-NeoX, ...).
        word_embed_proj_dim: OPT's projection between embeddings and the stack.

    Example:
        >>> neox = from_config({"model_type": "gpt_neox", "num_hidden_layers": 2}).norms
        >>> neox.norm_type, neox.norm_bias, neox.parallel_residual
        ('layer', True, True)
    """

    norm_type: str = "rms"
    norm_bias: bool = False
    norm_affine: bool = True
    norm_eps: float | None = None
    norms_per_layer: int = 2
    parallel_residual: bool = False
    final_norms: int = 1
    embedding_norms: int = 0
    word_embed_proj_dim: int | None = None


@dataclass(frozen=True)
class EncoderSpec:
    """The encoder stack of an encoder-decoder (all zero for decoder-only models).

    Example:
        >>> spec = from_config({"model_type": "t5", "num_layers": 2})
        >>> spec.encoder.num_encoder_layers
        2
    """

    num_encoder_layers: int = 0
    encoder_attention_heads: int = 0
    encoder_head_dim: int = 0
    encoder_intermediate_size: int = 0
    encoder_norms_per_layer: int = 0


# Which record holds each field a family module reads (`read_family` returns them flat).
RECORDS = {
    "attention": AttentionSpec,
    "positions": PositionSpec,
    "mlp": MlpSpec,
    "norms": NormSpec,
    "encoder": EncoderSpec,
}
RECORD_OF_FIELD: dict[str, str] = {
    item.name: record for record, cls in RECORDS.items() for item in dataclass_fields(cls)
}


@dataclass(frozen=True)
class ModelSpec:
    """A Hub model described with one vocabulary for every family.

    The model-level fields say what the model is; the records group the rest by what they
    describe, for the cost model and the layer rebuilder.

    Attributes:
        model_type: `model_type` of the config (the wrapper's for multimodal configs).
        architecture: `architectures[0]`, or None when the config names none.
        num_layers: layers that hold attention (decoder stack of an encoder-decoder).
        num_hidden_layers: all layers of that stack, with and without attention.
        hidden_size, vocab_size: of the language model.
        is_encoder_decoder: T5, BART, ...; the encoder is described by `encoder`.
        warnings: what the reader had to guess or could not use.
        raw: the config exactly as given.
        attention: heads, head sizes, biases, scales, soft caps, MLA ranks, layer kinds.
        positions: position embedding, RoPE base and scaling, learned tables.
        mlp: feed-forward sizes and activation, MoE experts.
        norms: norm type, count and epsilon, parallel residual, embedding extras.
        encoder: the encoder stack of an encoder-decoder.
        mamba: Jamba's Mamba mixer, None otherwise.
        vision: the vision tower of a multimodal model, None otherwise.

    Example:
        >>> spec = from_config({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
        ...     "n_embd": 768, "n_head": 12, "n_layer": 12, "vocab_size": 50257})
        >>> spec.num_layers, spec.attention_kind, spec.positions.position_embedding
        (12, 'MHA', 'learned')
    """

    model_type: str
    architecture: str | None
    num_layers: int
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    is_encoder_decoder: bool
    warnings: tuple[str, ...]
    raw: dict = field(compare=False, repr=False)
    attention: AttentionSpec = field(kw_only=True)
    positions: PositionSpec = field(default_factory=PositionSpec)
    mlp: MlpSpec = field(default_factory=MlpSpec)
    norms: NormSpec = field(default_factory=NormSpec)
    encoder: EncoderSpec = field(default_factory=EncoderSpec)

    # -- identity and head ---------------------------------------------------------------------
    model_id: str | None = None
    text_model_type: str | None = None
    family: str = GENERIC_NAME
    head_kind: str = "causal_lm"
    is_decoder: bool = True
    tie_word_embeddings: bool = False
    lm_head_bias: bool = False
    pooler: bool = False

    # -- other blocks --------------------------------------------------------------------------
    mamba: MambaSpec | None = None
    vision: VisionSpec | None = None

    @property
    def attention_kind(self) -> str:
        """ "MHA", "GQA", "MQA" or "MLA": the model's identity in one word."""
        return self.attention.attention_kind

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """One of "full", "sliding", "none" per layer of the stack (`attention.layer_kinds`)."""
        return self.attention.layer_kinds

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
        return self.attention.head_dim

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
        rope_theta = self.positions.rope_theta
        rope_scaling = self.positions.rope_scaling
        if sliding and self.positions.rope_local_theta is not None:
            # Gemma 3: sliding layers rotate with their own base and without scaling.
            rope_theta, rope_scaling = self.positions.rope_local_theta, None
        return AttentionLayerSpec(
            layer_index=layer_index,
            kind=kind,
            hidden_size=self.hidden_size,
            num_heads=self.attention.num_attention_heads,
            num_key_value_heads=self.attention.num_key_value_heads,
            head_dim=self.attention.head_dim,
            value_head_dim=self.attention.value_head_dim,
            sliding_window=self.attention.sliding_window if sliding else None,
            use_rope=self.positions.position_embedding == "rope",
            rope_theta=rope_theta if self.positions.position_embedding == "rope" else None,
            partial_rotary_factor=self.positions.partial_rotary_factor,
            rope_scaling=rope_scaling,
            q_bias=self.attention.q_bias,
            k_bias=self.attention.k_bias,
            v_bias=self.attention.v_bias,
            o_bias=self.attention.o_bias,
            qk_norm=self.attention.qk_norm,
            norm_eps=self.norms.norm_eps,
            logit_soft_cap=self.attention.attn_logit_softcapping,
            # GPT-2's scale_attn_by_inverse_layer_idx divides layer i's logits by i + 1.
            scale=self.attention.attention_scale / (layer_index + 1)
            if self.attention.inverse_layer_scale
            else self.attention.attention_scale,
            causal=self.is_decoder,
            kv_lora_rank=self.attention.kv_lora_rank,
            q_lora_rank=self.attention.q_lora_rank,
            qk_rope_head_dim=self.attention.qk_rope_head_dim,
            qk_nope_head_dim=self.attention.qk_nope_head_dim,
        )


# -- reading the raw dict ---------------------------------------------------------------------


def from_config(config: Mapping[str, object], *, model_id: str | None = None) -> ModelSpec:
    """Normalise a Hub `config.json` (as a dict) into a `ModelSpec`.

    Args:
        config: the parsed `config.json`.
        model_id: the Hub id or path it came from (only recorded, never fetched).

    Returns:
        The frozen `ModelSpec`.

    Raises:
        ConfigError: the config is not a JSON object, lacks a key that no spelling
            provides, or holds a value that is not valid (wrong type, not finite, out of
            range, inconsistent with another field, a malformed sub-object); the message
            names the key, the value and what was expected.

    Example:
        >>> spec = from_config({"model_type": "falcon", "architectures": ["FalconForCausalLM"],
        ...     "hidden_size": 4544, "num_attention_heads": 71, "num_hidden_layers": 32,
        ...     "multi_query": True, "new_decoder_architecture": False, "vocab_size": 65024})
        >>> spec.attention_kind, spec.attention.num_key_value_heads, spec.attention.head_dim
        ('MQA', 1, 64)
    """
    # A checked copy: the spec is frozen, so later edits of the caller's dict must not reach
    # it; the copy is iterative, so a hostile nesting depth is an error, not a RecursionError.
    raw = copy_json_config(config)
    model_type = raw.get("model_type")
    model_type = "" if model_type is None else model_type
    if not isinstance(model_type, str):
        raise ConfigError(
            f"model_type={shown(model_type)} must be a string (config.json)",
            key="model_type",
            value=model_type,
        )
    top = ConfigReader(raw, model_type=model_type)
    architecture = _architecture(top)
    wrapper = getattr(family_for(model_type), "wrapper", None)
    spec_warnings: list[str] = []

    # Multimodal wrappers keep the language model in `text_config`.
    text_config, text_model_type, where = raw, model_type, ""
    if raw.get("text_config") is not None or wrapper:
        text_config = raw.get("text_config")
        top.require(
            isinstance(text_config, Mapping),
            "text_config",
            text_config,
            "must be a JSON object holding the language model's config",
        )
        text_model_type = text_config.get("model_type") or (
            wrapper.text_model_type if wrapper else model_type
        )
        top.require(
            isinstance(text_model_type, str),
            "text_config.model_type",
            text_model_type,
            "must be a string",
        )
        where = "text_config."

    family = family_for(text_model_type)
    if family is None or family.name == GENERIC_NAME or family.wrapper is not None:
        family = generic_family()
        message = (
            f"model_type={text_model_type or '(none)'!r} is not a family keras-mha knows; read "
            f"with the generic config keys, so the counts may be approximate"
        )
        warnings.warn(message, UserWarning, stacklevel=2)
        spec_warnings.append(message)
    reader = ConfigReader(
        text_config,
        model_type=text_model_type or model_type,
        defaults=family.defaults,
        where=where,
    )
    fields = read_family(reader, family)
    fields.update(_head_fields(architecture, family, spec_warnings))
    vision = _read_vision(top, model_type, wrapper, spec_warnings)
    if where:
        fields["tie_word_embeddings"] = _wrapper_tie(top, wrapper, fields["tie_word_embeddings"])

    num_hidden_layers = fields.pop("num_hidden_layers")
    layer_kinds = fields.pop("layer_kinds")
    sliding_window = fields.pop("sliding_window", None)
    fields.setdefault("value_head_dim", fields["head_dim"])
    fields.setdefault("attention_scale", fields["head_dim"] ** -0.5)
    fields.setdefault("moe_layers", (False,) * num_hidden_layers)
    fields.setdefault("is_encoder_decoder", False)
    if fields.get("mamba") is not None:
        fields["mamba"] = MambaSpec(**fields["mamba"])
    _check_consistency(reader, fields)
    spec_warnings.extend(reader.notes)
    spec_warnings.extend(fields.pop("notes"))
    heads, kv_heads = fields["num_attention_heads"], fields["num_key_value_heads"]
    fields["attention_kind"] = _attention_kind(heads, kv_heads, fields.get("kv_lora_rank"))
    fields["sliding_window"] = sliding_window if "sliding" in layer_kinds else None
    fields["layer_kinds"] = layer_kinds
    records: dict[str, dict] = {name: {} for name in RECORDS}
    for name in [name for name in fields if name in RECORD_OF_FIELD]:
        records[RECORD_OF_FIELD[name]][name] = fields.pop(name)
    return ModelSpec(
        model_type=model_type or text_model_type,
        architecture=architecture,
        num_layers=num_hidden_layers - layer_kinds.count("none"),
        num_hidden_layers=num_hidden_layers,
        warnings=tuple(spec_warnings),
        raw=raw,
        model_id=model_id,
        text_model_type=text_model_type if where else None,
        family=family.name,
        vision=vision,
        **{name: RECORDS[name](**values) for name, values in records.items()},
        **fields,
    )


def _architecture(top: ConfigReader) -> str | None:
    """`architectures[0]`: the class transformers instantiates (None when not given)."""
    architectures = top.config.get("architectures")
    if architectures is None or architectures == []:
        return None
    top.require(
        isinstance(architectures, list) and isinstance(architectures[0], str),
        "architectures",
        architectures,
        "must be a list of class names (e.g. ['LlamaForCausalLM'])",
    )
    return architectures[0]


def _attention_kind(heads: int, kv_heads: int, kv_lora_rank: int | None) -> str:
    if kv_lora_rank:
        return "MLA"
    if kv_heads == heads:
        return "MHA"
    if kv_heads == 1:
        return "MQA"
    return "GQA"


def _check_consistency(reader: ConfigReader, fields: dict) -> None:
    """Cross-field checks, after every field was read and checked on its own."""
    heads, kv_heads = fields["num_attention_heads"], fields["num_key_value_heads"]
    heads_key = reader.found["num_attention_heads"]
    kv_key = reader.found.get("num_key_value_heads", "num_key_value_heads")
    reader.require(
        kv_heads <= heads and heads % kv_heads == 0,
        kv_key,
        kv_heads,
        f"must divide {heads_key}={heads} (each KV head serves a whole group of query heads)",
    )
    if any(fields["moe_layers"]):
        for name in ("num_experts", "moe_intermediate_size"):
            reader.require(
                fields.get(name) is not None, name, fields.get(name), "must be set for MoE layers"
            )


def _wrapper_tie(top: ConfigReader, wrapper, text_tie: bool) -> bool:
    """`tie_word_embeddings` of a multimodal model: the wrapper's config decides."""
    own = top.flag("tie_word_embeddings", None)
    if wrapper is not None and wrapper.tie_word_embeddings is None:
        # LlavaConfig.__post_init__: a false (or absent) top-level value takes the text config's.
        return bool(own) or text_tie
    if own is not None:
        return own
    return wrapper.tie_word_embeddings if wrapper is not None else text_tie


def _read_vision(
    top: ConfigReader, model_type: str, wrapper, spec_warnings: list[str]
) -> VisionSpec | None:
    """The vision tower of a known multimodal wrapper (its family module's `Wrapper`)."""
    vision_config = top.config.get("vision_config")
    if vision_config is None and wrapper is None:
        return None
    # A wrapper without one would get its config class's default tower: refused, not guessed.
    top.require(
        isinstance(vision_config, Mapping),
        "vision_config",
        vision_config,
        "must be a JSON object holding the vision tower's config",
    )
    vision_type = vision_config.get("model_type") or (
        wrapper.vision_model_type if wrapper else None
    )
    if wrapper is None or vision_type not in VISION_TOWERS:
        spec_warnings.append(
            f"vision_config (model_type={vision_type!r}) of a {model_type!r} model is not read; "
            f"its parameters are not counted"
        )
        return None
    vision = ConfigReader(
        vision_config,
        model_type=vision_type,
        defaults=VISION_TOWER_DEFAULTS[vision_type],
        where="vision_config.",
    )
    hidden = vision.integer("hidden_size", "width", shape=True)
    heads = vision.integer("num_attention_heads", "heads", shape=True)
    vision.require(
        hidden % heads == 0,
        "hidden_size",
        hidden,
        f"must be divisible by vision_config.num_attention_heads={heads}",
    )
    image_size = vision.integer("image_size", "image", shape=True)
    spec_warnings.extend(vision.notes)
    return VisionSpec(
        model_type=vision_type,
        hidden_size=hidden,
        intermediate_size=vision.integer("intermediate_size", "width", shape=True),
        num_layers=vision.integer("num_hidden_layers", "layers", shape=True),
        num_attention_heads=heads,
        num_channels=vision.integer("num_channels", "image"),
        image_size=image_size,
        patch_size=vision.integer("patch_size", "image", high=image_size, shape=True),
        use_head=VISION_TOWER_LAYOUTS[vision_type].pooling_head
        and vision.flag("vision_use_head", True),
        projector=model_type,
        **wrapper.read_projector(top),
    )


def _head_fields(architecture: str | None, family: Family, notes: list[str]) -> dict:
    """What sits on top of the stack, from the class `architectures[0]` names."""
    if architecture is None:
        kind = family.default_head
        notes.append(
            f"config.json names no architectures; counted as the {kind!r} head of {family.name}"
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
    return {"head_kind": kind, "pooler": family.base_pooler and kind == "base"}


__all__ = [
    "ATTENTION_KINDS",
    "AttentionLayerSpec",
    "AttentionSpec",
    "EncoderSpec",
    "LAYER_KINDS",
    "MambaSpec",
    "MlpSpec",
    "ModelSpec",
    "NormSpec",
    "PositionSpec",
    "RECORD_OF_FIELD",
    "RECORDS",
    "VisionSpec",
    "from_config",
]
