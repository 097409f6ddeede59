"""Serving memory of one device: weights + KV cache + recurrent state + a prefill workspace,
for any weights format and any split across devices.

`ServingModel` reads the model once (its weights per pipeline stage, the KV cache's
per-layer layout, the widest transient) and then answers `(batch, seq_len) -> bytes` fast
enough for the fit search; `serving_memory` is the same figure with its parts. With
several devices every figure is that of the fullest device (the largest pipeline stage).
The formulas are in docs/concepts/memory-planner.md; the placement rules in
`keras_mha.planning.planner.placement`.
Pure Python.

Example:
    >>> from keras_mha.hub.config import load_config
    >>> from keras_mha.planning.spec import from_config
    >>> spec = from_config(load_config("bundled:meta-llama/Meta-Llama-3-8B").config)
    >>> one = serving_memory(spec, batch=1, seq_len=8192)
    >>> two = serving_memory(spec, batch=1, seq_len=8192, placement=Placement(2, 1))
    >>> one.kv_cache_bytes == 2 * two.kv_cache_bytes, one.weights_bytes > two.weights_bytes
    (True, True)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from keras_mha.errors import UsageError
from keras_mha.planning.costs import KV_DTYPE_BITS, kv_cache_cost
from keras_mha.planning.planner.inventory import WeightGroup, weight_groups
from keras_mha.planning.planner.placement import Placement, kv_share, weights_by_part
from keras_mha.planning.planner.quantization import WeightsFormat, dtype_format
from keras_mha.planning.spec import ModelSpec

DEFAULT_PREFILL_CHUNK = 2048
# Searches stop here: 2**40 tokens or sequences is "unbounded" for any memory size.
SEARCH_LIMIT = 2**40
DTYPES = tuple(KV_DTYPE_BITS)


@dataclass(frozen=True)
class ServingMemory:
    """Serving memory of one device at one batch and sequence length.

    With several devices (`tensor_parallel * pipeline_parallel > 1`) the figures are those
    of the fullest device, which holds pipeline stage `stage`.

    Example:
        >>> ServingMemory("bfloat16", "bfloat16", "bfloat16", 1, 8, 2048, 10, 4, 0, 2, 16).kv_dtype
        'bfloat16'
    """

    weights_dtype: str
    kv_dtype: str
    compute_dtype: str
    batch: int
    seq_len: int
    prefill_chunk: int
    weights_bytes: int
    kv_cache_bytes: int
    recurrent_state_bytes: int
    activation_bytes: int
    total_bytes: int
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    stage: int = 0

    def as_dict(self) -> dict:
        """JSON-ready.

        Example:
            >>> memory = ServingMemory("int4", "int8", "bfloat16", 1, 1, 1, 1, 1, 0, 1, 3)
            >>> memory.as_dict()["kv_dtype"]
            'int8'
        """
        return asdict(self)


def positive(name: str, value) -> int:
    """`value` if it is a positive int, else UsageError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(f"{name}={value!r} must be a positive integer", key=name, value=value)
    return value


def check_dtype(name: str, dtype: str) -> str:
    """`dtype` if it is one of `DTYPES`, else UsageError naming `name`."""
    if dtype not in KV_DTYPE_BITS:
        raise UsageError(
            f"{name}={dtype!r} is not supported; expected one of {', '.join(DTYPES)}",
            key=name,
            value=dtype,
        )
    return dtype


def compute_bytes_of(compute_dtype: str) -> int:
    """Bytes of one activation element; float32, bfloat16 or float16 only."""
    compute_bytes = KV_DTYPE_BITS[check_dtype("compute_dtype", compute_dtype)] // 8
    if compute_bytes < 2:
        raise UsageError(
            f"compute_dtype={compute_dtype!r}: activations are computed in float32, "
            "bfloat16 or float16",
            key="compute_dtype",
            value=compute_dtype,
        )
    return compute_bytes


# -- per-token elements of one layer -----------------------------------------------------------


def attention_elements(spec: ModelSpec) -> int:
    """Elements per token of one self-attention block's inputs and projections."""
    heads = spec.attention.num_attention_heads
    if spec.attention.kv_lora_rank:
        qk_head_dim = (spec.attention.qk_nope_head_dim or 0) + (
            spec.attention.qk_rope_head_dim or 0
        )
        elements = (spec.attention.q_lora_rank or 0) + heads * qk_head_dim  # query (low-rank input)
        elements += spec.attention.kv_lora_rank + (
            spec.attention.qk_rope_head_dim or 0
        )  # latent + rope key
        elements += heads * qk_head_dim + heads * spec.attention.value_head_dim  # expanded K and V
        return elements + heads * spec.attention.value_head_dim  # attention output
    key_value = spec.attention.num_key_value_heads * (
        spec.attention.head_dim + spec.attention.value_head_dim
    )
    return heads * spec.attention.head_dim + key_value + heads * spec.attention.value_head_dim


def mlp_elements(spec: ModelSpec, inner: int) -> int:
    return 3 * inner if spec.mlp.mlp_kind == "gated" else 2 * inner


def moe_elements(spec: ModelSpec) -> int:
    elements = spec.mlp.num_experts_per_tok * 3 * spec.mlp.moe_intermediate_size
    if spec.mlp.num_shared_experts:
        elements += 3 * spec.mlp.shared_expert_intermediate_size
    return elements


def mamba_elements(spec: ModelSpec) -> int:
    mamba = spec.mamba
    if mamba is None:
        return 0
    return 5 * mamba.inner_size + mamba.dt_rank + 2 * mamba.d_state


def is_moe_layer(spec: ModelSpec, index: int) -> bool:
    return bool(spec.mlp.num_experts and spec.mlp.moe_layers and spec.mlp.moe_layers[index])


def widest_elements(spec: ModelSpec) -> int:
    """The widest transient of any one layer, in elements per token (serving)."""
    widest = 0
    for index, kind in enumerate(spec.layer_kinds):
        mixer = mamba_elements(spec) if kind == "none" else attention_elements(spec)
        if is_moe_layer(spec, index):
            feed_forward = moe_elements(spec)
        else:
            feed_forward = mlp_elements(spec, spec.mlp.intermediate_size)
        widest = max(widest, mixer, feed_forward)
    if spec.is_encoder_decoder:
        encoder_attention = 4 * spec.encoder.encoder_attention_heads * spec.encoder.encoder_head_dim
        encoder_mlp = mlp_elements(spec, spec.encoder.encoder_intermediate_size)
        widest = max(widest, encoder_attention, encoder_mlp)
    return widest


# -- one device's share ---------------------------------------------------------------------


@dataclass(frozen=True)
class StageLayout:
    """What one device of one pipeline stage holds, read once from the model.

    Attributes:
        index: the stage.
        weights_bytes: its weights (all parts).
        expert_bytes: the routed experts within `weights_bytes` (for decode traffic).
        growing: KV-cache bits per token of its layers that cache every token (elements
            and, for a quantized cache, their scales: `kv_formats`).
        capped: `((window, bits per token), ...)` of its sliding layers.
        recurrent_bytes_per_row: Mamba state of its layers, per sequence.
        last: whether it holds the LM head (and so the logits).
        lookup_bytes: embedding tables within `weights_bytes` that a step reads one row of
            (not the token table when the LM head is tied to it).
    """

    index: int
    weights_bytes: int
    expert_bytes: int
    growing: int
    capped: tuple[tuple[int, int], ...]
    recurrent_bytes_per_row: int
    last: bool
    lookup_bytes: int = 0

    def kv_bits(self, seq_len: int) -> int:
        """KV-cache bits one sequence of `seq_len` tokens keeps on this device."""
        bits = seq_len * self.growing
        for window, per_token in self.capped:
            bits += min(seq_len, window) * per_token
        return bits


class ServingModel:
    """A model's serving memory on one device, precomputed for fast `(batch, seq_len)` calls.

    Example:
        >>> from keras_mha.hub.config import load_config
        >>> from keras_mha.planning.spec import from_config
        >>> spec = from_config(load_config("bundled:mistralai/Mistral-7B-v0.1").config)
        >>> serving = ServingModel(spec)
        >>> serving(2, 40000) == serving_memory(spec, batch=2, seq_len=40000).total_bytes
        True
    """

    def __init__(
        self,
        spec: ModelSpec,
        *,
        weights_format: WeightsFormat | None = None,
        kv_dtype: str = "bfloat16",
        compute_dtype: str = "bfloat16",
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        placement: Placement | None = None,
        groups: tuple[WeightGroup, ...] | None = None,
    ):
        self.spec = spec
        self.format = weights_format or dtype_format("bfloat16")
        self.kv_dtype = check_dtype("kv_dtype", kv_dtype)
        self.compute_dtype = compute_dtype
        self.compute_bytes = compute_bytes_of(compute_dtype)
        self.prefill_chunk = positive("prefill_chunk", prefill_chunk)
        self.placement = placement or Placement()
        self.groups = groups if groups is not None else weight_groups(spec)
        tensor_parallel = self.placement.tensor_parallel
        self.widest = -(-widest_elements(spec) // tensor_parallel)
        stages = self.placement.stages(spec)
        self.stages = tuple(
            self._stage(index, stage, index == 0, index == len(stages) - 1)
            for index, stage in enumerate(stages)
        )

    def _stage(self, index: int, stage: range, first: bool, last: bool) -> StageLayout:
        spec, tensor_parallel = self.spec, self.placement.tensor_parallel
        where = dict(tensor_parallel=tensor_parallel, first=first, last=last,
                     stage=None if self.placement.pipeline_parallel == 1 else stage)  # fmt: skip
        by_part = weights_by_part(self.groups, self.format, **where)
        experts = [group for group in self.groups if group.role == "expert"]
        expert_bytes = sum(weights_by_part(experts, self.format, **where).values())
        lookups = [group for group in self.groups if _is_lookup(spec, group)]
        lookup_bytes = sum(weights_by_part(lookups, self.format, **where).values())
        growing, capped = 0, {}
        if spec.is_decoder:
            self_share = kv_share(spec, tensor_parallel)
            heads = spec.attention.num_attention_heads
            cross_share = (-(-heads // tensor_parallel), heads)
            # At a length no window reaches, a sliding layer's cached tokens are its window.
            for layer in kv_cache_cost(spec, seq_len=SEARCH_LIMIT, kv_dtype=self.kv_dtype).layers:
                if layer.layer_index not in stage:
                    continue
                numerator, denominator = cross_share if layer.kind == "cross" else self_share
                bits = layer.bits_per_token(self.kv_dtype, self.compute_dtype)
                bits = bits * numerator // denominator
                if layer.kind == "sliding" and layer.cached_tokens < SEARCH_LIMIT:
                    capped[layer.cached_tokens] = capped.get(layer.cached_tokens, 0) + bits
                else:
                    growing += bits
        recurrent = 0
        if spec.mamba is not None:
            mamba_layers = sum(1 for i in stage if spec.layer_kinds[i] == "none")
            inner = -(-spec.mamba.inner_size // tensor_parallel)
            recurrent = mamba_layers * inner * (spec.mamba.d_state + spec.mamba.d_conv)
            recurrent *= self.compute_bytes
        return StageLayout(index, sum(by_part.values()), expert_bytes, growing,
                           tuple(capped.items()), recurrent, last, lookup_bytes)  # fmt: skip

    def workspace_bytes(self, stage: StageLayout, batch: int, seq_len: int) -> int:
        """One prefill chunk's transients on this device, plus float32 logits on the last
        stage (decoders: the last position of each sequence; masked LMs: every token)."""
        spec = self.spec
        tokens = batch * seq_len
        chunk = min(tokens, self.prefill_chunk) if spec.is_decoder else tokens
        workspace = chunk * (2 * spec.hidden_size + self.widest) * self.compute_bytes
        if stage.last and spec.is_decoder:
            workspace += 4 * batch * spec.vocab_size
        elif stage.last and spec.head_kind == "masked_lm":
            workspace += 4 * chunk * spec.vocab_size
        return workspace

    def kv_bytes(self, stage: StageLayout, batch: int, seq_len: int) -> int:
        return -(-batch * stage.kv_bits(seq_len) // 8)

    def stage_bytes(self, stage: StageLayout, batch: int, seq_len: int) -> int:
        return (
            stage.weights_bytes
            + self.kv_bytes(stage, batch, seq_len)
            + batch * stage.recurrent_bytes_per_row
            + self.workspace_bytes(stage, batch, seq_len)
        )

    def fullest(self, batch: int, seq_len: int) -> StageLayout:
        """The stage whose device needs the most memory at this batch and length."""
        return max(self.stages, key=lambda stage: self.stage_bytes(stage, batch, seq_len))

    def __call__(self, batch: int, seq_len: int) -> int:
        return max(self.stage_bytes(stage, batch, seq_len) for stage in self.stages)

    def memory(self, batch: int, seq_len: int) -> ServingMemory:
        """`ServingMemory` of the fullest device."""
        stage = self.fullest(batch, seq_len)
        kv = self.kv_bytes(stage, batch, seq_len)
        recurrent = batch * stage.recurrent_bytes_per_row
        workspace = self.workspace_bytes(stage, batch, seq_len)
        return ServingMemory(
            weights_dtype=self.format.id,
            kv_dtype=self.kv_dtype,
            compute_dtype=self.compute_dtype,
            batch=batch,
            seq_len=seq_len,
            prefill_chunk=self.prefill_chunk,
            weights_bytes=stage.weights_bytes,
            kv_cache_bytes=kv,
            recurrent_state_bytes=recurrent,
            activation_bytes=workspace,
            total_bytes=stage.weights_bytes + kv + recurrent + workspace,
            tensor_parallel=self.placement.tensor_parallel,
            pipeline_parallel=self.placement.pipeline_parallel,
            stage=stage.index,
        )


def _is_lookup(spec: ModelSpec, group: WeightGroup) -> bool:
    """An embedding table read by lookup; a tied token table is also the LM head."""
    if group.role != "embedding":
        return False
    width = spec.norms.word_embed_proj_dim or spec.hidden_size
    tied_head = spec.tie_word_embeddings and spec.head_kind in ("lm", "masked_lm")
    return not (tied_head and group.out_features == spec.vocab_size * width)


def resolve_format(weights_dtype: str, weights_format: WeightsFormat | None) -> WeightsFormat:
    """`weights_format`, or the plain/generic format of `weights_dtype`."""
    if weights_format is not None:
        return weights_format
    return dtype_format(check_dtype("weights_dtype", weights_dtype))


def serving_model(
    spec: ModelSpec,
    *,
    weights_dtype: str = "bfloat16",
    kv_dtype: str = "bfloat16",
    compute_dtype: str = "bfloat16",
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    counts=None,
    weights_format: WeightsFormat | None = None,
    placement: Placement | None = None,
) -> ServingModel:
    """A `ServingModel` from the planner's usual arguments: `weights_dtype` (a dtype of
    `DTYPES`) unless `weights_format` is given; `counts` is accepted for compatibility
    (the weights are counted per tensor).

    Example:
        >>> from keras_mha.planning.spec import from_config
        >>> spec = from_config({"model_type": "llama", "hidden_size": 64,
        ...     "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 128,
        ...     "vocab_size": 100})
        >>> serving_model(spec, weights_dtype="int8").format.id
        'int8'
    """
    del counts
    return ServingModel(
        spec,
        weights_format=resolve_format(weights_dtype, weights_format),
        kv_dtype=kv_dtype,
        compute_dtype=compute_dtype,
        prefill_chunk=prefill_chunk,
        placement=placement,
    )


def serving_memory(spec: ModelSpec, *, batch: int, seq_len: int, **options) -> ServingMemory:
    """Memory to serve `batch` sequences of `seq_len` tokens on one device (the fullest,
    with several); `options` as `serving_model` (formulas: docs/concepts/memory-planner.md).

    Example:
        >>> from keras_mha.hub.config import load_config
        >>> from keras_mha.planning.spec import from_config
        >>> spec = from_config(load_config("bundled:meta-llama/Meta-Llama-3-8B").config)
        >>> memory = serving_memory(spec, batch=1, seq_len=8192)
        >>> memory.kv_cache_bytes
        1073741824
    """
    batch, seq_len = positive("batch", batch), positive("seq_len", seq_len)
    return serving_model(spec, **options).memory(batch, seq_len)


__all__ = [
    "DEFAULT_PREFILL_CHUNK",
    "DTYPES",
    "SEARCH_LIMIT",
    "ServingMemory",
    "ServingModel",
    "StageLayout",
    "serving_memory",
    "serving_model",
]
