"""Parameter counts and KV-cache bytes of a `ModelSpec`, in pure Python.

Parameters (`parameter_counts`) are those of the model class that the config's
`architectures[0]` names, as transformers instantiates it (tied weights counted
once), split into:

- `attention`: every parameter inside the attention blocks of the language model:
  q/k/v/o projections and their biases, q/k norms, MLA's low-rank projections and
  latent norms, T5's relative-position bias, and the decoder's cross-attention;
- `embeddings`: token, position and token-type tables (and OPT's projections);
- `mlp`: dense feed-forward blocks, MoE experts, routers and shared experts;
- `norms`: the residual-stream norms (per block, final, after the embeddings);
- `lm_head`: an untied output projection and its bias, or BERT's MLM head;
- `other`: what is none of these (BERT's pooler, Jamba's Mamba mixers, a vision
  tower and its projector);
- `active` (MoE only): the total minus the experts a token does not use;
- `vision`: the part of `other` that is a multimodal model's vision tower (CLIP, SigLIP)
  and projector, as transformers instantiates them (0 for a text-only model).

KV cache (`kv_cache_cost`) counts, for every layer that holds attention, the key and
value elements cached per token: `num_key_value_heads * head_dim` each, capped at the
window on sliding-window layers; for MLA the latent `kv_lora_rank + qk_rope_head_dim`
per token per layer (no factor 2). Encoder-decoders add the cross-attention cache of
every decoder layer over the encoder's tokens. See `KVCacheCost` for the definitions.

Nothing here imports keras, a backend, numpy or transformers.

Example:
    >>> from keras_mha.planning.spec import from_config
    >>> from keras_mha.planning.costs import kv_cache_cost, parameter_counts
    >>> spec = from_config({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
    ...     "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
    ...     "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 128256,
    ...     "tie_word_embeddings": False})
    >>> parameter_counts(spec).total
    8030261248
    >>> kv_cache_cost(spec, seq_len=8192).bytes_per_token
    131072
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from keras_mha.families import VISION_TOWER_LAYOUTS, family_for
from keras_mha.planning.kv_formats import kv_format
from keras_mha.planning.spec import ModelSpec

# Bits per cached element; int4 packs two elements in a byte.
KV_DTYPE_BITS = {
    "float32": 32,
    "bfloat16": 16,
    "float16": 16,
    "float8": 8,
    "int8": 8,
    "int4": 4,
}
MLA_CACHE_FORMATS = ("latent", "expanded")


@dataclass(frozen=True)
class ParameterCounts:
    """Parameter counts of a model, total and by part (see the module docstring).

    `total == attention + embeddings + mlp + norms + lm_head + other` always holds.

    Example:
        >>> counts = ParameterCounts(total=10, attention=4, embeddings=3, mlp=2, norms=1,
        ...                          lm_head=0, other=0, active=None)
        >>> counts.as_dict()["attention"]
        4
    """

    total: int
    attention: int
    embeddings: int
    mlp: int
    norms: int
    lm_head: int
    other: int
    active: int | None
    vision: int = 0

    def __post_init__(self):
        parts = self.attention + self.embeddings + self.mlp + self.norms + self.lm_head
        if parts + self.other != self.total:
            raise ValueError(
                f"total={self.total} must equal the sum of its parts ({parts + self.other})"
            )
        if self.active is not None and not 0 < self.active <= self.total:
            raise ValueError(f"active={self.active} must be in (0, total={self.total}]")
        if not 0 <= self.vision <= self.other:
            raise ValueError(f"vision={self.vision} must be in [0, other={self.other}]")

    def as_dict(self) -> dict:
        """The counts as a plain dict (JSON-ready).

        Example:
            >>> ParameterCounts(1, 1, 0, 0, 0, 0, 0, None).as_dict()["total"]
            1
        """
        return asdict(self)


@dataclass(frozen=True)
class LayerKVCache:
    """The cache one attention layer holds at a given length (one batch row).

    Attributes:
        layer_index: index of the decoder layer.
        kind: "full", "sliding" or "cross" (cross-attention over the encoder's tokens).
        cached_tokens: tokens held (capped at the window for "sliding").
        key_elements_per_token: key elements per token (for the MLA latent: the
            compressed KV plus the shared rope key, `kv_lora_rank + qk_rope_head_dim`).
        value_elements_per_token: value elements per token (0 for the MLA latent).
        rows_per_token: rows a quantized cache keeps one scale each for, per token
            (`kv_formats`): the key and value rows of every KV head (1 for the MLA latent).

    Example:
        >>> LayerKVCache(0, "full", 10, 1024, 1024, 16).elements
        20480
    """

    layer_index: int
    kind: str
    cached_tokens: int
    key_elements_per_token: int
    value_elements_per_token: int
    rows_per_token: int = 0

    @property
    def elements(self) -> int:
        """Cached elements of this layer for one batch row."""
        return self.cached_tokens * (self.key_elements_per_token + self.value_elements_per_token)

    def bits_per_token(self, kv_dtype: str, compute_dtype: str = "bfloat16") -> int:
        """Bits one cached token of this layer takes in `kv_dtype`, scales included.

        Example:
            >>> LayerKVCache(0, "full", 10, 64, 64, 2).bits_per_token("int8", "float32")
            1088
        """
        elements = self.key_elements_per_token + self.value_elements_per_token
        return kv_format(kv_dtype).row_bits(elements, compute_dtype, self.rows_per_token)


@dataclass(frozen=True)
class KVCacheCost:
    """KV-cache size of a model at one sequence length, batch size and element type.

    Attributes:
        dtype: element type of the cache.
        batch, seq_len: batch rows and tokens per row (decoder tokens for encoder-decoders).
        encoder_seq_len: encoder tokens the cross-attention cache holds (encoder-decoders;
            None otherwise).
        bytes_per_token: bytes one more token adds while no sliding window is full: the
            K and V elements of every attention layer for one token (the MLA latent for
            MLA), plus, for encoder-decoders, the cross-attention K and V of one encoder
            token in every decoder layer. Without windows (and, for encoder-decoders,
            with `encoder_seq_len == seq_len`) `total_bytes == batch * seq_len *
            bytes_per_token`.
        bytes_per_token_beyond_window: what one more token adds once every sliding
            window is full (only full-attention layers, and cross-attention, grow).
        total_bytes: the whole cache: `batch * sum over layers of cached_tokens *
            elements_per_token`, sliding layers capped at their window, layers without
            attention skipped; rounded up to whole bytes (int4). Quantized dtypes add one
            scale per token and KV head (`kv_formats`), in `compute_dtype`.
        mha_equivalent_bytes: the same model if every attention layer cached
            `num_attention_heads` key and value heads (of `head_dim` and
            `value_head_dim`) for the full length, no window, no latent.
        cache_format: "kv", "mla_latent" or "mla_expanded".
        applicable: False for encoder-only models, which keep no cache (all zero then).
        note: one line on anything special (window cap, latent, encoder-only).
        layers: per-layer detail (`LayerKVCache`), self-attention then cross-attention.

    Example:
        >>> cost = KVCacheCost("bfloat16", 1, 8, None, 4, 4, 32, 64, "kv", True, None, ())
        >>> cost.as_dict()["total_bytes"]
        32
    """

    dtype: str
    batch: int
    seq_len: int
    encoder_seq_len: int | None
    bytes_per_token: int
    bytes_per_token_beyond_window: int
    total_bytes: int
    mha_equivalent_bytes: int
    cache_format: str
    applicable: bool
    note: str | None
    layers: tuple[LayerKVCache, ...]

    def as_dict(self) -> dict:
        """Every field but the per-layer detail, as a plain (JSON-ready) dict, with the
        format's scales and the `init_cache` dtype that runs it (None: plan only).

        Example:
            >>> cost = KVCacheCost("int8", 1, 2, None, 1, 1, 2, 4, "kv", True, None, ())
            >>> cost.as_dict()["dtype"], cost.as_dict()["runtime_dtype"]
            ('int8', 'int8')
        """
        values = asdict(self)
        values.pop("layers")
        fmt = kv_format(self.dtype)
        values["scales"] = fmt.granularity if fmt.scaled else None
        values["runtime_dtype"] = fmt.runtime_dtype
        return values


# -- parameters ---------------------------------------------------------------------------------


def _linear(in_features: int, out_features: int, bias: bool) -> int:
    return in_features * out_features + (out_features if bias else 0)


def _norm(spec: ModelSpec, size: int) -> int:
    """Parameters of one residual norm of width `size`."""
    if not spec.norms.norm_affine:
        return 0
    if spec.norms.norm_type == "layer" and spec.norms.norm_bias:
        return 2 * size
    return size


def _qk_norm(kind: str | None, head_dim: int) -> int:
    """q_norm + k_norm over one head: RMS has a weight, LayerNorm a weight and a bias."""
    if kind is None:
        return 0
    per_norm = head_dim if kind == "rms" else 2 * head_dim
    return 2 * per_norm


def _self_attention(spec: ModelSpec) -> int:
    """One decoder (or decoder-only) attention block."""
    hidden, heads = spec.hidden_size, spec.attention.num_attention_heads
    if spec.attention.kv_lora_rank:
        return _mla_attention(spec)
    count = _linear(hidden, heads * spec.attention.head_dim, spec.attention.q_bias)
    count += _linear(
        hidden, spec.attention.num_key_value_heads * spec.attention.head_dim, spec.attention.k_bias
    )
    count += _linear(
        hidden,
        spec.attention.num_key_value_heads * spec.attention.value_head_dim,
        spec.attention.v_bias,
    )
    count += _linear(heads * spec.attention.value_head_dim, hidden, spec.attention.o_bias)
    return count + _qk_norm(spec.attention.qk_norm, spec.attention.head_dim)


def _mla_attention(spec: ModelSpec) -> int:
    """DeepSeek's MLA: low-rank query (optional), compressed KV with a shared rope key."""
    hidden, heads = spec.hidden_size, spec.attention.num_attention_heads
    qk_head_dim = spec.attention.qk_nope_head_dim + spec.attention.qk_rope_head_dim
    if spec.attention.q_lora_rank:
        query = (
            _linear(hidden, spec.attention.q_lora_rank, spec.attention.q_bias)
            + spec.attention.q_lora_rank
        )
        query += _linear(spec.attention.q_lora_rank, heads * qk_head_dim, False)
    else:
        query = _linear(hidden, heads * qk_head_dim, False)
    key_value = _linear(
        hidden, spec.attention.kv_lora_rank + spec.attention.qk_rope_head_dim, spec.attention.k_bias
    )
    key_value += spec.attention.kv_lora_rank  # kv_a_layernorm
    key_value += _linear(
        spec.attention.kv_lora_rank,
        heads * (spec.attention.qk_nope_head_dim + spec.attention.value_head_dim),
        False,
    )
    output = _linear(heads * spec.attention.value_head_dim, hidden, spec.attention.o_bias)
    return query + key_value + output


def _plain_attention(hidden: int, heads: int, head_dim: int, bias: bool) -> int:
    """Encoder self-attention and cross-attention: MHA with the same bias on q, k, v, o."""
    inner = heads * head_dim
    return 3 * _linear(hidden, inner, bias) + _linear(inner, hidden, bias)


def _mlp(hidden: int, inner: int, kind: str, bias: bool) -> int:
    if kind == "gated":
        return 2 * _linear(hidden, inner, bias) + _linear(inner, hidden, bias)
    return _linear(hidden, inner, bias) + _linear(inner, hidden, bias)


def _expert(spec: ModelSpec) -> int:
    """One routed expert: a gated MLP of `moe_intermediate_size` without biases."""
    return 3 * spec.hidden_size * spec.mlp.moe_intermediate_size


def _moe_block(spec: ModelSpec) -> int:
    count = spec.mlp.num_experts * spec.hidden_size  # router, no bias
    count += spec.mlp.num_experts * _expert(spec)
    if spec.mlp.num_shared_experts:
        count += _mlp(
            spec.hidden_size, spec.mlp.shared_expert_intermediate_size, "gated", spec.mlp.mlp_bias
        )
    return count


def _mamba_mixer(spec: ModelSpec) -> int:
    mamba, hidden = spec.mamba, spec.hidden_size
    inner = mamba.inner_size
    count = _linear(hidden, 2 * inner, mamba.proj_bias)  # in_proj
    count += inner * mamba.d_conv + (inner if mamba.conv_bias else 0)  # depthwise conv1d
    count += _linear(inner, mamba.dt_rank + 2 * mamba.d_state, False)  # x_proj
    count += _linear(mamba.dt_rank, inner, True)  # dt_proj
    count += inner * mamba.d_state + inner  # A_log, D
    count += _linear(inner, hidden, mamba.proj_bias)  # out_proj
    if mamba.inner_layernorms:
        count += mamba.dt_rank + 2 * mamba.d_state
    return count


def _vision_tower(spec: ModelSpec) -> int:
    """A SigLIP or CLIP vision tower and the multimodal projector, as transformers builds them.

    SigLIP: patch convolution with a bias, one position row per patch, optional attention-
    pooling head. CLIP: convolution without a bias, a class embedding and its position row,
    a LayerNorm before the encoder (`pre_layrnorm`). Both end in a LayerNorm.
    """
    vision = spec.vision
    width, inner, patch = vision.hidden_size, vision.intermediate_size, vision.patch_size
    layout = VISION_TOWER_LAYOUTS[vision.model_type]
    count = width * vision.num_channels * patch * patch + layout.patch_bias * width
    count += (vision.num_patches + layout.class_token) * width  # position embedding
    count += layout.class_token * width  # class_embedding
    count += layout.pre_layernorm * 2 * width
    per_layer = 4 * _linear(width, width, True) + 2 * (2 * width)
    per_layer += _linear(width, inner, True) + _linear(inner, width, True)
    count += vision.num_layers * per_layer + 2 * width  # post_layernorm
    if vision.use_head:
        # Attention-pooling head: probe, torch MultiheadAttention, LayerNorm, MLP.
        count += width + _linear(width, 3 * width, True) + _linear(width, width, True)
        count += 2 * width + _linear(width, inner, True) + _linear(inner, width, True)
    # The projector between the tower and the language model: the wrapper family's formula.
    projector = family_for(vision.projector).wrapper.projector_parameters
    return count + projector(vision, spec.hidden_size)


def parameter_counts(spec: ModelSpec) -> ParameterCounts:
    """Parameters of the model `spec.architecture` names, as transformers builds it.

    Tied weights count once (like `sum(p.numel() for p in model.parameters())`).

    Args:
        spec: a `ModelSpec` from `from_config`.

    Returns:
        `ParameterCounts` with the total and its parts (see the module docstring).

    Example:
        >>> from keras_mha.planning.spec import from_config
        >>> spec = from_config({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
        ...     "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
        ...     "vocab_size": 50257})
        >>> counts = parameter_counts(spec)
        >>> counts.total, counts.attention
        (124439808, 28348416)
    """
    hidden = spec.hidden_size
    embedding_width = spec.norms.word_embed_proj_dim or hidden
    attention = mlp = norms = other = 0

    embeddings = spec.vocab_size * embedding_width
    embeddings += (
        spec.positions.learned_position_tables * spec.positions.learned_position_rows * hidden
    )
    embeddings += spec.positions.token_type_vocab_size * hidden
    if embedding_width != hidden:
        embeddings += 2 * hidden * embedding_width  # OPT's project_in and project_out

    # Decoder (or only) stack: layers counted by kind, never enumerated one by one.
    num_layers = spec.num_hidden_layers
    mixer_layers = num_layers - spec.num_layers
    moe_layers = sum(spec.mlp.moe_layers)
    attention += spec.num_layers * _self_attention(spec)
    other += mixer_layers * _mamba_mixer(spec) if spec.mamba else 0
    mlp += (num_layers - moe_layers) * _mlp(
        hidden, spec.mlp.intermediate_size, spec.mlp.mlp_kind, spec.mlp.mlp_bias
    )
    mlp += moe_layers * _moe_block(spec) if moe_layers else 0
    norms += (
        num_layers * spec.norms.norms_per_layer
        + spec.norms.final_norms
        + spec.norms.embedding_norms
    ) * _norm(spec, hidden)

    if spec.is_encoder_decoder:
        bias = spec.attention.q_bias
        cross = _plain_attention(
            hidden, spec.attention.num_attention_heads, spec.attention.head_dim, bias
        )
        attention += spec.num_hidden_layers * cross
        encoder_attention = _plain_attention(
            hidden, spec.encoder.encoder_attention_heads, spec.encoder.encoder_head_dim, bias
        )
        attention += spec.encoder.num_encoder_layers * encoder_attention
        encoder_mlp = _mlp(
            hidden, spec.encoder.encoder_intermediate_size, spec.mlp.mlp_kind, spec.mlp.mlp_bias
        )
        mlp += spec.encoder.num_encoder_layers * encoder_mlp
        norms += (
            spec.encoder.num_encoder_layers
            * spec.encoder.encoder_norms_per_layer
            * _norm(spec, hidden)
        )
        if spec.attention.relative_attention_num_buckets:
            # T5: the first layer of each stack holds a (buckets, heads) bias table.
            attention += spec.attention.relative_attention_num_buckets * (
                spec.attention.num_attention_heads + spec.encoder.encoder_attention_heads
            )

    lm_head = 0
    if spec.head_kind == "lm":
        if not spec.tie_word_embeddings:
            lm_head += spec.vocab_size * embedding_width
        lm_head += spec.vocab_size if spec.lm_head_bias else 0
    elif spec.head_kind == "masked_lm":
        # BERT's prediction head: dense + LayerNorm transform, decoder tied to the embeddings.
        lm_head += _linear(hidden, hidden, True) + _norm(spec, hidden) + spec.vocab_size
        if not spec.tie_word_embeddings:
            # An untied decoder keeps its own weight and its own bias.
            lm_head += _linear(hidden, spec.vocab_size, True)
    if spec.pooler:
        other += _linear(hidden, hidden, True)
    vision = _vision_tower(spec) if spec.vision is not None else 0
    other += vision

    total = attention + embeddings + mlp + norms + lm_head + other
    active = None
    if moe_layers:
        # The spec guarantees num_experts_per_tok <= num_experts, so active <= total.
        unused_experts = spec.mlp.num_experts - spec.mlp.num_experts_per_tok
        active = total - moe_layers * unused_experts * _expert(spec)
    return ParameterCounts(
        total=total,
        attention=attention,
        embeddings=embeddings,
        mlp=mlp,
        norms=norms,
        lm_head=lm_head,
        other=other,
        active=active,
        vision=vision,
    )


# -- KV cache -----------------------------------------------------------------------------------


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive integer")
    return value


def _ceil_bytes(bits: int) -> int:
    return -(-bits // 8)


def kv_cache_cost(
    spec: ModelSpec,
    *,
    seq_len: int,
    batch: int = 1,
    kv_dtype: str = "bfloat16",
    encoder_seq_len: int | None = None,
    mla_cache: str = "latent",
    compute_dtype: str = "bfloat16",
) -> KVCacheCost:
    """KV-cache bytes of `spec` at `seq_len` tokens (see `KVCacheCost` for definitions).

    Args:
        spec: a `ModelSpec` from `from_config`.
        seq_len: tokens per sequence (decoder tokens for encoder-decoders).
        batch: sequences.
        kv_dtype: one of float32, bfloat16, float16, float8, int8, int4 (half a byte).
        encoder_seq_len: encoder tokens for encoder-decoders; `seq_len` when None.
        mla_cache: for MLA models, "latent" (`kv_lora_rank + qk_rope_head_dim` per token
            per layer: what DeepSeek's inference code, vLLM, SGLang and transformers >= 5
            cache) or "expanded" (keys of `num_heads * (qk_nope_head_dim +
            qk_rope_head_dim)` and values of `num_heads * v_head_dim` per token per layer:
            what transformers 4's DeepseekV2/V3 attention cached after `kv_b_proj`).
        compute_dtype: the dtype a quantized cache keeps its scales in (`kv_formats`).

    Raises:
        ValueError: a bad `kv_dtype`, `mla_cache`, `seq_len`, `batch` or `encoder_seq_len`.

    Example:
        >>> from keras_mha.planning.spec import from_config
        >>> spec = from_config({"model_type": "mistral", "hidden_size": 4096,
        ...     "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
        ...     "intermediate_size": 14336, "vocab_size": 32000, "sliding_window": 4096})
        >>> cost = kv_cache_cost(spec, seq_len=32768)
        >>> cost.total_bytes == 4096 * cost.bytes_per_token, cost.bytes_per_token_beyond_window
        (True, 0)
    """
    if kv_dtype not in KV_DTYPE_BITS:
        raise ValueError(
            f"kv_dtype={kv_dtype!r} is not supported; expected one of {list(KV_DTYPE_BITS)}"
        )
    if mla_cache not in MLA_CACHE_FORMATS:
        raise ValueError(f"mla_cache={mla_cache!r} must be one of {list(MLA_CACHE_FORMATS)}")
    seq_len = _positive_int("seq_len", seq_len)
    batch = _positive_int("batch", batch)
    if encoder_seq_len is not None:
        encoder_seq_len = _positive_int("encoder_seq_len", encoder_seq_len)
    if spec.is_encoder_decoder:
        encoder_seq_len = encoder_seq_len or seq_len
    else:
        encoder_seq_len = None
    fmt = kv_format(kv_dtype)
    bits = fmt.bits
    scale_bits = fmt.scale_bits(compute_dtype)
    heads = spec.attention.num_attention_heads

    if not spec.is_decoder:
        note = f"encoder-only {spec.model_type} model: bidirectional, so no KV cache is kept"
        return KVCacheCost(kv_dtype, batch, seq_len, None, 0, 0, 0, 0, "kv", False, note, ())

    if spec.attention.kv_lora_rank and mla_cache == "latent":
        cache_format = "mla_latent"
        key_elements, value_elements = (
            spec.attention.kv_lora_rank + spec.attention.qk_rope_head_dim,
            0,
        )
        rows = 1
    elif spec.attention.kv_lora_rank:
        cache_format = "mla_expanded"
        key_elements, value_elements = (
            heads * spec.attention.head_dim,
            heads * spec.attention.value_head_dim,
        )
        rows = 2 * heads
    else:
        cache_format = "kv"
        key_elements = spec.attention.num_key_value_heads * spec.attention.head_dim
        value_elements = spec.attention.num_key_value_heads * spec.attention.value_head_dim
        rows = 2 * spec.attention.num_key_value_heads
    mha_elements = heads * (spec.attention.head_dim + spec.attention.value_head_dim)

    # Totals by arithmetic over the layer counts (the per-layer detail below is only listed).
    counts = spec.layer_kind_counts()
    full, sliding = counts["full"], counts["sliding"]
    window_tokens = min(seq_len, spec.attention.sliding_window) if sliding else 0
    # Bits per token: the elements, plus one scale per row for the quantized dtypes.
    per_layer_token = (key_elements + value_elements) * bits + rows * scale_bits
    cross_layers = spec.num_hidden_layers if spec.is_encoder_decoder else 0
    cross_elements = heads * spec.attention.head_dim
    cross_per_token = cross_layers * (2 * cross_elements * bits + 2 * heads * scale_bits)
    cache_bits = per_layer_token * (full * seq_len + sliding * window_tokens)
    cache_bits += cross_per_token * (encoder_seq_len or 0)
    mha_elements_total = (full + sliding) * seq_len * mha_elements
    mha_elements_total += cross_layers * (encoder_seq_len or 0) * mha_elements
    layers = tuple(
        LayerKVCache(
            index,
            kind,
            window_tokens if kind == "sliding" else seq_len,
            key_elements,
            value_elements,
            rows,
        )
        for index, kind in enumerate(spec.layer_kinds)
        if kind != "none"
    ) + tuple(
        LayerKVCache(index, "cross", encoder_seq_len, cross_elements, cross_elements, 2 * heads)
        for index in range(cross_layers)
    )

    notes = []
    if sliding:
        notes.append(f"sliding-window layers hold at most {spec.attention.sliding_window} tokens")
    if cache_format == "mla_latent":
        notes.append(
            "MLA caches its latent (kv_lora_rank + qk_rope_head_dim per token and layer), "
            "not per-head keys and values"
        )
    if counts["none"]:
        notes.append(
            "layers without attention keep no KV cache (their recurrent state is not counted)"
        )
    return KVCacheCost(
        dtype=kv_dtype,
        batch=batch,
        seq_len=seq_len,
        encoder_seq_len=encoder_seq_len,
        bytes_per_token=_ceil_bytes((full + sliding) * per_layer_token + cross_per_token),
        bytes_per_token_beyond_window=_ceil_bytes(full * per_layer_token + cross_per_token),
        total_bytes=_ceil_bytes(batch * cache_bits),
        mha_equivalent_bytes=_ceil_bytes(
            batch
            * (
                mha_elements_total * bits
                + mha_elements_total // mha_elements * 2 * heads * scale_bits
            )
        ),
        cache_format=cache_format,
        applicable=True,
        note="; ".join(notes) or None,
        layers=layers,
    )


__all__ = [
    "KV_DTYPE_BITS",
    "KVCacheCost",
    "LayerKVCache",
    "MLA_CACHE_FORMATS",
    "ParameterCounts",
    "kv_cache_cost",
    "parameter_counts",
]
