"""What would make serving fit when it does not: smaller weights on the same devices, or
more devices of the same kind. Each suggestion is data (the report's
`fits.suggestions`), checked with the same serving formula as the plan itself.

Candidates, in order: the generic float8, int8 and int4 formats that store fewer bits per
weight than the plan's; then the fewest devices that fit with the plan's own weights:
tensor parallel 2, 4 or 8 (sizes vLLM accepts for the model's heads), then pipeline stages
of 8 devices (2 to 8 stages). Pure Python.

Example:
    >>> from keras_mha.hub.config import load_config
    >>> from keras_mha.planning.spec import from_config
    >>> from keras_mha.planning.planner.devices import parse_devices
    >>> from keras_mha.planning.planner.quantization import dtype_format
    >>> spec = from_config(load_config("bundled:meta-llama/Llama-3.1-70B").config)
    >>> found = suggestions(spec, weights_format=dtype_format("bfloat16"),
    ...     devices=parse_devices(gpu="H100"), batch=1, seq_len=8192, kv_dtype="bfloat16")
    >>> [(s["weights_dtype"], s["devices"]) for s in found]
    [('float8', 1), ('int8', 1), ('int4', 1), ('bfloat16', 2)]
"""

from __future__ import annotations

from keras_mha.planning.costs import KV_DTYPE_BITS
from keras_mha.planning.planner.devices import DeviceSet
from keras_mha.planning.planner.inventory import weight_groups
from keras_mha.planning.planner.placement import Placement, tensor_parallel_problem
from keras_mha.planning.planner.quantization import GENERIC_DTYPES, WeightsFormat, dtype_format
from keras_mha.planning.planner.serving import DEFAULT_PREFILL_CHUNK, ServingModel
from keras_mha.planning.spec import ModelSpec

TENSOR_PARALLEL_SIZES = (2, 4, 8)
MAX_PIPELINE_STAGES = 8


def _device_candidates(spec: ModelSpec, devices: DeviceSet):
    """Placements with more devices than `devices`, fewest first."""
    layers = len(spec.layer_kinds)
    for size in TENSOR_PARALLEL_SIZES:
        if size > devices.count and tensor_parallel_problem(spec, size) is None:
            yield Placement(size, 1)
    largest = max(
        (size for size in TENSOR_PARALLEL_SIZES if tensor_parallel_problem(spec, size) is None),
        default=1,
    )
    if spec.is_encoder_decoder:
        return
    for stages in range(2, min(MAX_PIPELINE_STAGES, layers) + 1):
        if largest * stages > devices.count:
            yield Placement(largest, stages)


def suggestions(
    spec: ModelSpec,
    *,
    weights_format: WeightsFormat,
    devices: DeviceSet,
    batch: int,
    seq_len: int,
    kv_dtype: str,
    compute_dtype: str = "bfloat16",
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
) -> list[dict]:
    """Ways to serve `batch` x `seq_len` tokens that fit where the plan does not (see the
    module docstring). Each: `{"weights_dtype", "devices", "tensor_parallel",
    "pipeline_parallel", "serving_bytes"}` (per device).

    Returns [] when nothing the candidates offer fits.
    """
    budget = devices.usable_memory_bytes
    groups = weight_groups(spec)
    current = Placement(devices.tensor_parallel, devices.pipeline_parallel)

    def fitting(fmt: WeightsFormat, placement: Placement) -> int | None:
        model = ServingModel(spec, weights_format=fmt, kv_dtype=kv_dtype,
                             compute_dtype=compute_dtype, prefill_chunk=prefill_chunk,
                             placement=placement, groups=groups)  # fmt: skip
        needed = model(batch, seq_len)
        return needed if needed <= budget else None

    found = []
    for dtype in GENERIC_DTYPES:
        if KV_DTYPE_BITS[dtype] >= weights_format.bits:
            continue
        needed = fitting(dtype_format(dtype), current)
        if needed is not None:
            found.append(_entry(dtype, current, needed))
    for placement in _device_candidates(spec, devices):
        needed = fitting(weights_format, placement)
        if needed is not None:
            found.append(_entry(weights_format.id, placement, needed))
            break
    return found


def _entry(weights_dtype: str, placement: Placement, needed: int) -> dict:
    return {
        "weights_dtype": weights_dtype,
        "devices": placement.devices,
        "tensor_parallel": placement.tensor_parallel,
        "pipeline_parallel": placement.pipeline_parallel,
        "serving_bytes": needed,
    }


__all__ = ["suggestions"]
