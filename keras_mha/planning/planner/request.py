"""What a plan is asked for beyond the model: the serving request (context, batch, KV
dtype) and the memory request (weights format, optimizer, precision, devices).

Example:
    >>> MemoryRequest().device_set() is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass

from keras_mha.planning.planner import memory
from keras_mha.planning.planner.devices import DeviceSet
from keras_mha.planning.planner.gpus import GPU
from keras_mha.planning.planner.quantization import WeightsFormat, checkpoint_format, dtype_format


@dataclass(frozen=True)
class MemoryRequest:
    """What the memory figures assume, beyond batch, length and KV dtype.

    Attributes:
        weights_dtype: serving weights (float32, bfloat16, float16, float8, int8, int4), or
            None for the checkpoint's own format (its `quantization_config`, else its
            `torch_dtype`).
        prefill_chunk: tokens per prefill chunk for the serving workspace.
        optimizer: adamw, adam, sgd-momentum or sgd.
        precision: training precision: mixed (float32 master weights), bfloat16, float32.
        devices: the devices to fit into (`--gpu` / `--memory`, `--gpus`, ...), or None.
        memory_bytes, gpu: one device of this size, used whole (for callers that predate
            `devices`; ignored when `devices` is given).

    Example:
        >>> MemoryRequest().weights_dtype is None
        True
    """

    weights_dtype: str | None = None
    prefill_chunk: int = memory.DEFAULT_PREFILL_CHUNK
    optimizer: str = "adamw"
    precision: str = "mixed"
    memory_bytes: int | None = None
    gpu: GPU | None = None
    devices: DeviceSet | None = None

    def device_set(self) -> DeviceSet | None:
        """The devices to fit into, or None when none were named."""
        if self.devices is not None:
            return self.devices
        if self.memory_bytes is None:
            return None
        return DeviceSet(1, self.memory_bytes, self.gpu, memory_utilization=1.0)


def plan_format(spec, request: MemoryRequest) -> WeightsFormat:
    """The weights format the plan uses: `--weights-dtype`, else the checkpoint's own.

    Example:
        >>> from types import SimpleNamespace
        >>> plan_format(SimpleNamespace(raw={"torch_dtype": "float16"}), MemoryRequest()).id
        'float16'
    """
    if request.weights_dtype is not None:
        return dtype_format(request.weights_dtype)
    return checkpoint_format(getattr(spec, "raw", None) or {})


__all__ = ["MemoryRequest", "plan_format"]
