"""A small table of common accelerators and their memory, for `--gpu NAME`.

`memory_bytes` is the total the device reports to software: NVIDIA's `nvidia-smi
--query-gpu=memory.total` (MiB; the same figure as `torch.cuda.get_device_properties(0)
.total_memory`), which is a little below the marketed size because ECC and the driver
keep some (an "80GB" H100 reports 81,559 MiB of 81,920). Where no such reading is
widespread the marketed size is used and `source` says "nominal". The CUDA context and
the framework's allocator take a further few hundred MiB that is not subtracted here: pass
`--memory` with your own figure to leave headroom.

Names are matched case-insensitively, ignoring spaces, dashes, underscores and a leading
"nvidia"/"amd"/"geforce"/"tesla"/"instinct", so `H100`, `h100-80gb`, `NVIDIA H100 SXM` and
`nvidia_h100` all find the same row.

Example:
    >>> find_gpu("rtx 4090").memory_bytes
    25757220864
    >>> find_gpu("A100-40GB").name
    'A100 40GB'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from keras_mha.errors import UsageError

MIB = 1024**2
GIB = 1024**3


@dataclass(frozen=True)
class GPU:
    """One accelerator: its display name, memory in bytes, where the figure comes from,
    and the other spellings that find it.

    Example:
        >>> GPU("T4 16GB", 15360 * MIB, "nvidia-smi", ("t4",)).memory_bytes // MIB
        15360
    """

    name: str
    memory_bytes: int
    source: str
    aliases: tuple[str, ...]


# name, memory, source, aliases. Order: the order an unknown `--gpu` name lists them in.
GPUS: tuple[GPU, ...] = (
    GPU("H200 141GB", 143771 * MIB, "nvidia-smi", ("h200", "h200sxm", "h200141gb")),
    GPU(
        "H100 80GB SXM",
        81559 * MIB,
        "nvidia-smi",
        ("h100", "h100sxm", "h10080gb", "h10080gbhbm3", "h100sxm80gb", "h100sxm5"),
    ),  # fmt: skip
    GPU(
        "H100 80GB PCIe", 81559 * MIB, "nvidia-smi", ("h100pcie", "h100pcie80gb", "h10080gbpcie")
    ),  # fmt: skip
    GPU(
        "A100 80GB",
        81920 * MIB,
        "nvidia-smi",
        ("a10080gb", "a100sxm480gb", "a10080gbpcie", "a100sxm80gb"),
    ),  # fmt: skip
    GPU(
        "A100 40GB",
        40960 * MIB,
        "nvidia-smi",
        ("a10040gb", "a100sxm440gb", "a100pcie40gb", "a100sxm40gb"),
    ),  # fmt: skip
    GPU("L40S 48GB", 46068 * MIB, "nvidia-smi", ("l40s", "l40s48gb")),
    GPU("L4 24GB", 23034 * MIB, "nvidia-smi", ("l4", "l424gb")),
    GPU("A10G 24GB", 23028 * MIB, "nvidia-smi", ("a10g", "a10g24gb", "a10", "a1024gb")),
    GPU("RTX 4090 24GB", 24564 * MIB, "nvidia-smi", ("rtx4090", "4090", "rtx409024gb")),
    GPU("RTX 3090 24GB", 24576 * MIB, "nvidia-smi", ("rtx3090", "3090", "rtx309024gb")),
    GPU("T4 16GB", 15360 * MIB, "nvidia-smi", ("t4", "t416gb")),
    GPU("V100 32GB", 32510 * MIB, "nvidia-smi", ("v10032gb", "v100sxm232gb", "v100pcie32gb")),
    GPU(
        "V100 16GB", 16160 * MIB, "nvidia-smi", ("v10016gb", "v100sxm216gb", "v100pcie16gb")
    ),  # fmt: skip
    GPU("MI300X 192GB", 192 * GIB, "nominal", ("mi300x", "mi300x192gb")),
)

# Names that fit several rows of different memory: refused with the choices.
AMBIGUOUS = {"a100": ("A100 80GB", "A100 40GB"), "v100": ("V100 32GB", "V100 16GB")}

_VENDOR_WORDS = ("nvidia", "amd", "geforce", "tesla", "instinct", "radeon")


def normalize_gpu_name(name: str) -> str:
    """The key a name is looked up by: lower case, no separators, no vendor words.

    Example:
        >>> normalize_gpu_name("NVIDIA GeForce RTX 4090")
        'rtx4090'
    """
    key = re.sub(r"[\s_\-./]+", "", name.lower())
    for word in _VENDOR_WORDS:
        if key.startswith(word):
            key = key[len(word) :]
    return key


_BY_KEY: dict[str, GPU] = {}
for _gpu in GPUS:
    for _key in (normalize_gpu_name(_gpu.name), *_gpu.aliases):
        if _key in _BY_KEY and _BY_KEY[_key] is not _gpu:
            raise AssertionError(f"GPU alias {_key!r} names two rows")
        _BY_KEY[_key] = _gpu


def known_gpu_names() -> list[str]:
    """Display names of every GPU in the table.

    Example:
        >>> "T4 16GB" in known_gpu_names()
        True
    """
    return [gpu.name for gpu in GPUS]


def find_gpu(name: str) -> GPU:
    """The table row for `name` (case-insensitive; see the module docstring).

    Raises:
        UsageError: no row matches; the message lists the known names.

    Example:
        >>> find_gpu("nvidia_h100").name
        'H100 80GB SXM'
    """
    key = normalize_gpu_name(str(name))
    if not key:
        raise UsageError(
            f"--gpu {name!r} names no GPU; expected one of: {', '.join(known_gpu_names())}",
            key="--gpu",
            value=name,
        )
    if key in AMBIGUOUS:
        raise UsageError(
            f"--gpu {name!r} is ambiguous: it comes as {' or '.join(AMBIGUOUS[key])}; "
            "name one of them",
            key="--gpu",
            value=name,
        )
    gpu = _BY_KEY.get(key)
    if gpu is None:
        raise UsageError(
            f"--gpu {name!r} is not a GPU keras-mha knows; expected one of: "
            f"{', '.join(known_gpu_names())} (or pass --memory, e.g. --memory 24GiB)",
            key="--gpu",
            value=name,
        )
    return gpu


__all__ = ["AMBIGUOUS", "GPU", "GPUS", "find_gpu", "known_gpu_names", "normalize_gpu_name"]
