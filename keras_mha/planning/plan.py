"""`keras_mha.plan(model, gpu="2xH100", ...)`: will a model fit, and how fast can it be
served, in one call, as a typed `Plan`. Pure Python: no keras or backend import.

One pipeline, used by `keras_mha.plan`, `keras-mha inspect`, `keras-mha compare` and
`convert`'s report: `plan_model` loads the config (`keras_mha.hub.load_config`) and the
checkpoint's size, then `plan_config` reads the `ModelSpec` and computes the plan (the
cost model and the planner). A `Plan` is a tree of records (`ModelSource`, `ModelSpec`,
`ParameterCounts`, one `KVCachePlan` per length, `MemoryPlan`, `Fits`, `SpeedBounds`);
`Plan.to_dict()` is `inspect --format json`, and the table and markdown renderers
(`keras_mha.planning.render`) format that. Nothing here renders to compute.

Example:
    >>> import keras_mha
    >>> result = keras_mha.plan("bundled:meta-llama/Llama-3.1-70B", gpu="2xH100", seq_len=8192)
    >>> result.serving_fits, result.max_seq_len
    (True, 37658)
    >>> round(result.decode_tokens_per_s)
    47
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from keras_mha.errors import UsageError
from keras_mha.hub import bundled
from keras_mha.hub.config import DEFAULT_TIMEOUT_SECONDS, LoadedConfig, load_config
from keras_mha.hub.weights_size import CheckpointSize, checkpoint_size
from keras_mha.planning.costs import (
    KVCacheCost,
    ParameterCounts,
    kv_cache_cost,
    parameter_counts,
)
from keras_mha.planning.planner import memory, units
from keras_mha.planning.planner.devices import DEFAULT_MEMORY_UTILIZATION, DeviceSet, parse_devices
from keras_mha.planning.planner.inventory import weight_groups
from keras_mha.planning.planner.placement import Placement, tensor_parallel_problem
from keras_mha.planning.planner.quantization import WeightsFormat
from keras_mha.planning.planner.request import MemoryRequest, plan_format
from keras_mha.planning.planner.serving import (
    DEFAULT_PREFILL_CHUNK,
    ServingMemory,
    ServingModel,
    positive,
)
from keras_mha.planning.spec import ModelSpec, from_config

# Default context for the KV-cache figures: the model's own context length, capped here so
# that reports of long-context models stay comparable with the rest.
DEFAULT_SEQ_LEN_CAP = 8192
# The JSON contract's keys of a `kv_cache` entry, first and in this order.
KV_CACHE_KEYS = ("dtype", "batch", "seq_len", "bytes_per_token", "total_bytes",
                 "mha_equivalent_bytes")  # fmt: skip
PARAMETER_BREAKDOWN_KEYS = ("embeddings", "attention", "mlp", "norms", "lm_head", "other")
LAYER_KINDS = ("full", "sliding", "none")
# Config keys that hold the context length, in the order the families use them.
_CONTEXT_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length",
                        "max_seq_len", "seq_length", "n_ctx")  # fmt: skip
_BUNDLED_CARD_KEYS = ("repo_id", "revision", "source", "notes")


def context_length(spec) -> int | None:
    """The model's context length from its config (top level, then `text_config`), or None.

    Example:
        >>> from types import SimpleNamespace
        >>> context_length(SimpleNamespace(raw={"max_position_embeddings": 4096}))
        4096
    """
    positions = getattr(spec, "positions", None)
    explicit = getattr(positions, "max_position_embeddings", None)
    if isinstance(explicit, int) and explicit > 0:
        # RoBERTa's position table also holds the rows up to its padding index.
        padding = getattr(positions, "position_padding_idx", None)
        return explicit if padding is None else explicit - padding - 1
    raw = getattr(spec, "raw", None) or {}
    for config in (raw, raw.get("text_config") or {}, raw.get("llm_config") or {}):
        if not isinstance(config, dict):
            continue
        for key in _CONTEXT_LENGTH_KEYS:
            value = config.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def default_seq_len(spec) -> int:
    """The model's context length capped at `DEFAULT_SEQ_LEN_CAP` (8192); 8192 when unknown.

    Example:
        >>> from types import SimpleNamespace
        >>> default_seq_len(SimpleNamespace(raw={"n_positions": 1024}))
        1024
        >>> default_seq_len(SimpleNamespace(raw={"max_position_embeddings": 131072}))
        8192
    """
    length = context_length(spec)
    return DEFAULT_SEQ_LEN_CAP if length is None else min(length, DEFAULT_SEQ_LEN_CAP)


# -- the records ----------------------------------------------------------------------------


@dataclass(frozen=True)
class HubOptions:
    """How to reach the Hub for a model id (as `keras_mha.hub.load_config` takes them).

    Example:
        >>> HubOptions(offline=True).offline
        True
    """

    revision: str | None = None
    token: str | bool | None = None
    endpoint: str | None = None
    offline: bool | None = None
    timeout: float = DEFAULT_TIMEOUT_SECONDS


@dataclass(frozen=True)
class ModelSource:
    """Where the config came from: the model id, `hub` / `local` / `bundled`, the revision
    and commit, a note on the source, a bundled card's provenance, the checkpoint's size.

    Example:
        >>> ModelSource("org/name", "hub", None, None, None).bundled_card is None
        True
    """

    model: str
    source: str
    revision: str | None
    commit: str | None
    note: str | None
    bundled_card: dict | None = None
    checkpoint: CheckpointSize | None = None


@dataclass(frozen=True)
class KVCachePlan:
    """The KV cache at one length: the cost model's figures and what one more token adds
    to one sequence (`bytes_per_token` while no sliding window is full, less once full).

    Example:
        >>> plan("bundled:meta-llama/Meta-Llama-3-8B").kv_caches[-1].marginal_bytes_per_token
        131072
    """

    cost: KVCacheCost
    marginal_bytes_per_token: int

    def to_dict(self) -> dict:
        """The contract's keys first (their meaning is fixed), then the extras."""
        entry = {key: getattr(self.cost, key) for key in KV_CACHE_KEYS}
        for key, value in self.cost.as_dict().items():
            entry.setdefault(key, value)
        entry["marginal_bytes_per_token"] = self.marginal_bytes_per_token
        return entry


@dataclass(frozen=True)
class MemoryPlan:
    """The whole model on one device: weights per dtype and in the plan's format, serving
    and training memory at the request.

    Example:
        >>> plan("bundled:meta-llama/Meta-Llama-3-8B").memory.weights_format.id
        'bfloat16'
    """

    weights_by_dtype: dict
    weights_format: WeightsFormat
    weights: memory.WeightsBytes
    serving: ServingMemory
    training: memory.TrainingMemory
    checkpoint: CheckpointSize | None = None

    def to_dict(self) -> dict:
        by_dtype = self.weights_by_dtype
        return {
            "weights_bytes": {dtype: value.total for dtype, value in by_dtype.items()},
            "weights_bytes_by_part": {dtype: value.by_part for dtype, value in by_dtype.items()},
            "weights_scale_bytes": {dtype: v.scale_bytes for dtype, v in by_dtype.items()},
            "weights_format": {
                **self.weights_format.as_dict(),
                "bytes": self.weights.total,
                "by_part": self.weights.by_part,
                "overhead_bytes": self.weights.scale_bytes,
            },
            "serving_bytes": self.serving.total_bytes,
            "serving": self.serving.as_dict(),
            "training_bytes": self.training.total_bytes,
            "training_bytes_checkpointed": self.training.total_bytes_checkpointed,
            "training": self.training.as_dict(),
            "checkpoint_bytes": self.checkpoint.as_dict() if self.checkpoint else None,
        }


@dataclass(frozen=True)
class Fits:
    """What fits on the devices asked for (per device), and, when serving does not fit,
    suggestions that would.

    Example:
        >>> plan("bundled:openai-community/gpt2", memory="1GiB").fits.fit.max_batch
        11
    """

    fit: memory.FitPlan
    devices: DeviceSet
    weights_format: str
    context_length: int | None
    parallel_note: str | None
    suggestions: tuple = ()

    def to_dict(self) -> dict:
        """The `fits` entry; its `verdict` is the sentence the table prints first."""
        from keras_mha.planning.render.memory_report import verdict

        devices, fit = self.devices, self.fit
        entry = {"memory_bytes": fit.memory_bytes, "max_seq_len": fit.max_seq_len,
                 "max_batch": fit.max_batch, "training_fits": fit.training_fits}  # fmt: skip
        for key, value in fit.as_dict().items():
            entry.setdefault(key, value)
        entry["max_seq_len_unbounded"] = fit.max_seq_len is None
        entry["context_length"] = self.context_length
        entry["gpu"] = devices.gpu.name if devices.gpu else None
        entry["gpu_memory_source"] = devices.gpu.source if devices.gpu else None
        entry["device_memory_bytes"] = devices.memory_bytes
        entry["memory_utilization"] = devices.memory_utilization
        entry["devices"] = devices.as_dict()
        entry["weights_format"] = self.weights_format
        entry["parallel_note"] = self.parallel_note
        entry["suggestions"] = [dict(suggestion) for suggestion in self.suggestions]
        entry["verdict"] = verdict(entry)
        return entry


# The answer's fields, in the order `repr(plan)` shows them (the records are too long to read).
_ANSWER = (
    "model", "devices", "weights_format", "kv_dtype", "batch", "seq_len", "serving_fits",
    "max_seq_len", "max_batch", "serving_bytes", "weights_bytes", "training_fits",
    "decode_tokens_per_s", "prefill_seconds", "verdict", "suggestions", "warnings",
)  # fmt: skip


@dataclass(frozen=True, repr=False)
class Plan:
    """What a model costs, what fits, and how fast, for one request (see `plan`).

    Attributes:
        source: where the config came from (`ModelSource`).
        spec: the `ModelSpec` read from it.
        parameters: its `ParameterCounts`.
        kv_caches: one `KVCachePlan` per requested length, in the order asked; the last is
            the one the memory plan uses.
        context_length: the model's context length, or None.
        memory: the whole model on one device (`MemoryPlan`).
        fits: what fits on the devices asked for (`Fits`), or None without devices.
        speed: decode and prefill bounds (`planner.speed.SpeedBounds`), or None without an
            accelerator of the table, or when serving does not fit.
        warnings: what the reading had to assume, lengths beyond the context, notes on
            the weights format and on tensor parallelism.

    The flat properties (`serving_fits`, `max_seq_len`, `decode_tokens_per_s`, ...) read
    the answer from these records.

    Example:
        >>> plan("bundled:openai-community/gpt2", memory="1GiB").weights_format
        'float32'
    """

    source: ModelSource
    spec: ModelSpec
    parameters: ParameterCounts
    kv_caches: tuple
    context_length: int | None
    memory: MemoryPlan
    fits: Fits | None
    speed: object | None  # planner.speed.SpeedBounds, imported only when devices are named
    warnings: tuple

    def __repr__(self) -> str:
        return f"Plan({', '.join(f'{name}={getattr(self, name)!r}' for name in _ANSWER)})"

    # -- the answer in one line each
    @property
    def model(self) -> str:
        return self.source.model

    @property
    def devices(self) -> str | None:
        """e.g. `2x H100 80GB SXM`, or None when no devices were named."""
        return self.fits.devices.name if self.fits else None

    @property
    def weights_format(self) -> str:
        return self.memory.weights_format.id

    @property
    def kv_dtype(self) -> str:
        return self.memory.serving.kv_dtype

    @property
    def batch(self) -> int:
        return self.memory.serving.batch

    @property
    def seq_len(self) -> int:
        return self.memory.serving.seq_len

    @property
    def serving_fits(self) -> bool | None:
        return self.fits.fit.serving_fits if self.fits else None

    @property
    def max_seq_len(self) -> int | None:
        """Longest context at `batch` that fits (None: unbounded or no devices; 0: none)."""
        return self.fits.fit.max_seq_len if self.fits else None

    @property
    def max_batch(self) -> int | None:
        """Largest batch at `seq_len` that fits (None: unbounded or no devices; 0: none)."""
        return self.fits.fit.max_batch if self.fits else None

    @property
    def serving_bytes(self) -> int:
        """Serving memory per device (the whole model's without devices)."""
        return self.fits.fit.serving_bytes if self.fits else self.memory.serving.total_bytes

    @property
    def weights_bytes(self) -> int:
        """The weights per device (the whole model's without devices)."""
        return self.fits.fit.weights_bytes if self.fits else self.memory.serving.weights_bytes

    @property
    def training_fits(self) -> bool | None:
        return self.fits.fit.training_fits if self.fits else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        return self.speed.decode_tokens_per_s if self.speed else None

    @property
    def prefill_seconds(self) -> float | None:
        return self.speed.prefill_seconds if self.speed else None

    @property
    def verdict(self) -> str | None:
        return self.fits.to_dict()["verdict"] if self.fits else None

    @property
    def suggestions(self) -> tuple:
        return self.fits.suggestions if self.fits else ()

    def to_dict(self) -> dict:
        """The whole plan as JSON-ready data: exactly `keras-mha inspect ... --format json`.

        Example:
            >>> plan("bundled:openai-community/gpt2").to_dict()["attention"]["kind"]
            'MHA'
        """
        spec, counts, source = self.spec, self.parameters, self.source
        count_values = counts.as_dict()
        kind_counts = spec.layer_kind_counts()
        kv_by_seq_len = [kv_cache.to_dict() for kv_cache in self.kv_caches]
        report = {
            "model": source.model,
            "source": source.source,
            "model_type": spec.model_type,
            "attention": {
                "kind": spec.attention_kind,
                "num_layers": spec.num_layers,
                "num_attention_heads": spec.attention.num_attention_heads,
                "num_key_value_heads": spec.attention.num_key_value_heads,
                "head_dim": spec.attention.head_dim,
                "sliding_window": spec.attention.sliding_window,
                "layer_kinds": {kind: int(kind_counts.get(kind, 0)) for kind in LAYER_KINDS},
                "num_hidden_layers": spec.num_hidden_layers,
                "hidden_size": spec.hidden_size,
                "is_encoder_decoder": bool(spec.is_encoder_decoder),
            },
            "parameters": {
                "total": counts.total,
                "attention": counts.attention,
                "active": counts.active,
                "breakdown": {key: count_values.get(key) for key in PARAMETER_BREAKDOWN_KEYS},
                # Multimodal: the vision tower and projector, inside `breakdown.other`.
                "vision": counts.vision if spec.vision is not None else None,
            },
            "kv_cache": dict(kv_by_seq_len[-1]),
            "kv_cache_by_seq_len": kv_by_seq_len,
            "revision": source.revision,
            "commit": source.commit,
            "source_note": source.note,
            "architecture": spec.architecture,
            "vocab_size": spec.vocab_size,
            "context_length": self.context_length,
            "warnings": list(self.warnings),
            "memory": self.memory.to_dict(),
        }
        if self.fits is not None:
            report["fits"] = self.fits.to_dict()
            speed = self.speed
            report["speed_bounds"] = None if speed is None else {
                **speed.as_dict(), "gpu": self.fits.devices.gpu.name,
                "source": self.fits.devices.gpu.spec_source,
            }  # fmt: skip
        if source.bundled_card is not None:
            report["bundled_card"] = dict(source.bundled_card)
        return report


# -- the pipeline ---------------------------------------------------------------------------


def _kv_cache(spec, seq_len: int, batch: int, kv_dtype: str) -> KVCachePlan:
    cost = kv_cache_cost(spec, seq_len=seq_len, batch=batch, kv_dtype=kv_dtype)
    marginal = 0
    if cost.applicable:
        longer = kv_cache_cost(spec, seq_len=cost.seq_len + 1, batch=1, kv_dtype=cost.dtype)
        # Bits, scales included (a quantized cache keeps one per token and KV head).
        now = sum(layer.cached_tokens * layer.bits_per_token(cost.dtype) for layer in cost.layers)
        grown = sum(
            layer.cached_tokens * layer.bits_per_token(cost.dtype) for layer in longer.layers
        )
        marginal = -(-(grown - now) // 8)
    return KVCachePlan(cost, marginal)


def _memory_plan(spec, counts, *, batch, seq_len, kv_dtype, request, checkpoint) -> MemoryPlan:
    groups = weight_groups(spec)
    fmt = plan_format(spec, request)
    serving = ServingModel(spec, weights_format=fmt, kv_dtype=kv_dtype,
                           prefill_chunk=request.prefill_chunk, groups=groups)  # fmt: skip
    training = memory.training_memory(
        spec, batch=batch, seq_len=seq_len, optimizer=request.optimizer,
        precision=request.precision, counts=counts,
    )  # fmt: skip
    return MemoryPlan(
        weights_by_dtype=memory.format_weights_by_dtype(spec, groups=groups),
        weights_format=fmt,
        weights=memory.format_weights(spec, fmt, groups=groups),
        serving=serving.memory(batch, seq_len),
        training=training,
        checkpoint=checkpoint,
    )


def _fits(spec, counts, devices, *, batch, seq_len, kv_dtype, request, context) -> Fits:
    fmt = plan_format(spec, request)
    fit = memory.plan_fit(
        spec, memory_bytes=devices.usable_memory_bytes, batch=batch, seq_len=seq_len,
        kv_dtype=kv_dtype, prefill_chunk=request.prefill_chunk, optimizer=request.optimizer,
        precision=request.precision, counts=counts, weights_format=fmt,
        placement=Placement(devices.tensor_parallel, devices.pipeline_parallel),
    )  # fmt: skip
    found = ()
    if not fit.serving_fits:
        from keras_mha.planning.planner.suggestions import suggestions

        found = tuple(suggestions(
            spec, weights_format=fmt, devices=devices, batch=batch, seq_len=seq_len,
            kv_dtype=kv_dtype, prefill_chunk=request.prefill_chunk,
        ))  # fmt: skip
    return Fits(fit, devices, fmt.id, context,
                tensor_parallel_problem(spec, devices.tensor_parallel), found)  # fmt: skip


def _speed(spec, devices, *, batch, seq_len, kv_dtype, request):
    """Decode and prefill bounds on the devices' accelerator; None without one from the
    table, or when serving does not fit."""
    from keras_mha.planning.planner.speed import speed_bounds

    if devices is None or devices.gpu is None:
        return None
    serving = ServingModel(
        spec, weights_format=plan_format(spec, request), kv_dtype=kv_dtype,
        prefill_chunk=request.prefill_chunk,
        placement=Placement(devices.tensor_parallel, devices.pipeline_parallel),
    )  # fmt: skip
    if serving(batch, seq_len) > devices.usable_memory_bytes:
        return None
    return speed_bounds(serving, devices.gpu, batch=batch, seq_len=seq_len)


def _beyond_context_warnings(seq_lens, context: int | None) -> list[str]:
    if not context:
        return []
    return [
        f"--seq-len {seq_len:,} is beyond the model's context length of {context:,} tokens; "
        "the figures extrapolate the formulas, the model was not trained that long"
        for seq_len in dict.fromkeys(seq_lens)
        if seq_len > context
    ]


def _check_lengths(seq_lens, batch) -> list[int]:
    seq_lens = list(seq_lens)
    if not seq_lens:
        raise ValueError("seq_lens=[] must hold at least one sequence length")
    for seq_len in seq_lens:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= 0:
            raise ValueError(f"seq_len={seq_len!r} must be a positive integer")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0:
        raise ValueError(f"batch={batch!r} must be a positive integer")
    return seq_lens


def plan_config(
    loaded: LoadedConfig | Mapping,
    *,
    seq_lens: Sequence[int] | None = None,
    batch: int = 1,
    kv_dtype: str = "bfloat16",
    request: MemoryRequest | None = None,
    checkpoint: CheckpointSize | None = None,
    spec: ModelSpec | None = None,
) -> Plan:
    """The plan of a loaded config: spec, costs, memory, fits and speed, computed once.

    Args:
        loaded: the `LoadedConfig` (source, model id, revision, the config), or a config
            dict (a local config without a folder).
        seq_lens: lengths for the KV-cache figures (default the model's context length
            capped at 8192); the memory plan uses the last.
        batch: sequences served at once.
        kv_dtype: the KV cache's element type (canonical name: `bfloat16`, `int8`, ...).
        request: weights format, optimizer, precision and devices (`MemoryRequest`).
        checkpoint: the checkpoint's size, when known (`keras_mha.hub.weights_size`).
        spec: the `ModelSpec` when the caller has read it already.

    Example:
        >>> from keras_mha.hub.config import load_config
        >>> result = plan_config(load_config("bundled:meta-llama/Meta-Llama-3-8B"))
        >>> result.kv_caches[-1].cost.total_bytes
        1073741824
    """
    if not isinstance(loaded, LoadedConfig):
        loaded = _loaded(loaded, HubOptions())
    if spec is None:
        with warnings.catch_warnings():
            # What the reader had to guess is in spec.warnings, and so in the plan itself.
            warnings.simplefilter("ignore")
            spec = from_config(loaded.config, model_id=loaded.model_id)
    seq_lens = _check_lengths(seq_lens or [default_seq_len(spec)], batch)
    request = request or MemoryRequest()
    counts = parameter_counts(spec)
    context = context_length(spec)
    asked = dict(batch=batch, seq_len=seq_lens[-1], kv_dtype=kv_dtype, request=request)
    memory_plan = _memory_plan(spec, counts, **asked, checkpoint=checkpoint)
    devices = request.device_set()
    fits = speed = None
    if devices is not None:
        fits = _fits(spec, counts, devices, **asked, context=context)
        speed = _speed(spec, devices, **asked)
    notes = [f"weights: {note}" for note in memory_plan.weights_format.notes]
    if fits is not None and fits.parallel_note:
        notes.append(fits.parallel_note)
    provenance = None
    if loaded.source == "bundled":
        card = bundled.bundled_source(loaded.model_id)
        provenance = {key: card.get(key) for key in _BUNDLED_CARD_KEYS}
    source = ModelSource(loaded.model_id, loaded.source, loaded.revision,
                         getattr(loaded, "commit", None), loaded.note, provenance,
                         checkpoint)  # fmt: skip
    return Plan(
        source=source,
        spec=spec,
        parameters=counts,
        kv_caches=tuple(_kv_cache(spec, length, batch, kv_dtype) for length in seq_lens),
        context_length=context,
        memory=memory_plan,
        fits=fits,
        speed=speed,
        warnings=(*spec.warnings, *_beyond_context_warnings(seq_lens, context), *notes),
    )


def load_model(model, hub: HubOptions) -> tuple[LoadedConfig, CheckpointSize | None]:
    """The config of `model` and its checkpoint's size (None when unknown): the one place
    the Hub options reach `load_config` and `checkpoint_size`.

    Example:
        >>> loaded, size = load_model("bundled:openai-community/gpt2", HubOptions())
        >>> loaded.source, size
        ('bundled', None)
    """
    loaded = _loaded(model, hub)
    size = checkpoint_size(loaded, token=hub.token, endpoint=hub.endpoint, offline=hub.offline,
                           timeout=hub.timeout)  # fmt: skip
    return loaded, size


def plan_model(
    model,
    *,
    seq_lens: Sequence[int] | None = None,
    batch: int = 1,
    kv_dtype: str = "bfloat16",
    request: MemoryRequest | None = None,
    hub: HubOptions | None = None,
) -> Plan:
    """The one pipeline: config -> checkpoint size -> spec -> `Plan`, for `keras_mha.plan`,
    `keras-mha inspect` and `keras-mha compare`. A model that cannot be read raises its
    `KerasMHAError`, its message prefixed with `model` when the config was at fault.

    Example:
        >>> plan_model("bundled:openai-community/gpt2", seq_lens=[512]).seq_len
        512
    """
    from keras_mha.errors import KerasMHAError

    loaded, size = load_model(model, hub or HubOptions())
    try:
        return plan_config(loaded, seq_lens=seq_lens, batch=batch, kv_dtype=kv_dtype,
                           request=request, checkpoint=size)  # fmt: skip
    except KerasMHAError as error:
        if isinstance(model, (str, Path)):
            error.message = f"{model}: {error.message}"
        raise


def _loaded(model, hub: HubOptions) -> LoadedConfig:
    if isinstance(model, LoadedConfig):
        return model
    if isinstance(model, Mapping):
        config = dict(model)
        name = config.get("_name_or_path")
        name = name if isinstance(name, str) and name.strip() else "config"
        return LoadedConfig(config, "local", name, Path("<config dict>"), None)
    if isinstance(model, (str, Path)):
        return load_config(str(model), revision=hub.revision, token=hub.token,
                           endpoint=hub.endpoint, offline=hub.offline,
                           timeout=hub.timeout)  # fmt: skip
    raise UsageError(
        f"model={type(model).__name__} is not a model; expected a Hub model id, a local "
        "folder or config.json path, bundled:org/name, or a config dict",
        key="model",
        value=type(model).__name__,
    )


def _seq_len(value) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):
        return units.parse_seq_len(value, flag="seq_len")
    return positive("seq_len", value)


def plan(
    model,
    *,
    gpu: str | None = None,
    memory: str | int | None = None,
    gpus: int | None = None,
    pipeline_parallel: int = 1,
    memory_utilization: float = DEFAULT_MEMORY_UTILIZATION,
    seq_len: int | str | None = None,
    batch: int = 1,
    kv_dtype: str = "bfloat16",
    weights_dtype: str | None = None,
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    optimizer: str = "adamw",
    precision: str = "mixed",
    revision: str | None = None,
    token: str | bool | None = None,
    offline: bool | None = None,
    endpoint: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> Plan:
    """Will `model` fit on `gpu` (or devices of `memory` bytes), and how fast can it serve?

    Args:
        model: a Hub model id, a local folder or config.json path, `bundled:org/name`, or
            a config dict.
        gpu: an accelerator of `keras-mha gpus`, optionally with a count: `H100`,
            `2xH100`, `H100x2`.
        memory: instead of `gpu`, each device's memory: bytes, or `80GiB`, `2x80GiB`.
        gpus: the number of devices (same as the count in `gpu`).
        pipeline_parallel: pipeline stages; each splits its layers over devices / stages.
        memory_utilization: the share of each device's memory the plan fills (as vLLM's
            `--gpu-memory-utilization`, default 0.9).
        seq_len: tokens per sequence (an int or `8k`); default the model's context length
            capped at 8192.
        batch: sequences served at once.
        kv_dtype: the KV cache's element type (aliases as on the command line).
        weights_dtype: the weights' element type for serving; default the checkpoint's
            own format (its `quantization_config` or dtype).
        prefill_chunk: tokens per prefill chunk in the serving estimate.
        optimizer: the optimizer of the training estimate (`adamw`, `adam`,
            `sgd-momentum`, `sgd`).
        precision: training precision: `mixed`, `bfloat16` or `float32`.
        revision: Hub branch, tag or commit (the remaining arguments reach the Hub as
            `keras_mha.hub.load_config` does).
        token: Hub token.
        offline: never touch the network.
        endpoint: Hub endpoint.
        timeout: seconds the exchange with the Hub may take.

    Returns:
        A `Plan`; `Plan.to_dict()` equals the CLI's JSON.

    Raises:
        UsageError: a bad argument; the `keras_mha.errors` of `load_config` for the model.

    Example:
        >>> result = plan("bundled:meta-llama/Meta-Llama-3-8B", memory="8GiB")
        >>> result.serving_fits, [s["weights_dtype"] for s in result.suggestions]
        (False, ['int4', 'bfloat16'])
    """
    batch = positive("batch", batch)
    kv_dtype = units.normalize_dtype(kv_dtype, flag="kv_dtype")
    if weights_dtype is not None:
        weights_dtype = units.normalize_dtype(weights_dtype, flag="weights_dtype")
    devices = None
    if gpu is not None or memory is not None:
        devices = parse_devices(gpu=gpu, memory=memory, gpus=gpus,
                                pipeline_parallel=pipeline_parallel,
                                memory_utilization=memory_utilization)  # fmt: skip
    request = MemoryRequest(
        weights_dtype=weights_dtype,
        prefill_chunk=positive("prefill_chunk", prefill_chunk),
        optimizer=optimizer,
        precision=precision,
        devices=devices,
    )
    length = _seq_len(seq_len)
    hub = HubOptions(revision=revision, token=token, endpoint=endpoint, offline=offline,
                     timeout=timeout)  # fmt: skip
    return plan_model(model, seq_lens=[length] if length else None, batch=batch,
                      kv_dtype=kv_dtype, request=request, hub=hub)  # fmt: skip


__all__ = [
    "DEFAULT_SEQ_LEN_CAP",
    "Fits",
    "HubOptions",
    "KVCachePlan",
    "MemoryPlan",
    "ModelSource",
    "Plan",
    "context_length",
    "default_seq_len",
    "load_model",
    "plan",
    "plan_config",
    "plan_model",
]
