"""The devices a plan targets: how many, which accelerator (or how much memory each), how
they share the model (tensor and pipeline parallel), and the fraction of their memory the
plan may use.

What people type, all case-insensitive:

- `--gpu H100`, `--gpu 2xH100`, `--gpu H100x2`, `--gpu "4 x A100-80GB"`;
- `--gpus N` (with `--gpu NAME` or `--memory SIZE`): N devices of that kind;
- `--memory 80GiB`, `--memory 2x80GiB`: devices known only by their memory;
- `--pipeline-parallel P`: P pipeline stages; the tensor-parallel size is devices / P;
- `--memory-utilization F` (default 0.9, as vLLM's `--gpu-memory-utilization`): the share
  of each device's memory the plan fills; the rest is left for the CUDA context, CUDA
  graphs, communication buffers and fragmentation.

Example:
    >>> devices = parse_devices(gpu="2xH100")
    >>> devices.count, devices.gpu.name, devices.tensor_parallel
    (2, 'H100 80GB SXM', 2)
    >>> parse_devices(memory="2x80GiB").memory_bytes == 80 * 2**30
    True
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass

from keras_mha.errors import UsageError
from keras_mha.planning.planner import units
from keras_mha.planning.planner.gpus import AMBIGUOUS, GPU, find_gpu, lookup_gpu, normalize_gpu_name

DEFAULT_MEMORY_UTILIZATION = 0.9
MAX_DEVICES = 4096
# "2x H100", "2 * H100", "2×H100" and the count after the name: "H100x2", "H100 x 2".
_TIMES = "xX*\u00d7"
_DIGITS = "0123456789"


@dataclass(frozen=True)
class DeviceSet:
    """Identical devices that serve one model together.

    Attributes:
        count: number of devices.
        memory_bytes: memory of each device.
        gpu: the accelerator table's row, or None for `--memory`.
        pipeline_parallel: pipeline stages; `tensor_parallel = count // pipeline_parallel`.
        memory_utilization: share of each device's memory the plan may fill.

    Example:
        >>> DeviceSet(2, 1000, None).usable_memory_bytes
        900
    """

    count: int
    memory_bytes: int
    gpu: GPU | None
    pipeline_parallel: int = 1
    memory_utilization: float = DEFAULT_MEMORY_UTILIZATION

    @property
    def tensor_parallel(self) -> int:
        """Devices per pipeline stage, which split every layer between them."""
        return self.count // self.pipeline_parallel

    @property
    def usable_memory_bytes(self) -> int:
        """`memory_utilization` of each device's memory, rounded down to whole bytes."""
        return math.floor(self.memory_bytes * self.memory_utilization)

    @property
    def name(self) -> str:
        """`2x H100 80GB SXM`, `H100 80GB SXM`, `2x 80.00 GiB`.

        Example:
            >>> DeviceSet(1, 2**30, None).name
            '1.00 GiB'
        """
        single = self.gpu.name if self.gpu else _gib(self.memory_bytes)
        return single if self.count == 1 else f"{self.count}x {single}"

    def as_dict(self) -> dict:
        """JSON-ready.

        Example:
            >>> DeviceSet(2, 10, None).as_dict()["tensor_parallel"]
            2
        """
        return {
            "count": self.count,
            "name": self.name,
            "gpu": self.gpu.name if self.gpu else None,
            "memory_bytes": self.memory_bytes,
            "usable_memory_bytes": self.usable_memory_bytes,
            "memory_utilization": self.memory_utilization,
            "tensor_parallel": self.tensor_parallel,
            "pipeline_parallel": self.pipeline_parallel,
        }


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"


def parse_device_count(value, *, flag: str = "--gpus", shown=None) -> int:
    """A number of devices: an int (not a bool, not a float: `2.5` is refused, never
    rounded) or its ASCII decimal digits; from 1 to `MAX_DEVICES`. The command line and
    `keras_mha.plan` both read `--gpus` / `gpus=` through it.

    Example:
        >>> parse_device_count("4"), parse_device_count(4)
        (4, 4)
    """
    shown = value if shown is None else shown
    if isinstance(value, str):
        digits = units.bounded_text(value, flag=flag).strip()
        count = int(digits) if digits.isascii() and digits.isdigit() else None
    elif isinstance(value, bool):
        count = None
    else:
        try:
            count = operator.index(value)  # ints and NumPy integers; a float raises
        except TypeError:
            count = None
    if count is None:
        raise UsageError(
            f"{flag} {shown!r} is not a number of devices; expected an integer from 1 to "
            f"{MAX_DEVICES}",
            key=flag,
            value=shown,
        )
    if not 1 <= count <= MAX_DEVICES:
        raise UsageError(
            f"{flag} {shown!r} names {count} devices; expected 1 to {MAX_DEVICES}",
            key=flag,
            value=shown,
        )
    return count


def _count_splits(text: str) -> list[tuple[str, str]]:
    """The (count, name) readings of `text`: digits, a times sign and a name, or a name, a
    times sign and digits, spaces allowed around the sign. One scan from each end: linear
    in the length, whatever the text (a backtracking pattern here was quadratic)."""
    stripped = text.strip()
    splits = []
    leading = len(stripped) - len(stripped.lstrip(_DIGITS))
    rest = stripped[leading:].lstrip()
    if leading and rest[:1] and rest[0] in _TIMES and rest[1:].strip():
        splits.append((stripped[:leading], rest[1:].strip()))
    trailing = len(stripped) - len(stripped.rstrip(_DIGITS))
    rest = stripped[: len(stripped) - trailing].rstrip()
    if trailing and rest[-1:] and rest[-1] in _TIMES and rest[:-1].strip():
        splits.append((stripped[len(stripped) - trailing :], rest[:-1].strip()))
    return splits


def split_count(text: str, flag: str, names=None) -> tuple[int | None, str]:
    """`("2xH100")` -> `(2, "H100")`; `("H100")` -> `(None, "H100")`.

    A split is kept only when `names(rest)` accepts what remains (default: an accelerator
    of the table, or an ambiguous family of them), so a name that itself contains an `x`
    and digits (`MI300X`, `rtx9090`) is never cut into a count.

    Example:
        >>> split_count("H100x2", "--gpu"), split_count("mi300x", "--gpu")
        ((2, 'H100'), (None, 'mi300x'))
    """
    text = str(text)
    names = names or _is_accelerator_name
    if names(text):
        return None, text
    for count, name in _count_splits(text):
        if names(name):
            return parse_device_count(count, flag=flag, shown=text), name
    return None, text


def _is_accelerator_name(text: str) -> bool:
    return lookup_gpu(text) is not None or normalize_gpu_name(text) in AMBIGUOUS


def _is_memory_size(text: str) -> bool:
    return _MEMORY_SIZE.fullmatch(text) is not None


# A number and a unit ending in b: each part a different class of characters, so the
# pattern cannot backtrack more than linearly.
_MEMORY_SIZE = re.compile(r"\s*[0-9.,_]+\s*[a-z]*b\s*", re.IGNORECASE)


def parse_fraction(value, *, flag: str = "--memory-utilization") -> float:
    """A share of memory in (0, 1].

    Example:
        >>> parse_fraction("0.95")
        0.95
    """
    if isinstance(value, str):
        units.bounded_text(value, flag=flag)
    try:
        fraction = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int past 1e308
        fraction = math.nan
    if isinstance(value, bool) or not math.isfinite(fraction) or not 0 < fraction <= 1:
        raise UsageError(
            f"{flag} {value!r} is not a share of memory; expected a number in (0, 1], e.g. 0.9",
            key=flag,
            value=value,
        )
    return fraction


def parse_devices(
    *,
    gpu: str | None = None,
    memory: str | int | None = None,
    gpus: int | str | None = None,
    pipeline_parallel: int | str = 1,
    memory_utilization: float | str = DEFAULT_MEMORY_UTILIZATION,
) -> DeviceSet:
    """The `DeviceSet` that `--gpu` / `--memory`, `--gpus`, `--pipeline-parallel` and
    `--memory-utilization` describe (see the module docstring).

    Raises:
        UsageError: an unknown accelerator, both or neither of `gpu` and `memory`, a count
            given twice with different values, or a pipeline size that does not divide the
            devices.

    Example:
        >>> devices = parse_devices(gpu="H100", gpus=4, pipeline_parallel=2)
        >>> devices.tensor_parallel, devices.name
        (2, '4x H100 80GB SXM')
    """
    if (gpu is None) == (memory is None):
        raise UsageError(
            "name the devices with one of --gpu NAME (e.g. H100, 2xH100) or --memory SIZE "
            "(e.g. 24GiB, 2x80GiB)",
            key="--gpu",
            value=gpu,
        )
    flag = "--gpu" if gpu is not None else "--memory"
    if gpu is not None:
        count, name = split_count(units.bounded_text(gpu, flag=flag), flag)
        row = find_gpu(name, flag=flag)
        memory_bytes = row.memory_bytes
    elif isinstance(memory, int) and not isinstance(memory, bool):
        count, row, memory_bytes = None, None, units.check_memory_bytes(memory, flag=flag)
    else:
        count, size = split_count(units.bounded_text(memory, flag=flag), flag, _is_memory_size)
        row, memory_bytes = None, units.parse_memory_size(size, flag=flag)
    if gpus is not None:
        requested = parse_device_count(gpus, flag="--gpus")
        if count is not None and count != requested:
            raise UsageError(
                f"--gpus {requested} contradicts {flag} {gpu if gpu is not None else memory!r}, "
                f"which names {count} devices; give the count once",
                key="--gpus",
                value=gpus,
            )
        count = requested
    count = count or 1
    stages = parse_device_count(pipeline_parallel, flag="--pipeline-parallel")
    if count % stages:
        raise UsageError(
            f"--pipeline-parallel {stages} does not divide the {count} devices; expected a "
            f"divisor of {count} (each stage gets devices / stages)",
            key="--pipeline-parallel",
            value=pipeline_parallel,
        )
    return DeviceSet(
        count=count,
        memory_bytes=memory_bytes,
        gpu=row,
        pipeline_parallel=stages,
        memory_utilization=parse_fraction(memory_utilization),
    )


__all__ = [
    "DEFAULT_MEMORY_UTILIZATION",
    "DeviceSet",
    "MAX_DEVICES",
    "parse_device_count",
    "parse_devices",
    "parse_fraction",
    "split_count",
]
