"""`keras_mha.plan(model, gpu="2xH100", ...)`: will a model fit, and how fast can it be
served, in one call. The same answer as `keras-mha inspect MODEL --gpu ... --format json`,
as a typed result. Pure Python: no keras or backend import.

Example:
    >>> import keras_mha
    >>> result = keras_mha.plan("bundled:meta-llama/Llama-3.1-70B", gpu="2xH100", seq_len=8192)
    >>> result.serving_fits, result.max_seq_len
    (True, 37658)
    >>> round(result.decode_tokens_per_s)
    47
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from keras_mha.errors import UsageError
from keras_mha.hub.config import DEFAULT_TIMEOUT_SECONDS, LoadedConfig, load_config
from keras_mha.hub.weights_size import checkpoint_size
from keras_mha.planning.planner import units
from keras_mha.planning.planner.devices import DEFAULT_MEMORY_UTILIZATION, parse_devices
from keras_mha.planning.planner.serving import DEFAULT_PREFILL_CHUNK, positive
from keras_mha.planning.render import report as reports
from keras_mha.planning.render.memory_report import MemoryRequest
from keras_mha.planning.spec import from_config


@dataclass(frozen=True)
class Plan:
    """What fits, and how fast, for one model on some devices (see `plan`).

    Attributes:
        model: the model id (or path) the config came from.
        devices: e.g. `2x H100 80GB SXM`, or None when no devices were named.
        weights_format: the weights the plan assumes (`bfloat16`, `gptq-int4-g128`, ...).
        kv_dtype, batch, seq_len: the request.
        serving_fits: whether `batch` sequences of `seq_len` tokens can be served (None
            without devices).
        max_seq_len: the longest context at `batch` that fits (None: unbounded by memory,
            or no devices named); 0 when nothing fits.
        max_batch: the largest batch at `seq_len` that fits (None: unbounded, or no
            devices); 0 when nothing fits.
        serving_bytes: serving memory per device (the whole model's without devices).
        weights_bytes: the weights per device (the whole model's without devices).
        training_fits: whether training fits the devices (None without devices).
        decode_tokens_per_s: upper bound on decode tokens per second at `batch` (None
            without an accelerator from the table, or when serving does not fit).
        prefill_seconds: lower bound on the time to first token of the batch's prompts.
        verdict: the one-line answer (None without devices).
        suggestions: what would make it fit when it does not (dicts, as in the JSON).
        warnings: what the reading had to assume.

    Example:
        >>> plan("bundled:openai-community/gpt2", memory="1GiB").weights_format
        'float32'
    """

    model: str
    devices: str | None
    weights_format: str
    kv_dtype: str
    batch: int
    seq_len: int
    serving_fits: bool | None
    max_seq_len: int | None
    max_batch: int | None
    serving_bytes: int
    weights_bytes: int
    training_fits: bool | None
    decode_tokens_per_s: float | None
    prefill_seconds: float | None
    verdict: str | None
    suggestions: tuple = ()
    warnings: tuple = ()
    report: dict = field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict:
        """The whole report, equal to `keras-mha inspect MODEL ... --format json` parsed.

        Example:
            >>> plan("bundled:openai-community/gpt2").to_dict()["attention"]["kind"]
            'MHA'
        """
        return copy.deepcopy(self.report)


def _loaded(model, *, revision, token, offline, endpoint, timeout) -> LoadedConfig:
    if isinstance(model, LoadedConfig):
        return model
    if isinstance(model, Mapping):
        config = dict(model)
        name = config.get("_name_or_path")
        name = name if isinstance(name, str) and name.strip() else "config"
        return LoadedConfig(config, "local", name, Path("<config dict>"), None)
    if isinstance(model, (str, Path)):
        return load_config(str(model), revision=revision, token=token, endpoint=endpoint,
                           offline=offline, timeout=timeout)  # fmt: skip
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
    loaded = _loaded(model, revision=revision, token=token, offline=offline,
                     endpoint=endpoint, timeout=timeout)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # what the reader guessed is in the report
        spec = from_config(loaded.config, model_id=loaded.model_id)
    length = _seq_len(seq_len) or reports.default_seq_len(spec)
    size = checkpoint_size(loaded, token=token, endpoint=endpoint, offline=offline,
                           timeout=timeout)  # fmt: skip
    report = reports.build_report(loaded, spec, seq_lens=[length], batch=batch,
                                  kv_dtype=kv_dtype, memory_request=request,
                                  checkpoint_size=size)  # fmt: skip
    return _plan_from_report(report, devices)


def _plan_from_report(report: dict, devices) -> Plan:
    serving = report["memory"]["serving"]
    fits = report.get("fits")
    speed = report.get("speed_bounds")
    return Plan(
        model=report["model"],
        devices=devices.name if devices else None,
        weights_format=report["memory"]["weights_format"]["id"],
        kv_dtype=serving["kv_dtype"],
        batch=serving["batch"],
        seq_len=serving["seq_len"],
        serving_fits=fits["serving_fits"] if fits else None,
        max_seq_len=fits["max_seq_len"] if fits else None,
        max_batch=fits["max_batch"] if fits else None,
        serving_bytes=fits["serving_bytes"] if fits else serving["total_bytes"],
        weights_bytes=fits["weights_bytes"] if fits else serving["weights_bytes"],
        training_fits=fits["training_fits"] if fits else None,
        decode_tokens_per_s=speed["decode_tokens_per_s"] if speed else None,
        prefill_seconds=speed["prefill_seconds"] if speed else None,
        verdict=fits["verdict"] if fits else None,
        suggestions=tuple(fits["suggestions"]) if fits else (),
        warnings=tuple(report["warnings"]),
        report=report,
    )


__all__ = ["Plan", "plan"]
