"""Every weight tensor of a `ModelSpec`, grouped by shape: what the quantization formats
and the multi-device split need beyond `parameter_counts`' totals.

A `WeightGroup` is `count` tensors of one shape: a matrix `(in_features, out_features)` of
a linear layer, or a vector / table of `elements`. Each says which part of
`ParameterCounts` it belongs to, its role (what quantization formats look at), where it
lives (decoder layers, or the first / last pipeline stage) and how tensor parallelism
splits it, the way vLLM's layers do:

| split | rule | used for |
|---|---|---|
| `column` | output features / devices | q, gate, up, fc1, MLA's q_b and kv_b, experts' up |
| `row` | input features / devices | o, down, fc2, experts' down (their bias is replicated) |
| `kv` | whole KV heads / devices, at least one each | k, v (replicated below one head each) |
| `vocab` | rows / devices | token, position and token-type embeddings, the LM head |
| `split` | elements / devices | Mamba's per-channel state, conv and biases of column layers |
| `replicated` | whole on every device | norms, routers, MLA's q_a and kv_a, poolers |

The groups add up to `parameter_counts(spec)`, part by part (a test checks it for every
bundled card). Pure Python.

Example:
    >>> from keras_mha.planning.spec import from_config
    >>> spec = from_config({"model_type": "llama", "hidden_size": 64,
    ...     "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
    ...     "intermediate_size": 128, "vocab_size": 100})
    >>> [(g.role, g.in_features, g.out_features, g.count) for g in weight_groups(spec)][:3]
    [('embedding', 0, 6400, 1), ('attention', 64, 64, 2), ('kv_projection', 64, 32, 2)]
"""

from __future__ import annotations

from dataclasses import dataclass

from keras_mha.planning.costs import parameter_counts
from keras_mha.planning.spec import ModelSpec

SPLITS = ("column", "row", "kv", "vocab", "split", "replicated")
# The roles of linear layers' weight matrices; everything else is a vector or table.
LINEAR_ROLES = (
    "attention", "kv_projection", "mla_down", "mlp", "expert", "shared_expert", "router",
    "mamba", "lm_head", "vision", "pooler", "projection",
)  # fmt: skip


@dataclass(frozen=True)
class WeightGroup:
    """`count` weight tensors of one shape (see the module docstring).

    Attributes:
        part: the `ParameterCounts` part (embeddings, attention, mlp, norms, lm_head, other).
        role: a `LINEAR_ROLES` entry for matrices; `embedding`, `norm`, `bias`, `state` or
            `other` for the rest.
        in_features: input features of a matrix; 0 for a vector or table.
        out_features: output features of a matrix, or the elements of a vector / table.
        count: tensors of this shape in the whole model.
        layers: decoder layer indices holding them (evenly), or () for `stage`.
        stage: "layer", or "first" / "last" pipeline stage for tensors outside the layers.
        split: tensor-parallel rule (see the module docstring).
        heads: KV heads in `out_features`, for the `kv` split.

    Example:
        >>> WeightGroup("mlp", "mlp", 4, 8, 2, (0, 1), "layer", "column").elements
        64
    """

    part: str
    role: str
    in_features: int
    out_features: int
    count: int
    layers: tuple[int, ...]
    stage: str
    split: str
    heads: int = 0

    @property
    def is_matrix(self) -> bool:
        """A linear layer's weight (what quantization formats may quantize)."""
        return self.in_features > 0

    @property
    def elements_each(self) -> int:
        """Elements of one tensor."""
        return self.in_features * self.out_features if self.is_matrix else self.out_features

    @property
    def elements(self) -> int:
        """Elements of all `count` tensors."""
        return self.count * self.elements_each

    def shard_shape(self, tensor_parallel: int) -> tuple[int, int]:
        """`(in_features, out_features)` held by one of `tensor_parallel` devices (for a
        vector, `(0, elements)`): ceil-divided along the split axis.

        Example:
            >>> group = WeightGroup("attention", "kv_projection", 64, 32, 1, (0,), "layer",
            ...                     "kv", heads=2)
            >>> group.shard_shape(2), group.shard_shape(4)  # 4 devices: one head each
            ((64, 16), (64, 16))
        """
        size_in, size_out = self.in_features, self.out_features
        if tensor_parallel == 1 or self.split == "replicated":
            return size_in, size_out
        if self.split == "row":
            return -(-size_in // tensor_parallel), size_out
        if self.split == "kv":
            heads_each = max(1, -(-self.heads // tensor_parallel))
            return size_in, size_out // self.heads * heads_each
        return size_in, -(-size_out // tensor_parallel)  # column, vocab, split


def _matrix(groups, part, role, size_in, size_out, count, layers, split, *, bias=False,
            heads=0, bias_split=None, stage="layer"):  # fmt: skip
    if count <= 0 or size_in <= 0 or size_out <= 0:
        return
    groups.append(WeightGroup(part, role, size_in, size_out, count, layers, stage, split, heads))
    if bias:
        if bias_split is None:
            bias_split = "replicated" if split in ("row", "replicated") else split
        groups.append(
            WeightGroup(part, "bias", 0, size_out, count, layers, stage, bias_split, heads)
        )


def _vector(groups, part, role, elements, count, layers, split, stage="layer"):
    if count > 0 and elements > 0:
        groups.append(WeightGroup(part, role, 0, elements, count, layers, stage, split))


def _norm_elements(spec: ModelSpec, size: int) -> int:
    if not spec.norms.norm_affine:
        return 0
    return 2 * size if spec.norms.norm_type == "layer" and spec.norms.norm_bias else size


def _attention(groups, spec: ModelSpec, layers: tuple[int, ...]):
    att = spec.attention
    hidden, heads, count = spec.hidden_size, att.num_attention_heads, len(layers)
    if att.kv_lora_rank:
        qk_head_dim = att.qk_nope_head_dim + att.qk_rope_head_dim
        if att.q_lora_rank:
            _matrix(groups, "attention", "mla_down", hidden, att.q_lora_rank, count, layers,
                    "replicated", bias=att.q_bias)  # fmt: skip
            _vector(groups, "attention", "norm", att.q_lora_rank, count, layers, "replicated")
            _matrix(groups, "attention", "attention", att.q_lora_rank, heads * qk_head_dim,
                    count, layers, "column")  # fmt: skip
        else:
            _matrix(groups, "attention", "attention", hidden, heads * qk_head_dim, count,
                    layers, "column")  # fmt: skip
        _matrix(groups, "attention", "mla_down", hidden,
                att.kv_lora_rank + att.qk_rope_head_dim, count, layers, "replicated",
                bias=att.k_bias)  # fmt: skip
        _vector(groups, "attention", "norm", att.kv_lora_rank, count, layers, "replicated")
        _matrix(groups, "attention", "attention", att.kv_lora_rank,
                heads * (att.qk_nope_head_dim + att.value_head_dim), count, layers,
                "column")  # fmt: skip
        _matrix(groups, "attention", "attention", heads * att.value_head_dim, hidden, count,
                layers, "row", bias=att.o_bias)  # fmt: skip
        return
    kv_heads = att.num_key_value_heads
    _matrix(groups, "attention", "attention", hidden, heads * att.head_dim, count, layers,
            "column", bias=att.q_bias)  # fmt: skip
    _matrix(groups, "attention", "kv_projection", hidden, kv_heads * att.head_dim, count,
            layers, "kv", bias=att.k_bias, heads=kv_heads)  # fmt: skip
    _matrix(groups, "attention", "kv_projection", hidden, kv_heads * att.value_head_dim,
            count, layers, "kv", bias=att.v_bias, heads=kv_heads)  # fmt: skip
    _matrix(groups, "attention", "attention", heads * att.value_head_dim, hidden, count,
            layers, "row", bias=att.o_bias)  # fmt: skip
    if att.qk_norm:
        per_norm = att.head_dim if att.qk_norm == "rms" else 2 * att.head_dim
        _vector(groups, "attention", "norm", per_norm, 2 * count, layers, "replicated")


def _plain_attention(groups, hidden, heads, head_dim, bias, layers, stage, count):
    """Encoder self-attention and cross-attention: q, k, v and o with the same bias."""
    inner = heads * head_dim
    for role, split in (("attention", "column"), ("kv_projection", "kv"),
                        ("kv_projection", "kv")):  # fmt: skip
        _matrix(groups, "attention", role, hidden, inner, count, layers, split, bias=bias,
                heads=heads if split == "kv" else 0, stage=stage)  # fmt: skip
    _matrix(groups, "attention", "attention", inner, hidden, count, layers, "row", bias=bias,
            stage=stage)  # fmt: skip


def _mlp(groups, part, role, hidden, inner, kind, bias, count, layers, stage="layer"):
    if kind == "gated":
        _matrix(groups, part, role, hidden, inner, 2 * count, layers, "column", bias=bias,
                stage=stage)  # fmt: skip
    else:
        _matrix(groups, part, role, hidden, inner, count, layers, "column", bias=bias,
                stage=stage)  # fmt: skip
    _matrix(groups, part, role, inner, hidden, count, layers, "row", bias=bias, stage=stage)


def _moe(groups, spec: ModelSpec, layers: tuple[int, ...]):
    hidden, count, experts = spec.hidden_size, len(layers), spec.mlp.num_experts
    _matrix(groups, "mlp", "router", hidden, experts, count, layers, "replicated")
    inner = spec.mlp.moe_intermediate_size
    _matrix(groups, "mlp", "expert", hidden, inner, 2 * experts * count, layers, "column")
    _matrix(groups, "mlp", "expert", inner, hidden, experts * count, layers, "row")
    if spec.mlp.num_shared_experts:
        _mlp(groups, "mlp", "shared_expert", hidden, spec.mlp.shared_expert_intermediate_size,
             "gated", spec.mlp.mlp_bias, count, layers)  # fmt: skip


def _mamba(groups, spec: ModelSpec, layers: tuple[int, ...]):
    mamba, hidden, count = spec.mamba, spec.hidden_size, len(layers)
    inner = mamba.inner_size
    _matrix(groups, "other", "mamba", hidden, 2 * inner, count, layers, "column",
            bias=mamba.proj_bias)  # fmt: skip
    _vector(groups, "other", "state", inner * mamba.d_conv + (inner if mamba.conv_bias else 0),
            count, layers, "split")  # fmt: skip
    _matrix(groups, "other", "mamba", inner, mamba.dt_rank + 2 * mamba.d_state, count, layers,
            "row")  # fmt: skip
    _matrix(groups, "other", "mamba", mamba.dt_rank, inner, count, layers, "column", bias=True)
    _vector(groups, "other", "state", inner * mamba.d_state + inner, count, layers, "split")
    _matrix(groups, "other", "mamba", inner, hidden, count, layers, "row",
            bias=mamba.proj_bias)  # fmt: skip
    if mamba.inner_layernorms:
        _vector(groups, "other", "norm", mamba.dt_rank + 2 * mamba.d_state, count, layers,
                "replicated")  # fmt: skip


def _vision(groups, spec: ModelSpec, vision_total: int):
    """The vision tower's linear layers; its convolution, position table, norms and
    projector's remainder as one `other` group (all on the first pipeline stage)."""
    vision = spec.vision
    width, inner, count = vision.hidden_size, vision.intermediate_size, vision.num_layers
    before = sum(group.elements for group in groups)
    _matrix(groups, "other", "vision", width, width, 3 * count, (), "column", bias=True,
            stage="first")  # fmt: skip
    _matrix(groups, "other", "vision", width, width, count, (), "row", bias=True, stage="first")
    _matrix(groups, "other", "vision", width, inner, count, (), "column", bias=True,
            stage="first")  # fmt: skip
    _matrix(groups, "other", "vision", inner, width, count, (), "row", bias=True, stage="first")
    rest = vision_total - (sum(group.elements for group in groups) - before)
    _vector(groups, "other", "other", rest, 1, (), "replicated", stage="first")


def weight_groups(spec: ModelSpec) -> tuple[WeightGroup, ...]:
    """Every weight of `spec`, grouped by shape (see the module docstring).

    Example:
        >>> from keras_mha.planning.spec import from_config
        >>> spec = from_config({"model_type": "gpt2", "n_embd": 64, "n_head": 4,
        ...     "n_layer": 2, "n_positions": 128, "vocab_size": 100})
        >>> sum(group.elements for group in weight_groups(spec)) == parameter_counts(spec).total
        True
    """
    groups: list[WeightGroup] = []
    att, enc = spec.attention, spec.encoder
    hidden = spec.hidden_size
    width = spec.norms.word_embed_proj_dim or hidden
    _vector(groups, "embeddings", "embedding", spec.vocab_size * width, 1, (), "vocab", "first")
    _vector(groups, "embeddings", "embedding", spec.positions.learned_position_rows * hidden,
            spec.positions.learned_position_tables, (), "vocab", "first")  # fmt: skip
    _vector(groups, "embeddings", "embedding", spec.positions.token_type_vocab_size * hidden, 1, (),
            "vocab", "first")  # fmt: skip
    if width != hidden:  # OPT's project_in / project_out
        _matrix(groups, "embeddings", "projection", width, hidden, 1, (), "replicated",
                stage="first")  # fmt: skip
        _matrix(groups, "embeddings", "projection", hidden, width, 1, (), "replicated",
                stage="last")  # fmt: skip

    kinds = spec.layer_kinds
    attention_layers = tuple(i for i, kind in enumerate(kinds) if kind != "none")
    mixer_layers = tuple(i for i, kind in enumerate(kinds) if kind == "none")
    moe = tuple(i for i in range(len(kinds)) if spec.mlp.moe_layers and spec.mlp.moe_layers[i])
    dense = tuple(i for i in range(len(kinds)) if i not in set(moe))
    if attention_layers:
        _attention(groups, spec, attention_layers)
    if spec.mamba and mixer_layers:
        _mamba(groups, spec, mixer_layers)
    if dense:
        _mlp(groups, "mlp", "mlp", hidden, spec.mlp.intermediate_size, spec.mlp.mlp_kind,
             spec.mlp.mlp_bias, len(dense), dense)  # fmt: skip
    if moe and spec.mlp.num_experts:
        _moe(groups, spec, moe)
    norm = _norm_elements(spec, hidden)
    all_layers = tuple(range(len(kinds)))
    _vector(groups, "norms", "norm", norm, len(kinds) * spec.norms.norms_per_layer, all_layers,
            "replicated")  # fmt: skip
    _vector(groups, "norms", "norm", norm, spec.norms.final_norms, (), "replicated", "last")
    _vector(groups, "norms", "norm", norm, spec.norms.embedding_norms, (), "replicated", "first")

    if spec.is_encoder_decoder:
        # Cross-attention in every decoder layer; the encoder on the first stage.
        _plain_attention(groups, hidden, att.num_attention_heads, att.head_dim, att.q_bias,
                         all_layers, "layer", len(all_layers))  # fmt: skip
        encoder = enc.num_encoder_layers
        _plain_attention(groups, hidden, enc.encoder_attention_heads, enc.encoder_head_dim,
                         att.q_bias, (), "first", encoder)  # fmt: skip
        _mlp(groups, "mlp", "mlp", hidden, enc.encoder_intermediate_size, spec.mlp.mlp_kind,
             spec.mlp.mlp_bias, encoder, (), "first")  # fmt: skip
        _vector(groups, "norms", "norm", norm, encoder * enc.encoder_norms_per_layer, (),
                "replicated", "first")  # fmt: skip
        if att.relative_attention_num_buckets:
            _vector(groups, "attention", "other", att.relative_attention_num_buckets * (
                att.num_attention_heads + enc.encoder_attention_heads), 1, (), "replicated",
                "first")  # fmt: skip

    if spec.head_kind == "lm":
        if not spec.tie_word_embeddings:
            _matrix(groups, "lm_head", "lm_head", width, spec.vocab_size, 1, (), "vocab",
                    stage="last")  # fmt: skip
        _vector(groups, "lm_head", "bias", spec.vocab_size if spec.lm_head_bias else 0, 1, (),
                "vocab", "last")  # fmt: skip
    elif spec.head_kind == "masked_lm":
        _matrix(groups, "lm_head", "pooler", hidden, hidden, 1, (), "replicated", bias=True,
                stage="last")  # fmt: skip
        _vector(groups, "lm_head", "norm", norm, 1, (), "replicated", "last")
        _vector(groups, "lm_head", "bias", spec.vocab_size, 1, (), "vocab", "last")
        if not spec.tie_word_embeddings:
            _matrix(groups, "lm_head", "lm_head", hidden, spec.vocab_size, 1, (), "vocab",
                    bias=True, stage="last")  # fmt: skip
    if spec.pooler:
        _matrix(groups, "other", "pooler", hidden, hidden, 1, (), "replicated", bias=True,
                stage="last")  # fmt: skip
    if spec.vision is not None:
        _vision(groups, spec, parameter_counts(spec).vision)
    return tuple(groups)


__all__ = ["LINEAR_ROLES", "SPLITS", "WeightGroup", "weight_groups"]
