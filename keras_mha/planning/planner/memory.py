"""Will it fit? Weights, serving and training memory of a `ModelSpec`, and the largest
context and batch a memory size holds. Pure Python: no keras, backend or numpy import.

- `format_weights(spec, weights_format)`: every weight tensor in a checkpoint format
  (a plain dtype, the generic int8 / int4 / float8, or the checkpoint's own GPTQ, AWQ,
  bitsandbytes, fp8 or compressed-tensors), with its scales and zero points;
  `weights_bytes(counts, dtype)` the estimate from the part counts alone.
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
    >>> from keras_mha.planning.spec import from_config
    >>> from keras_mha.planning.costs import parameter_counts
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

from keras_mha.errors import UsageError
from keras_mha.planning.costs import KV_DTYPE_BITS, ParameterCounts, parameter_counts
from keras_mha.planning.planner.inventory import WeightGroup, weight_groups
from keras_mha.planning.planner.placement import Placement, quantization_overhead, weights_by_part
from keras_mha.planning.planner.quantization import WeightsFormat, dtype_format
from keras_mha.planning.planner.serving import (
    DEFAULT_PREFILL_CHUNK,
    SEARCH_LIMIT,
    ServingMemory,
    ServingModel,
    attention_elements,
    is_moe_layer,
    mamba_elements,
    mlp_elements,
    moe_elements,
    resolve_format,
    serving_memory,
    serving_model,
)
from keras_mha.planning.planner.serving import check_dtype as _check_dtype
from keras_mha.planning.planner.serving import positive as _positive
from keras_mha.planning.spec import ModelSpec

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


def format_weights(
    spec: ModelSpec,
    weights_format: WeightsFormat,
    *,
    groups: tuple[WeightGroup, ...] | None = None,
) -> WeightsBytes:
    """Bytes of all of `spec`'s weights in `weights_format`, per part, with the format's
    overhead (scales, zero points, indices) in `scale_bytes`.

    Example:
        >>> from keras_mha.hub.config import load_config
        >>> from keras_mha.planning.spec import from_config
        >>> from keras_mha.planning.planner.quantization import dtype_format
        >>> spec = from_config(load_config("bundled:meta-llama/Llama-2-7b-hf").config)
        >>> format_weights(spec, dtype_format("float16")).total == 2 * 6738415616
        True
    """
    groups = groups if groups is not None else weight_groups(spec)
    by_part = weights_by_part(groups, weights_format)
    return WeightsBytes(
        weights_format.id,
        sum(by_part.values()),
        by_part,
        quantization_overhead(groups, weights_format),
    )


def format_weights_by_dtype(
    spec: ModelSpec, *, groups: tuple[WeightGroup, ...] | None = None
) -> dict[str, WeightsBytes]:
    """`format_weights` in every dtype of `DTYPES` (generic formats), float32 first.

    Example:
        >>> from keras_mha.planning.spec import from_config
        >>> spec = from_config({"model_type": "llama", "hidden_size": 64,
        ...     "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 128,
        ...     "vocab_size": 100})
        >>> list(format_weights_by_dtype(spec))[:2]
        ['float32', 'bfloat16']
    """
    groups = groups if groups is not None else weight_groups(spec)
    return {dtype: format_weights(spec, dtype_format(dtype), groups=groups) for dtype in DTYPES}


def weights_bytes_by_dtype(counts: ParameterCounts) -> dict[str, WeightsBytes]:
    """`weights_bytes` for every dtype, float32 first.

    Example:
        >>> counts = ParameterCounts(8, 8, 0, 0, 0, 0, 0, None)
        >>> {dtype: w.total for dtype, w in weights_bytes_by_dtype(counts).items()}["float32"]
        32
    """
    return {dtype: weights_bytes(counts, dtype) for dtype in DTYPES}


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
    hidden, heads = spec.hidden_size, spec.attention.num_attention_heads
    layers = []
    for index, kind in enumerate(spec.layer_kinds):
        elements = spec.norms.norms_per_layer * hidden + 2 * hidden  # norm inputs, block inputs
        float32_bytes = 0
        if kind == "none":
            elements += mamba_elements(spec)
        else:
            elements += attention_elements(spec)
            float32_bytes += 4 * heads  # flash attention's log-sum-exp
        if is_moe_layer(spec, index):
            elements += moe_elements(spec)
            float32_bytes += 4 * spec.mlp.num_experts  # router logits
        else:
            elements += mlp_elements(spec, spec.mlp.intermediate_size)
        encoder_elements = 0
        if spec.is_encoder_decoder:
            inner = heads * spec.attention.head_dim
            elements += hidden + 2 * inner  # cross-attention: normed input, Q, output
            float32_bytes += 4 * heads
            encoder_elements = 2 * inner  # its K and V over the encoder's tokens
        layers.append(_LayerActivations(elements, float32_bytes, encoder_elements))
    return layers


def _encoder_layers(spec: ModelSpec) -> list[_LayerActivations]:
    if not spec.is_encoder_decoder:
        return []
    hidden = spec.hidden_size
    inner = spec.encoder.encoder_attention_heads * spec.encoder.encoder_head_dim
    elements = spec.encoder.encoder_norms_per_layer * hidden + 2 * hidden + 4 * inner
    elements += mlp_elements(spec, spec.encoder.encoder_intermediate_size)
    layer = _LayerActivations(elements, 4 * spec.encoder.encoder_attention_heads)
    return [layer] * spec.encoder.num_encoder_layers


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
    devices: int = 1

    def as_dict(self) -> dict:
        """JSON-ready.

        Example:
            >>> memory = TrainingMemory("sgd", "float32", 1, 1, 4, 0, 4, 8, 1, 1, 17, 17)
            >>> memory.as_dict()["optimizer"]
            'sgd'
        """
        return asdict(self)


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
        >>> from keras_mha.planning.spec import from_config
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
    devices: int = 1,
) -> TrainingMemory:
    """Memory to train every parameter of `spec` (formulas: module docstring), on one
    device or, with `devices > 1`, per device of a fully sharded data-parallel run
    (FSDP / ZeRO-3): weights, master weights, gradients and optimizer state divided by
    `devices` (rounded up), activations of `ceil(batch / devices)` sequences.

    Example:
        >>> from keras_mha.planning.spec import from_config
        >>> spec = from_config({"model_type": "gpt2", "n_embd": 64, "n_head": 4,
        ...     "n_layer": 2, "n_positions": 128, "vocab_size": 100})
        >>> memory = training_memory(spec, batch=2, seq_len=16, optimizer="sgd")
        >>> memory.total_bytes > memory.total_bytes_checkpointed
        True
    """
    counts = counts or parameter_counts(spec)
    devices = _positive("devices", devices)
    state = training_state_bytes(counts.total, optimizer=optimizer, precision=precision)
    state = {key: -(-value // devices) for key, value in state.items()}
    compute_dtype = TRAINING_PRECISIONS[precision]["compute_dtype"]
    full, checkpointed = activation_bytes(
        spec, batch=-(-batch // devices), seq_len=seq_len, compute_dtype=compute_dtype
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
        devices=devices,
    )


# -- serving ------------------------------------------------------------------------------------


def serving_bytes_function(spec: ModelSpec, **options) -> Callable[[int, int], int]:
    """`(batch, seq_len) -> serving_memory(...).total_bytes`, fast enough to search with:
    a `ServingModel` (`serving.serving_model`, same `options`) reads the KV cache's
    per-layer layout and the weights once.

    Example:
        >>> from keras_mha.hub.config import load_config
        >>> from keras_mha.planning.spec import from_config
        >>> spec = from_config(load_config("bundled:mistralai/Mistral-7B-v0.1").config)
        >>> serving = serving_bytes_function(spec)
        >>> serving(2, 40000) == serving_memory(spec, batch=2, seq_len=40000).total_bytes
        True
    """
    return serving_model(spec, **options)


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
        weights_bytes: the weights the fullest device holds.

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
    weights_bytes: int = 0

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
    weights_format: WeightsFormat | None = None,
    placement: Placement | None = None,
) -> FitPlan:
    """The largest context and batch that fit `memory_bytes` for serving, per KV dtype,
    and whether training fits (see the module docstring).

    With a `placement` of several devices, `memory_bytes` is what each device offers and
    every byte figure is that of the fullest device; training is then planned fully
    sharded (FSDP / ZeRO-3: weights, gradients and optimizer state split across the
    devices, the batch split between them).

    Example:
        >>> from keras_mha.hub.config import load_config
        >>> from keras_mha.planning.spec import from_config
        >>> spec = from_config(load_config("bundled:meta-llama/Meta-Llama-3-8B").config)
        >>> plan = plan_fit(spec, memory_bytes=24 * 2**30, batch=1, seq_len=8192)
        >>> plan.max_batch, plan.training_fits
        (8, False)
    """
    memory_bytes = _positive("memory_bytes", memory_bytes)
    counts = counts or parameter_counts(spec)
    weights_format = resolve_format(weights_dtype, weights_format)
    placement = placement or Placement()
    groups = weight_groups(spec)
    by_kv_dtype, models = {}, {}
    for dtype in DTYPES:
        serving = ServingModel(
            spec,
            weights_format=weights_format,
            kv_dtype=dtype,
            compute_dtype=compute_dtype,
            prefill_chunk=prefill_chunk,
            placement=placement,
            groups=groups,
        )
        models[dtype] = serving
        by_kv_dtype[dtype] = {
            "max_seq_len": largest_fitting(lambda n, f=serving: f(batch, n), memory_bytes),
            "max_batch": largest_fitting(lambda n, f=serving: f(n, seq_len), memory_bytes),
            "serving_bytes": serving(batch, seq_len),
        }
    weights = max(stage.weights_bytes for stage in models[kv_dtype].stages)
    training = training_memory(
        spec, batch=batch, seq_len=seq_len, optimizer=optimizer, precision=precision,
        counts=counts, devices=placement.devices,
    )  # fmt: skip
    chosen = by_kv_dtype[_check_dtype("kv_dtype", kv_dtype)]
    return FitPlan(
        memory_bytes=memory_bytes,
        batch=batch,
        seq_len=seq_len,
        kv_dtype=kv_dtype,
        weights_dtype=weights_format.id,
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
        weights_bytes=weights,
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
    "format_weights",
    "format_weights_by_dtype",
    "largest_fitting",
    "plan_fit",
    "serving_bytes_function",
    "serving_memory",
    "training_memory",
    "training_state_bytes",
    "weights_bytes",
    "weights_bytes_by_dtype",
]
