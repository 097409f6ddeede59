"""The accelerator table: memory, memory bandwidth and dense tensor peaks of common GPUs and
TPUs, for `--gpu NAME` and `keras-mha gpus`.

Each row is one device (one GPU, one TPU chip): `memory_bytes` is what software sees; for
NVIDIA cards the published `nvidia-smi --query-gpu=memory.total` figure (a little below the
marketed size because ECC and the driver keep some: an "80GB" H100 reports 81,559 MiB),
elsewhere the datasheet's size ("nominal"). `bandwidth_bytes_per_s` is the datasheet's peak
memory bandwidth; `dense_16bit_flops` and `dense_fp8_flops` the dense (no 2:4 sparsity)
tensor-core peaks in bfloat16 (float16 on cards without bfloat16: T4, V100) and float8
(None where the device has no float8 units). Where a datasheet quotes only sparse figures
they are halved. `spec_source` names the datasheet; docs/concepts/memory-planner.md lists them.

Names are matched case-insensitively, ignoring spaces, dashes, underscores and a leading
"nvidia"/"amd"/"geforce"/"tesla"/"instinct"/"google"/"cloud", so `H100`, `h100-80gb`,
`NVIDIA H100 SXM` and `nvidia_h100` all find the same row.

Example:
    >>> find_gpu("rtx 4090").memory_bytes
    25757220864
    >>> find_gpu("A100-40GB").name
    'A100 40GB'
    >>> find_gpu("tpu-v5e").dense_16bit_flops
    197000000000000.0
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from keras_mha.errors import UsageError

MIB = 1024**2
GIB = 1024**3
TB_PER_S = 10**12
TFLOPS = 1e12

# What `GPU.source` says about the memory figure.
NVIDIA_SMI = "published nvidia-smi figure"
NOMINAL = "nominal (datasheet)"


@dataclass(frozen=True)
class GPU:
    """One accelerator (a GPU, or one TPU chip).

    Attributes:
        name: display name.
        memory_bytes: memory software sees (see the module docstring).
        source: where `memory_bytes` comes from (`NVIDIA_SMI` or `NOMINAL`).
        aliases: other spellings that find the row (normalised, see `normalize_gpu_name`).
        bandwidth_bytes_per_s: peak memory bandwidth.
        dense_16bit_flops: dense bfloat16 (float16 where there is no bfloat16) tensor peak.
        dense_fp8_flops: dense float8 tensor peak, None without float8 units.
        compute_dtype: the 16-bit type `dense_16bit_flops` is for.
        spec_source: the datasheet the bandwidth and peaks come from.

    Example:
        >>> gpu = find_gpu("H100")
        >>> gpu.bandwidth_bytes_per_s / 1e12, gpu.dense_fp8_flops / 1e12
        (3.35, 1979.0)
    """

    name: str
    memory_bytes: int
    source: str
    aliases: tuple[str, ...]
    bandwidth_bytes_per_s: int
    dense_16bit_flops: float
    dense_fp8_flops: float | None
    compute_dtype: str
    spec_source: str

    def as_dict(self) -> dict:
        """JSON-ready (aliases left out).

        Example:
            >>> sorted(find_gpu("T4").as_dict())[:3]
            ['bandwidth_bytes_per_s', 'compute_dtype', 'dense_16bit_flops']
        """
        values = asdict(self)
        values.pop("aliases")
        return values


def _row(name, memory, source, aliases, bandwidth_tb_s, bf16_tflops, fp8_tflops, spec,
         compute_dtype="bfloat16"):  # fmt: skip
    return GPU(
        name=name,
        memory_bytes=memory,
        source=source,
        aliases=aliases,
        bandwidth_bytes_per_s=round(bandwidth_tb_s * TB_PER_S),
        dense_16bit_flops=bf16_tflops * TFLOPS,
        dense_fp8_flops=None if fp8_tflops is None else fp8_tflops * TFLOPS,
        compute_dtype=compute_dtype,
        spec_source=spec,
    )


# name, memory, memory source, aliases, bandwidth (TB/s), dense 16-bit and float8 peaks
# (TFLOPS), datasheet. Order: the order `keras-mha gpus` and an unknown `--gpu` list them in.
GPUS: tuple[GPU, ...] = (
    # -- NVIDIA Blackwell --
    _row("GB200 186GB", 186 * GIB, NOMINAL, ("gb200", "gb200nvl72"), 8.0, 2500, 5000,
         "NVIDIA GB200 NVL72 datasheet: per GPU 1/72 of 13.4 TB, 576 TB/s, 360 PF BF16 and "
         "720 PF FP8 sparse"),
    _row("B200 180GB", 180 * GIB, NOMINAL, ("b200", "b200sxm", "hgxb200"), 8.0, 2250, 4500,
         "NVIDIA HGX B200 datasheet: per GPU 1/8 of 1,440 GB, 64 TB/s, 36 PF BF16 and "
         "72 PF FP8 sparse"),
    _row("RTX 5090 32GB", 32 * GIB, NOMINAL, ("rtx5090", "5090"), 1.792, 209.5, 419,
         "NVIDIA RTX Blackwell GPU architecture whitepaper (FP32 accumulate)"),
    # -- NVIDIA Hopper --
    _row("H200 141GB", 143771 * MIB, NVIDIA_SMI, ("h200", "h200sxm", "h200141gb"), 4.8, 989,
         1979, "NVIDIA H200 datasheet: 4.8 TB/s, 1,979 TF BF16 and 3,958 TF FP8 sparse"),
    _row("H100 80GB SXM", 81559 * MIB, NVIDIA_SMI,
         ("h100", "h100sxm", "h10080gb", "h10080gbhbm3", "h100sxm80gb", "h100sxm5"), 3.35, 989,
         1979, "NVIDIA H100 datasheet (SXM): 3.35 TB/s, 1,979 TF BF16 and 3,958 TF FP8 sparse"),
    _row("H100 80GB PCIe", 81559 * MIB, NVIDIA_SMI,
         ("h100pcie", "h100pcie80gb", "h10080gbpcie"), 2.0, 756, 1513,
         "NVIDIA H100 datasheet (PCIe): 2 TB/s, 1,513 TF BF16 and 3,026 TF FP8 sparse"),
    _row("H20 96GB", 96 * GIB, NOMINAL, ("h20", "h2096gb"), 4.0, 148, 296,
         "NVIDIA H20 product brief: 96 GB HBM3, 4.0 TB/s, 148 TF BF16 and 296 TF FP8 dense"),
    _row("GH200 96GB", 96 * GIB, NOMINAL, ("gh20096gb", "gh200hbm3"), 4.0, 989, 1979,
         "NVIDIA GH200 Grace Hopper datasheet (HBM3): 4 TB/s, H100 tensor cores"),
    _row("GH200 144GB", 144 * GIB, NOMINAL, ("gh200144gb", "gh200hbm3e"), 4.9, 989, 1979,
         "NVIDIA GH200 Grace Hopper datasheet (HBM3e): 4.9 TB/s, H100 tensor cores"),
    # -- NVIDIA Ada and Ampere --
    _row("L40S 48GB", 46068 * MIB, NVIDIA_SMI, ("l40s", "l40s48gb"), 0.864, 362, 733,
         "NVIDIA L40S datasheet: 864 GB/s, 733 TF BF16 and 1,466 TF FP8 sparse"),
    _row("L4 24GB", 23034 * MIB, NVIDIA_SMI, ("l4", "l424gb"), 0.3, 121, 242.5,
         "NVIDIA L4 datasheet: 300 GB/s, 242 TF BF16 and 485 TF FP8 sparse"),
    _row("RTX 4090 24GB", 24564 * MIB, NVIDIA_SMI, ("rtx4090", "4090", "rtx409024gb"), 1.008,
         165.2, 330.3, "NVIDIA Ada GPU architecture whitepaper (FP32 accumulate)"),
    _row("A100 80GB", 81920 * MIB, NVIDIA_SMI,
         ("a10080gb", "a100sxm480gb", "a10080gbpcie", "a100sxm80gb"), 2.039, 312, None,
         "NVIDIA A100 datasheet (80GB SXM): 2,039 GB/s, 312 TF BF16 dense"),
    _row("A100 40GB", 40960 * MIB, NVIDIA_SMI,
         ("a10040gb", "a100sxm440gb", "a100pcie40gb", "a100sxm40gb"), 1.555, 312, None,
         "NVIDIA A100 datasheet (40GB): 1,555 GB/s, 312 TF BF16 dense"),
    _row("A10G 24GB", 23028 * MIB, NVIDIA_SMI, ("a10g", "a10g24gb"), 0.6, 70, None,
         "AWS G5 (Baseten, 'NVIDIA A10 vs A10G'): 600 GB/s, 70 TF BF16 tensor"),
    _row("A10 24GB", 23028 * MIB, NVIDIA_SMI, ("a10", "a1024gb"), 0.6, 125, None,
         "NVIDIA A10 datasheet: 600 GB/s, 125 TF BF16 dense (250 sparse)"),
    _row("RTX 3090 24GB", 24576 * MIB, NVIDIA_SMI, ("rtx3090", "3090", "rtx309024gb"), 0.936, 71,
         None, "NVIDIA Ampere GA102 whitepaper (FP32 accumulate)"),
    # -- NVIDIA Turing and Volta: no bfloat16, float16 peaks --
    _row("T4 16GB", 15360 * MIB, NVIDIA_SMI, ("t4", "t416gb"), 0.32, 65, None,
         "NVIDIA T4 datasheet: 320 GB/s, 65 TF FP16 mixed precision", "float16"),
    _row("V100 32GB", 32510 * MIB, NVIDIA_SMI,
         ("v10032gb", "v100sxm232gb", "v100pcie32gb"), 0.9, 125, None,
         "NVIDIA V100 datasheet (SXM2): 900 GB/s, 125 TF FP16 tensor", "float16"),
    _row("V100 16GB", 16160 * MIB, NVIDIA_SMI,
         ("v10016gb", "v100sxm216gb", "v100pcie16gb"), 0.9, 125, None,
         "NVIDIA V100 datasheet (SXM2): 900 GB/s, 125 TF FP16 tensor", "float16"),
    # -- AMD Instinct --
    _row("MI325X 256GB", 256 * GIB, NOMINAL, ("mi325x", "mi325x256gb"), 6.0, 1307.4, 2614.9,
         "AMD Instinct MI325X datasheet: 6 TB/s, 1,307.4 TF BF16 and 2,614.9 TF FP8 dense"),
    _row("MI300X 192GB", 192 * GIB, NOMINAL, ("mi300x", "mi300x192gb"), 5.3, 1307.4, 2614.9,
         "AMD Instinct MI300X datasheet: 5.3 TB/s, 1,307.4 TF BF16 and 2,614.9 TF FP8 dense"),
    _row("MI250X 128GB", 128 * GIB, NOMINAL, ("mi250x", "mi250x128gb"), 3.2768, 383, None,
         "AMD Instinct MI250X datasheet: 3.2 TB/s, 383 TF BF16 (both dies)"),
    # -- Google Cloud TPU, per chip --
    _row("TPU v6e 32GB", 32 * GIB, NOMINAL, ("tpuv6e", "v6e", "trillium", "tputrillium"), 1.64,
         918, None, "Google Cloud TPU v6e docs: 32 GiB HBM, 1,640 GB/s, 918 TF BF16 per chip"),
    _row("TPU v5p 95GB", 95 * GIB, NOMINAL, ("tpuv5p", "v5p"), 2.765, 459, None,
         "Google Cloud TPU v5p docs: 95 GiB HBM2e, 2,765 GB/s, 459 TF BF16 per chip"),
    _row("TPU v5e 16GB", 16 * GIB, NOMINAL, ("tpuv5e", "v5e", "tpuv5litepod", "v5litepod"),
         0.819, 197, None,
         "Google Cloud TPU v5e docs: 16 GiB HBM2, 819 GB/s, 197 TF BF16 per chip"),
    _row("TPU v4 32GB", 32 * GIB, NOMINAL, ("tpuv4", "v4"), 1.2, 275, None,
         "Google Cloud TPU v4 docs: 32 GiB HBM2, 1,200 GB/s, 275 TF BF16 per chip"),
)  # fmt: skip

# Names that fit several rows of different memory: refused with the choices.
AMBIGUOUS = {
    "a100": ("A100 80GB", "A100 40GB"),
    "v100": ("V100 32GB", "V100 16GB"),
    "gh200": ("GH200 96GB", "GH200 144GB"),
    "tpu": ("TPU v6e 32GB", "TPU v5p 95GB", "TPU v5e 16GB", "TPU v4 32GB"),
}

_VENDOR_WORDS = ("nvidia", "amd", "geforce", "tesla", "instinct", "radeon", "google", "cloud")


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
    """Display names of every accelerator in the table.

    Example:
        >>> "T4 16GB" in known_gpu_names()
        True
    """
    return [gpu.name for gpu in GPUS]


def lookup_gpu(name: str) -> GPU | None:
    """The row for `name`, or None (no error; see `find_gpu`).

    Example:
        >>> lookup_gpu("h100").name, lookup_gpu("h1000")
        ('H100 80GB SXM', None)
    """
    return _BY_KEY.get(normalize_gpu_name(str(name)))


def find_gpu(name: str, *, flag: str = "--gpu") -> GPU:
    """The table row for `name` (case-insensitive; see the module docstring).

    Raises:
        UsageError: no row matches (the message lists the known names), or the name fits
            several rows of different memory.

    Example:
        >>> find_gpu("nvidia_h100").name
        'H100 80GB SXM'
    """
    key = normalize_gpu_name(str(name))
    if not key:
        raise UsageError(
            f"{flag} {name!r} names no GPU; expected one of: {', '.join(known_gpu_names())}",
            key=flag,
            value=name,
        )
    if key in AMBIGUOUS:
        raise UsageError(
            f"{flag} {name!r} is ambiguous: it comes as {' or '.join(AMBIGUOUS[key])}; "
            "name one of them",
            key=flag,
            value=name,
        )
    gpu = _BY_KEY.get(key)
    if gpu is None:
        raise UsageError(
            f"{flag} {name!r} is not an accelerator keras-mha knows; expected one of: "
            f"{', '.join(known_gpu_names())} (or pass --memory, e.g. --memory 24GiB; "
            "`keras-mha gpus` lists them)",
            key=flag,
            value=name,
        )
    return gpu


__all__ = [
    "AMBIGUOUS",
    "GPU",
    "GPUS",
    "NOMINAL",
    "NVIDIA_SMI",
    "find_gpu",
    "known_gpu_names",
    "lookup_gpu",
    "normalize_gpu_name",
]
