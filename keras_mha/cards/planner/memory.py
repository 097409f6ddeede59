"""Will it fit? Weights, serving and training memory of a `ModelSpec`, and the largest
context and batch a memory size holds. Pure Python: no keras, backend or numpy import.

- `weights_bytes(counts, dtype)`: the weights per part of `parameter_counts`; the
  quantized types (int8, int4, float8) with their scales.
- `serving_memory(spec, ...)`: weights + KV cache + recurrent state + the workspace of
  one prefill chunk.
- `training_memory(spec, ...)`: weights + gradients + optimizer state + activations,
  with and without activation checkpointing.
- `plan_fit(spec, memory_bytes, ...)`: the largest context and batch that fit, per KV
  dtype, and whether training fits.

Every figure is in bytes and follows one written formula; `plan_fit` inverts the same
formulas by search. The formulas and their sources: docs/concepts/memory-planner.md.

Example:
    >>> from keras_mha.hub.config import load_config
    >>> from keras_mha.cards.spec import from_config
    >>> from keras_mha.cards.costs import parameter_counts
    >>> spec = from_config(load_config("bundled:meta-llama/Meta-Llama-3-8B").config)
    >>> counts = parameter_counts(spec)
    >>> weights_bytes(counts, "bfloat16").total == 2 * counts.total
    True
    >>> plan_fit(spec, memory_bytes=80 * 2**30, batch=1, seq_len=8192).max_seq_len
    531224
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from keras_mha.cards.costs import KV_DTYPE_BITS, ParameterCounts, kv_cache_cost, parameter_counts
from keras_mha.cards.spec import ModelSpec
from keras_mha.errors import UsageError

DTYPES = tuple(KV_DTYPE_BITS)
PARTS = ("embeddings", "attention", "mlp", "norms", "lm_head", "other")


@dataclass(frozen=True)
class Quantization:
    """How a quantized dtype stores weights: bits per weight and a scale per group.

    Example:
        >>> Quantization(bits=4, group_size=128, scale_bytes=2).scale_overhead(256)
        4
    """

    bits: int
    group_size: int
    scale_bytes: int

    def scale_overhead(self, weights: int) -> int:
        """Bytes of scales for `weights` weights: one scale per started group."""
        return -(-weights // self.group_size) * self.scale_bytes


QUANTIZATION = {
    "float8": Quantization(bits=8, group_size=128 * 128, scale_bytes=4),
    "int8": Quantization(bits=8, group_size=128, scale_bytes=2),
    "int4": Quantization(bits=4, group_size=128, scale_bytes=2),
}
QUANTIZED_PARTS = ("attention", "mlp", "other")
# What the parts that are not quantized are stored in.
UNQUANTIZED_DTYPE = "bfloat16"

# Training precisions: bytes per parameter of weights, float32 master copy and gradients,
# and the element type of activations (see the module docstring).
TRAINING_PRECISIONS = {
    "float32": {"weights": 4, "master": 0, "gradients": 4, "compute_dtype": "float32"},
    "mixed": {"weights": 2, "master": 4, "gradients": 2, "compute_dtype": "bfloat16"},
    "bfloat16": {"weights": 2, "master": 0, "gradients": 2, "compute_dtype": "bfloat16"},
}
# Float32 moments per parameter.
OPTIMIZER_MOMENTS = {"adamw": 2, "adam": 2, "sgd-momentum": 1, "sgd": 0}
# Keras optimizers also keep a step counter (int64 on TensorFlow, int32 on JAX and PyTorch)
# and the learning rate (float32): at most 12 bytes.
OPTIMIZER_SCALAR_BYTES = 12
DEFAULT_PREFILL_CHUNK = 2048
# Searches stop here: 2**40 tokens or sequences is "unbounded" for any memory size.
SEARCH_LIMIT = 2**40


# -- weights ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightsBytes:
    """Bytes of a model's weights in one dtype, in total and per part.

    Attributes:
        dtype: float32, bfloat16, float16, float8, int8 or int4.
        total: the sum of `by_part`.
        by_part: bytes of each part of `ParameterCounts` (scales included).
        scale_bytes: the quantization scales within `total` (0 for unquantized dtypes).

    Example:
        >>> WeightsBytes("bfloat16", 4, {"attention": 4}, 0).total
        4
    """

    dtype: str
    total: int
    by_part: dict
    scale_bytes: int

    def as_dict(self) -> dict:
        """JSON-ready.

        Example:
            >>> WeightsBytes("int8", 1, {"mlp": 1}, 0).as_dict()["by_part"]
            {'mlp': 1}
        """
        return asdict(self)


def _check_dtype(name: str, dtype: str) -> str:
    if dtype not in KV_DTYPE_BITS:
        raise UsageError(
            f"{name}={dtype!r} is not supported; expected one of {', '.join(DTYPES)}",
            key=name,
            value=dtype,
        )
    return dtype


def _bytes_of(elements: int, dtype: str) -> int:
    return -(-elements * KV_DTYPE_BITS[dtype] // 8)


def weights_bytes(counts: ParameterCounts, dtype: str) -> WeightsBytes:
    """Bytes of the weights in `dtype` (quantization rule and scales: module docstring).

    Example:
        >>> counts = ParameterCounts(total=1280, attention=1024, embeddings=256, mlp=0,
        ...                          norms=0, lm_head=0, other=0, active=None)
        >>> weights_bytes(counts, "int4").by_part["attention"]  # 512 + 8 groups * 2 bytes
        528
        >>> weights_bytes(counts, "int4").by_part["embeddings"]  # kept in bfloat16
        512
    """
    _check_dtype("weights_dtype", dtype)
    scheme = QUANTIZATION.get(dtype)
    by_part, scales = {}, 0
    for part in PARTS:
        count = getattr(counts, part)
        if scheme is None:
            by_part[part] = _bytes_of(count, dtype)
        elif part in QUANTIZED_PARTS:
            part_scales = scheme.scale_overhead(count)
            by_part[part] = -(-count * scheme.bits // 8) + part_scales
            scales += part_scales
        else:
            by_part[part] = _bytes_of(count, UNQUANTIZED_DTYPE)
    return WeightsBytes(dtype, sum(by_part.values()), by_part, scales)


def weights_bytes_by_dtype(counts: ParameterCounts) -> dict[str, WeightsBytes]:
    """`weights_bytes` for every dtype, float32 first.

    Example:
        >>> counts = ParameterCounts(8, 8, 0, 0, 0, 0, 0, None)
        >>> {dtype: w.total for dtype, w in weights_bytes_by_dtype(counts).items()}["float32"]
        32
    """
    return {dtype: weights_bytes(counts, dtype) for dtype in DTYPES}


# -- per-token elements of one layer ------------------------------------------------------------


def _attention_elements(spec: ModelSpec) -> int:
    """Elements per token of one self-attention block's inputs and projections."""
    heads = spec.num_attention_heads
    if spec.kv_lora_rank:
        qk_head_dim = (spec.qk_nope_head_dim or 0) + (spec.qk_rope_head_dim or 0)
        elements = (spec.q_lora_rank or 0) + heads * qk_head_dim  # query (low-rank input)
        elements += spec.kv_lora_rank + (spec.qk_rope_head_dim or 0)  # latent + rope key
        elements += heads * qk_head_dim + heads * spec.value_head_dim  # expanded K and V
        return elements + heads * spec.value_head_dim  # attention output
    key_value = spec.num_key_value_heads * (spec.head_dim + spec.value_head_dim)
    return heads * spec.head_dim + key_value + heads * spec.value_head_dim


def _mlp_elements(spec: ModelSpec, inner: int) -> int:
    return 3 * inner if spec.mlp_kind == "gated" else 2 * inner


def _moe_elements(spec: ModelSpec) -> int:
    elements = spec.num_experts_per_tok * 3 * spec.moe_intermediate_size
    if spec.num_shared_experts:
        elements += 3 * spec.shared_expert_intermediate_size
    return elements


def _mamba_elements(spec: ModelSpec) -> int:
    mamba = spec.mamba
    if mamba is None:
        return 0
    return 5 * mamba.inner_size + mamba.dt_rank + 2 * mamba.d_state


def _is_moe_layer(spec: ModelSpec, index: int) -> bool:
    return bool(spec.num_experts and spec.moe_layers and spec.moe_layers[index])


@dataclass(frozen=True)
class _LayerActivations:
    """Per-token activation bytes of one layer in training: compute-dtype elements and
    float32 bytes (log-sum-exp, router logits), plus elements per encoder token."""

    elements: int
    float32_bytes: int
    encoder_elements: int = 0

    def bytes(self, tokens: int, encoder_tokens: int, compute_bytes: int) -> int:
        per_token = self.elements * compute_bytes + self.float32_bytes
        return tokens * per_token + encoder_tokens * self.encoder_elements * compute_bytes


def _decoder_layers(spec: ModelSpec) -> list[_LayerActivations]:
    hidden, heads = spec.hidden_size, spec.num_attention_heads
    layers = []
    for index, kind in enumerate(spec.layer_kinds):
        elements = spec.norms_per_layer * hidden + 2 * hidden  # norm inputs, block inputs
        float32_bytes = 0
        if kind == "none":
            elements += _mamba_elements(spec)
        else:
            elements += _attention_elements(spec)
            float32_bytes += 4 * heads  # flash attention's log-sum-exp
        if _is_moe_layer(spec, index):
            elements += _moe_elements(spec)
            float32_bytes += 4 * spec.num_experts  # router logits
        else:
            elements += _mlp_elements(spec, spec.intermediate_size)
        encoder_elements = 0
        if spec.is_encoder_decoder:
            inner = heads * spec.head_dim
            elements += hidden + 2 * inner  # cross-attention: normed input, Q, output
            float32_bytes += 4 * heads
            encoder_elements = 2 * inner  # its K and V over the encoder's tokens
        layers.append(_LayerActivations(elements, float32_bytes, encoder_elements))
    return layers


def _encoder_layers(spec: ModelSpec) -> list[_LayerActivations]:
    if not spec.is_encoder_decoder:
        return []
    hidden = spec.hidden_size
    inner = spec.encoder_attention_heads * spec.encoder_head_dim
    elements = spec.encoder_norms_per_layer * hidden + 2 * hidden + 4 * inner
    elements += _mlp_elements(spec, spec.encoder_intermediate_size)
    layer = _LayerActivations(elements, 4 * spec.encoder_attention_heads)
    return [layer] * spec.num_encoder_layers


# -- training -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingMemory:
    """Training memory at one batch and sequence length (formulas: module docstring).

    `total_bytes` = weights + master weights + gradients + optimizer + activations;
    `total_bytes_checkpointed` the same with `activation_bytes_checkpointed`.

    Example:
        >>> TrainingMemory("adamw", "mixed", 1, 8, 2, 4, 2, 16, 10, 5, 34, 29).total_bytes
        34
    """

    optimizer: str
    precision: str
    batch: int
    seq_len: int
    weights_bytes: int
    master_weights_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    activation_bytes_checkpointed: int
    total_bytes: int
    total_bytes_checkpointed: int

    def as_dict(self) -> dict:
        """JSON-ready.

        Example:
            >>> memory = TrainingMemory("sgd", "float32", 1, 1, 4, 0, 4, 8, 1, 1, 17, 17)
            >>> memory.as_dict()["optimizer"]
            'sgd'
        """
        return asdict(self)


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(f"{name}={value!r} must be a positive integer", key=name, value=value)
    return value


def _check_choice(name: str, value: str, choices) -> str:
    if value not in choices:
        raise UsageError(
            f"{name}={value!r} is not supported; expected one of {', '.join(choices)}",
            key=name,
            value=value,
        )
    return value


def training_state_bytes(
    parameters: int, *, optimizer: str = "adamw", precision: str = "mixed"
) -> dict[str, int]:
    """Weights, master weights, gradients and optimizer state of `parameters` parameters.

    Example:
        >>> training_state_bytes(1000, optimizer="adamw", precision="mixed")
        {'weights': 2000, 'master_weights': 4000, 'gradients': 2000, 'optimizer': 8012}
    """
    _check_choice("optimizer", optimizer, OPTIMIZER_MOMENTS)
    _check_choice("precision", precision, TRAINING_PRECISIONS)
    table = TRAINING_PRECISIONS[precision]
    return {
        "weights": parameters * table["weights"],
        "master_weights": parameters * table["master"],
        "gradients": parameters * table["gradients"],
        "optimizer": parameters * 4 * OPTIMIZER_MOMENTS[optimizer] + OPTIMIZER_SCALAR_BYTES,
    }


def activation_bytes(
    spec: ModelSpec, *, batch: int, seq_len: int, compute_dtype: str = "bfloat16"
) -> tuple[int, int]:
    """Training activations without and with full activation checkpointing.

    Example:
        >>> from keras_mha.cards.spec import from_config
        >>> spec = from_config({"model_type": "llama", "hidden_size": 64,
        ...     "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
        ...     "intermediate_size": 128, "vocab_size": 100})
        >>> full, checkpointed = activation_bytes(spec, batch=1, seq_len=8)
        >>> checkpointed < full
        True
    """
    batch, seq_len = _positive("batch", batch), _positive("seq_len", seq_len)
    compute_bytes = KV_DTYPE_BITS[_check_dtype("compute_dtype", compute_dtype)] // 8
    tokens = batch * seq_len
    layers = _encoder_layers(spec) + _decoder_layers(spec)
    per_layer = [layer.bytes(tokens, tokens, compute_bytes) for layer in layers]
    end = tokens * (2 * spec.hidden_size * compute_bytes + 4 * spec.vocab_size)
    if not spec.is_decoder and spec.head_kind != "masked_lm":
        end = tokens * spec.hidden_size * compute_bytes  # no vocabulary logits
    layer_inputs = len(layers) * tokens * spec.hidden_size * compute_bytes
    full = sum(per_layer) + end
    checkpointed = layer_inputs + max(per_layer, default=0) + end
    return full, min(full, checkpointed)


def training_memory(
    spec: ModelSpec,
    *,
    batch: int,
    seq_len: int,
    optimizer: str = "adamw",
    precision: str = "mixed",
    counts: ParameterCounts | None = None,
) -> TrainingMemory:
    """Memory to train every parameter of `spec` (formulas: module docstring).

    Example:
        >>> from keras_mha.cards.spec import from_config
        >>> spec = from_config({"model_type": "gpt2", "n_embd": 64, "n_head": 4,
        ...     "n_layer": 2, "n_positions": 128, "vocab_size": 100})
        >>> memory = training_memory(spec, batch=2, seq_len=16, optimizer="sgd")
        >>> memory.total_bytes > memory.total_bytes_checkpointed
        True
    """
    counts = counts or parameter_counts(spec)
    state = training_state_bytes(counts.total, optimizer=optimizer, precision=precision)
    compute_dtype = TRAINING_PRECISIONS[precision]["compute_dtype"]
    full, checkpointed = activation_bytes(
        spec, batch=batch, seq_len=seq_len, compute_dtype=compute_dtype
    )
    fixed = sum(state.values())
    return TrainingMemory(
        optimizer=optimizer,
        precision=precision,
        batch=batch,
        seq_len=seq_len,
        weights_bytes=state["weights"],
        master_weights_bytes=state["master_weights"],
        gradient_bytes=state["gradients"],
        optimizer_bytes=state["optimizer"],
        activation_bytes=full,
        activation_bytes_checkpointed=checkpointed,
        total_bytes=fixed + full,
        total_bytes_checkpointed=fixed + checkpointed,
    )


# -- serving ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServingMemory:
    """Serving memory at one batch and sequence length (formulas: module docstring).

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

    def as_dict(self) -> dict:
        """JSON-ready.

        Example:
            >>> memory = ServingMemory("int4", "int8", "bfloat16", 1, 1, 1, 1, 1, 0, 1, 3)
            >>> memory.as_dict()["kv_dtype"]
            'int8'
        """
        return asdict(self)


def _recurrent_state_bytes(spec: ModelSpec, batch: int, compute_bytes: int) -> int:
    if spec.mamba is None:
        return 0
    mamba_layers = sum(1 for kind in spec.layer_kinds if kind == "none")
    per_layer = spec.mamba.inner_size * (spec.mamba.d_state + spec.mamba.d_conv)
    return batch * mamba_layers * per_layer * compute_bytes


def _widest_elements(spec: ModelSpec) -> int:
    """The widest transient of any one layer, in elements per token (serving)."""
    widest = 0
    for index, kind in enumerate(spec.layer_kinds):
        mixer = _mamba_elements(spec) if kind == "none" else _attention_elements(spec)
        if _is_moe_layer(spec, index):
            feed_forward = _moe_elements(spec)
        else:
            feed_forward = _mlp_elements(spec, spec.intermediate_size)
        widest = max(widest, mixer, feed_forward)
    if spec.is_encoder_decoder:
        encoder_attention = 4 * spec.encoder_attention_heads * spec.encoder_head_dim
        encoder_mlp = _mlp_elements(spec, spec.encoder_intermediate_size)
        widest = max(widest, encoder_attention, encoder_mlp)
    return widest


def _workspace_bytes(
    spec: ModelSpec,
    batch: int,
    seq_len: int,
    compute_bytes: int,
    prefill_chunk: int,
    widest: int,
) -> int:
    tokens = batch * seq_len
    chunk = min(tokens, prefill_chunk) if spec.is_decoder else tokens
    workspace = chunk * (2 * spec.hidden_size + widest) * compute_bytes
    if spec.is_decoder:
        workspace += 4 * batch * spec.vocab_size
    elif spec.head_kind == "masked_lm":
        workspace += 4 * chunk * spec.vocab_size
    return workspace


def serving_memory(
    spec: ModelSpec,
    *,
    batch: int,
    seq_len: int,
    weights_dtype: str = "bfloat16",
    kv_dtype: str = "bfloat16",
    compute_dtype: str = "bfloat16",
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    counts: ParameterCounts | None = None,
) -> ServingMemory:
    """Memory to serve `batch` sequences of `seq_len` tokens (formulas: module docstring).

    Example:
        >>> from keras_mha.hub.config import load_config
        >>> from keras_mha.cards.spec import from_config
        >>> spec = from_config(load_config("bundled:meta-llama/Meta-Llama-3-8B").config)
        >>> memory = serving_memory(spec, batch=1, seq_len=8192)
        >>> memory.kv_cache_bytes
        1073741824
    """
    batch, seq_len = _positive("batch", batch), _positive("seq_len", seq_len)
    prefill_chunk = _positive("prefill_chunk", prefill_chunk)
    _check_dtype("weights_dtype", weights_dtype)
    _check_dtype("kv_dtype", kv_dtype)
    compute_bytes = KV_DTYPE_BITS[_check_dtype("compute_dtype", compute_dtype)] // 8
    if compute_bytes < 2:
        raise UsageError(
            f"compute_dtype={compute_dtype!r}: activations are computed in float32, "
            "bfloat16 or float16",
            key="compute_dtype",
            value=compute_dtype,
        )
    counts = counts or parameter_counts(spec)
    weights = weights_bytes(counts, weights_dtype).total
    kv = kv_cache_cost(spec, seq_len=seq_len, batch=batch, kv_dtype=kv_dtype).total_bytes
    recurrent = _recurrent_state_bytes(spec, batch, compute_bytes)
    workspace = _workspace_bytes(
        spec, batch, seq_len, compute_bytes, prefill_chunk, _widest_elements(spec)
    )
    return ServingMemory(
        weights_dtype=weights_dtype,
        kv_dtype=kv_dtype,
        compute_dtype=compute_dtype,
        batch=batch,
        seq_len=seq_len,
        prefill_chunk=prefill_chunk,
        weights_bytes=weights,
        kv_cache_bytes=kv,
        recurrent_state_bytes=recurrent,
        activation_bytes=workspace,
        total_bytes=weights + kv + recurrent + workspace,
    )


def serving_bytes_function(
    spec: ModelSpec,
    *,
    weights_dtype: str = "bfloat16",
    kv_dtype: str = "bfloat16",
    compute_dtype: str = "bfloat16",
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    counts: ParameterCounts | None = None,
) -> Callable[[int, int], int]:
    """`(batch, seq_len) -> serving_memory(...).total_bytes`, fast enough to search with.

    The KV cache's per-layer layout is read once from `kv_cache_cost`; each call then sums
    the same terms without building a report (tests check it equals `serving_memory`).

    Example:
        >>> from keras_mha.hub.config import load_config
        >>> from keras_mha.cards.spec import from_config
        >>> spec = from_config(load_config("bundled:mistralai/Mistral-7B-v0.1").config)
        >>> serving = serving_bytes_function(spec)
        >>> serving(2, 40000) == serving_memory(spec, batch=2, seq_len=40000).total_bytes
        True
    """
    counts = counts or parameter_counts(spec)
    probe = serving_memory(
        spec,
        batch=1,
        seq_len=1,
        weights_dtype=weights_dtype,
        kv_dtype=kv_dtype,
        compute_dtype=compute_dtype,
        prefill_chunk=prefill_chunk,
        counts=counts,
    )
    compute_bytes = KV_DTYPE_BITS[compute_dtype] // 8
    bits = KV_DTYPE_BITS[kv_dtype]
    widest = _widest_elements(spec)
    # At a length no window reaches, a sliding layer's cached tokens are its window.
    layers = kv_cache_cost(spec, seq_len=SEARCH_LIMIT, kv_dtype=kv_dtype).layers
    growing = 0  # elements per token of layers that cache every token
    capped: dict[int, int] = {}  # window -> elements per token of its sliding layers
    for layer in layers:
        elements = layer.key_elements_per_token + layer.value_elements_per_token
        if layer.kind == "sliding" and layer.cached_tokens < SEARCH_LIMIT:
            capped[layer.cached_tokens] = capped.get(layer.cached_tokens, 0) + elements
        else:
            growing += elements
    capped_items = tuple(capped.items())
    recurrent_per_row = probe.recurrent_state_bytes

    def serving(batch: int, seq_len: int) -> int:
        elements = seq_len * growing
        for window, per_token in capped_items:
            elements += min(seq_len, window) * per_token
        kv = -(-batch * elements * bits // 8)
        workspace = _workspace_bytes(spec, batch, seq_len, compute_bytes, prefill_chunk, widest)
        return probe.weights_bytes + kv + batch * recurrent_per_row + workspace

    return serving


# -- fits ---------------------------------------------------------------------------------------


def largest_fitting(cost: Callable[[int], int], budget: int, limit: int = SEARCH_LIMIT):
    """The largest `n` in `[1, limit]` with `cost(n) <= budget` for a non-decreasing `cost`.

    Returns 0 when even `cost(1)` is over the budget and None when `cost(limit)` is not
    (the cost stops growing: unbounded for this search).

    Example:
        >>> largest_fitting(lambda n: 10 * n, 95)
        9
        >>> largest_fitting(lambda n: min(n, 50), 100) is None
        True
    """
    if cost(1) > budget:
        return 0
    low, high = 1, 2
    while high <= limit and cost(high) <= budget:  # exponential probe
        low, high = high, high * 2
    if high > limit:
        if cost(limit) <= budget:
            return None
        high = limit
    while high - low > 1:  # cost(low) fits, cost(high) does not
        middle = (low + high) // 2
        if cost(middle) <= budget:
            low = middle
        else:
            high = middle
    return low


@dataclass(frozen=True)
class FitPlan:
    """What fits in `memory_bytes` (see the module docstring).

    Attributes:
        memory_bytes: the memory size asked about.
        batch, seq_len, kv_dtype, weights_dtype: the request.
        weights_fit: whether the weights alone fit.
        max_seq_len: largest context at `batch` for `kv_dtype` (0: nothing fits; None:
            unbounded by memory).
        max_batch: largest batch at `seq_len` for `kv_dtype` (0: nothing fits; None:
            unbounded).
        by_kv_dtype: `{kv dtype: {"max_seq_len", "max_batch", "serving_bytes"}}`.
        serving_bytes, serving_fits: serving memory at the request and whether it fits.
        training_bytes, training_fits: training without checkpointing.
        training_bytes_checkpointed, training_fits_checkpointed: with full checkpointing.

    Example:
        >>> FitPlan(1, 1, 1, "int8", "bfloat16", True, 1, 1, {}, 1, True, 2, False, 1, True
        ...         ).as_dict()["training_fits"]
        False
    """

    memory_bytes: int
    batch: int
    seq_len: int
    kv_dtype: str
    weights_dtype: str
    weights_fit: bool
    max_seq_len: int | None
    max_batch: int | None
    by_kv_dtype: dict = field(default_factory=dict)
    serving_bytes: int = 0
    serving_fits: bool = False
    training_bytes: int = 0
    training_fits: bool = False
    training_bytes_checkpointed: int = 0
    training_fits_checkpointed: bool = False

    def as_dict(self) -> dict:
        """JSON-ready (the `fits` report entry without its display extras)."""
        return asdict(self)


def plan_fit(
    spec: ModelSpec,
    *,
    memory_bytes: int,
    batch: int = 1,
    seq_len: int,
    weights_dtype: str = "bfloat16",
    kv_dtype: str = "bfloat16",
    compute_dtype: str = "bfloat16",
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    optimizer: str = "adamw",
    precision: str = "mixed",
    counts: ParameterCounts | None = None,
) -> FitPlan:
    """The largest context and batch that fit `memory_bytes` for serving, per KV dtype,
    and whether training fits (see the module docstring).

    Example:
        >>> from keras_mha.hub.config import load_config
        >>> from keras_mha.cards.spec import from_config
        >>> spec = from_config(load_config("bundled:meta-llama/Meta-Llama-3-8B").config)
        >>> plan = plan_fit(spec, memory_bytes=24 * 2**30, batch=1, seq_len=8192)
        >>> plan.max_batch, plan.training_fits
        (8, False)
    """
    memory_bytes = _positive("memory_bytes", memory_bytes)
    counts = counts or parameter_counts(spec)
    by_kv_dtype = {}
    for dtype in DTYPES:
        serving = serving_bytes_function(
            spec,
            weights_dtype=weights_dtype,
            kv_dtype=dtype,
            compute_dtype=compute_dtype,
            prefill_chunk=prefill_chunk,
            counts=counts,
        )
        by_kv_dtype[dtype] = {
            "max_seq_len": largest_fitting(lambda n, f=serving: f(batch, n), memory_bytes),
            "max_batch": largest_fitting(lambda n, f=serving: f(n, seq_len), memory_bytes),
            "serving_bytes": serving(batch, seq_len),
        }
    weights = weights_bytes(counts, weights_dtype).total
    training = training_memory(
        spec, batch=batch, seq_len=seq_len, optimizer=optimizer, precision=precision,
        counts=counts,
    )  # fmt: skip
    chosen = by_kv_dtype[_check_dtype("kv_dtype", kv_dtype)]
    return FitPlan(
        memory_bytes=memory_bytes,
        batch=batch,
        seq_len=seq_len,
        kv_dtype=kv_dtype,
        weights_dtype=weights_dtype,
        weights_fit=weights <= memory_bytes,
        max_seq_len=chosen["max_seq_len"],
        max_batch=chosen["max_batch"],
        by_kv_dtype=by_kv_dtype,
        serving_bytes=chosen["serving_bytes"],
        serving_fits=chosen["serving_bytes"] <= memory_bytes,
        training_bytes=training.total_bytes,
        training_fits=training.total_bytes <= memory_bytes,
        training_bytes_checkpointed=training.total_bytes_checkpointed,
        training_fits_checkpointed=training.total_bytes_checkpointed <= memory_bytes,
    )


__all__ = [
    "DEFAULT_PREFILL_CHUNK",
    "DTYPES",
    "FitPlan",
    "OPTIMIZER_MOMENTS",
    "OPTIMIZER_SCALAR_BYTES",
    "PARTS",
    "QUANTIZATION",
    "QUANTIZED_PARTS",
    "Quantization",
    "SEARCH_LIMIT",
    "ServingMemory",
    "TRAINING_PRECISIONS",
    "TrainingMemory",
    "WeightsBytes",
    "activation_bytes",
    "largest_fitting",
    "plan_fit",
    "serving_bytes_function",
    "serving_memory",
    "training_memory",
    "training_state_bytes",
    "weights_bytes",
    "weights_bytes_by_dtype",
]
