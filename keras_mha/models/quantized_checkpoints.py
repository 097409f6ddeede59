"""Quantized checkpoints: fp8 block-scaled ones read dequantized, the other formats refused.

A checkpoint whose `config.json` has `quantization_config` `{"quant_method": "fp8",
"weight_block_size": [128, 128], ...}` (DeepSeek-V3, the Qwen3 FP8 releases, transformers'
`FineGrainedFP8Config`) stores each quantized `Linear` as `weight` in float8 e4m3fn and
`weight_scale_inv` of shape `(ceil(out / 128), ceil(in / 128))`; the real weight is
`weight * weight_scale_inv`, one scale per 128x128 block (the last block of a row or
column may be partial). `open_checkpoint` checks every such pair from the headers (dtypes,
the scale's shape, a scale for each fp8 weight and a weight for each scale) before
anything is read; the view it returns hides the scales and hands the loader each fp8
weight already dequantized into the model's dtype, one row of blocks at a time, so that
loading holds one float copy of one tensor at most, as for a float checkpoint.

Which tensors are fp8 is read from their dtypes: the modules a config lists in
`modules_to_not_convert` (or `ignored_layers`) are stored in float and read as such.
Every other `quant_method` (GPTQ, AWQ, bitsandbytes, compressed-tensors, ...) is refused
in one line naming the format and what to do (`QUANTIZED_FORMATS`).

Example:
    >>> import numpy as np, ml_dtypes
    >>> codes = np.full((3, 5), 2.0, dtype=ml_dtypes.float8_e4m3fn)
    >>> scale_inv = np.array([[1.0, 10.0], [100.0, 1000.0]], dtype="float32")
    >>> dequantize_blocks(codes, scale_inv, (2, 4))
    array([[   2.,    2.,    2.,    2.,   20.],
           [   2.,    2.,    2.,    2.,   20.],
           [ 200.,  200.,  200.,  200., 2000.]], dtype=float32)
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from keras_mha.errors import CheckpointError, ConfigError, UnsupportedModelError
from keras_mha.models.safetensors_reader import SafetensorsCheckpoint, aligned_empty
from keras_mha.planning.config_values import shown

#: The formats keras-mha refuses: `quant_method` -> (what it stores, what to do instead).
QUANTIZED_FORMATS = {
    "gptq": (
        "GPTQ: packed int weights with per-group scales and zeros",
        "load the float release with quantize='int4' or 'int8', or calibrate it yourself "
        "with model.quantize('gptq', config=keras.quantizers.GPTQConfig(...))",
    ),
    "awq": (
        "AWQ: packed int4 weights with per-group scales and zeros",
        "load the float release with quantize='int4' or 'int8', or calibrate it yourself "
        "with model.quantize('awq', config=keras.quantizers.AWQConfig(...))",
    ),
    "bitsandbytes": (
        "bitsandbytes: LLM.int8 or nf4/fp4 blocks",
        "load the float release with quantize='int8' or 'int4'",
    ),
    "compressed-tensors": (
        "compressed-tensors: llm-compressor's packed formats",
        "load the float release with quantize='int8', 'int4' or 'float8'",
    ),
    "fbgemm_fp8": (
        "FBGEMM fp8: float8 weights with one scale per output row",
        "load the float release with quantize='int8' or 'float8'",
    ),
}
#: The one quantized format keras-mha reads (dequantized while loading).
FP8_METHOD = "fp8"
#: safetensors dtypes: the fp8 weights, and the scales beside them.
FP8_WEIGHT_DTYPE = "F8_E4M3"
SCALE_DTYPES = ("F32", "BF16", "F16")
SCALE_SUFFIX = "_scale_inv"
#: Activation scales of the "static" scheme, which a weight-only float load cannot apply.
ACTIVATION_SCALE_SUFFIXES = (".activation_scale", ".input_scale")


def fp8_block_size(config: dict, source: str) -> tuple[int, int] | None:
    """The fp8 checkpoint's `(rows, columns)` block, or None for a float checkpoint.

    `(0, 0)` stands for one scale per tensor (`weight_block_size` null).

    Raises:
        UnsupportedModelError: any other `quant_method`, the "static" activation scheme,
            or an fp8 `fmt` other than e4m3 (one line naming the value and what to do).
        ConfigError: a `weight_block_size` or `activation_scheme` that cannot be read.

    Example:
        >>> fp8_block_size({"quantization_config": {"quant_method": "fp8",
        ...     "weight_block_size": [128, 128]}}, "org/model")
        (128, 128)
        >>> fp8_block_size({}, "org/model") is None
        True
    """
    quantization = config.get("quantization_config")
    if quantization is None:
        return None
    if not isinstance(quantization, dict):
        raise ConfigError(
            f"{source}: quantization_config={shown(quantization)}; expected an object",
            key="quantization_config",
            value=quantization,
        )
    method = quantization.get("quant_method")
    if method != FP8_METHOD:
        stores, advice = QUANTIZED_FORMATS.get(
            method, ("a format keras-mha does not know", "load the float release with quantize=")
        )
        raise UnsupportedModelError(
            f"{source}: quantization_config.quant_method={shown(method)} ({stores}) is not "
            f"loaded by keras-mha, which reads float and fp8 block-scaled checkpoints; {advice}"
        )
    where = f"{source}: quantization_config"
    scheme = quantization.get("activation_scheme", "dynamic")
    if scheme == "static":
        raise UnsupportedModelError(
            f"{where}.activation_scheme='static': its per-layer activation scales quantize "
            "inputs for fp8 matmuls, which keras-mha does not run; expected 'dynamic' (load "
            "the float release with quantize='float8' or 'int8')"
        )
    if scheme != "dynamic":
        raise ConfigError(
            f"{where}.activation_scheme={shown(scheme)}; expected 'dynamic' or 'static'",
            key="activation_scheme",
            value=scheme,
        )
    fmt = quantization.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise UnsupportedModelError(
            f"{where}.fmt={shown(fmt)}; keras-mha reads fp8 weights in e4m3 (float8_e4m3fn)"
        )
    block = quantization.get("weight_block_size")
    if block is None:
        return (0, 0)
    if (
        not isinstance(block, list)
        or len(block) != 2
        or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in block)
    ):
        raise ConfigError(
            f"{where}.weight_block_size={shown(block)}; expected two positive integers "
            "such as [128, 128], or null for one scale per tensor",
            key="weight_block_size",
            value=block,
        )
    return block[0], block[1]


def expected_scale_shape(weight_shape, block) -> tuple[int, ...]:
    """The shape of `weight_scale_inv` beside a 2-D fp8 weight: one scale per block.

    Example:
        >>> expected_scale_shape((576, 7168), (128, 128))
        (5, 56)
    """
    if block == (0, 0):
        return ()
    rows, columns = weight_shape
    return math.ceil(rows / block[0]), math.ceil(columns / block[1])


def dequantize_blocks(codes, scale_inv, block, dtype="float32") -> np.ndarray:
    """`codes * scale_inv`, each scale broadcast over its block, as one new aligned array.

    One row of blocks at a time (in float32, then cast to `dtype`), so no float copy of
    the whole tensor is made beside the result.

    Args:
        codes: `(rows, columns)` float8 e4m3fn weights.
        scale_inv: `(ceil(rows / block[0]), ceil(columns / block[1]))` scales (or one,
            with `block == (0, 0)`).
        block: `(rows, columns)` of a block; the last block of each axis may be partial.
        dtype: the result's dtype.
    """
    rows, columns = codes.shape
    scale_inv = np.asarray(scale_inv, dtype=np.float32)
    if block == (0, 0):
        block, scale_inv = (rows, columns), scale_inv.reshape(1, 1)
    result = aligned_empty((rows, columns), dtype)
    # (blocks of rows, columns): each scale repeated over its block's columns.
    column_scales = np.repeat(scale_inv, block[1], axis=1)[:, :columns]
    for index, start in enumerate(range(0, rows, block[0])):
        stop = min(start + block[0], rows)
        result[start:stop] = codes[start:stop].astype(np.float32) * column_scales[index]
    return result


class Fp8BlockCheckpoint:
    """A `SafetensorsCheckpoint` of fp8 blocks seen as float: scales hidden, weights dequantized.

    It answers the loader's questions (`keys`, `shape_of`, `read`, ...) as the float
    checkpoint would; `read` of an fp8 weight returns it dequantized into `dtype`.

    Args:
        checkpoint: the opened `SafetensorsCheckpoint`.
        block: `(rows, columns)` of a block, `(0, 0)` for one scale per tensor.
        dtype: the dtype fp8 weights are dequantized into (the model's).

    Raises:
        CheckpointError: a float8 weight without its scale, a scale without an fp8
            weight, a scale of the wrong shape or dtype, a float8 dtype other than e4m3fn,
            or activation scales (one line naming the tensor, its shape or dtype and what
            was expected).
    """

    def __init__(self, checkpoint: SafetensorsCheckpoint, block, dtype="float32"):
        self.checkpoint = checkpoint
        self.block = tuple(block)
        self.dtype = np.dtype(ml_dtypes.bfloat16 if str(dtype) == "bfloat16" else dtype)
        keys = checkpoint.keys()
        self.scales = {key[: -len(SCALE_SUFFIX)]: key for key in keys if _is_scale(key)}
        for weight, scale in self.scales.items():
            self._check_pair(weight, scale)
        for key in keys:
            self._check_unpaired(key)

    def _fail(self, key, message, value=None):
        path = str(self.checkpoint.file_of(key))
        raise CheckpointError(f"{path}: tensor {key!r} {message}", path=path, key=key, value=value)

    def _check_pair(self, weight, scale):
        if weight not in self.checkpoint:
            self._fail(scale, f"has no weight {weight!r} beside it to scale")
        weight_dtype = self.checkpoint.dtype_of(weight)
        if weight_dtype != FP8_WEIGHT_DTYPE:
            self._fail(
                weight,
                f"has dtype {weight_dtype} but a {SCALE_SUFFIX[1:]} beside it; expected "
                f"{FP8_WEIGHT_DTYPE} (float8_e4m3fn) weights",
                weight_dtype,
            )
        shape = self.checkpoint.shape_of(weight)
        if len(shape) != 2:
            self._fail(weight, f"has shape {shape}; expected a 2-D fp8 weight (out, in)", shape)
        scale_dtype = self.checkpoint.dtype_of(scale)
        if scale_dtype not in SCALE_DTYPES:
            self._fail(
                scale, f"has dtype {scale_dtype}; expected one of {list(SCALE_DTYPES)}", scale_dtype
            )
        have, want = self.checkpoint.shape_of(scale), expected_scale_shape(shape, self.block)
        per_tensor = self.block == (0, 0) and math.prod(have) == 1
        if have != want and not per_tensor:
            blocks = "one scale" if self.block == (0, 0) else f"{self.block[0]}x{self.block[1]}"
            self._fail(
                scale,
                f"has shape {have}; the fp8 weight {weight!r} of shape {shape} in blocks of "
                f"{blocks} (quantization_config.weight_block_size) needs {want}",
                have,
            )

    def _check_unpaired(self, key):
        dtype = self.checkpoint.dtype_of(key)
        if dtype.startswith("F8_") and key not in self.scales:
            if dtype != FP8_WEIGHT_DTYPE:
                self._fail(key, f"has dtype {dtype}; expected {FP8_WEIGHT_DTYPE} (float8_e4m3fn)")
            self._fail(key, f"is {dtype} but has no {key + SCALE_SUFFIX!r} to dequantize it")
        if key.endswith(ACTIVATION_SCALE_SUFFIXES):
            self._fail(
                key,
                "is an activation scale (the 'static' scheme), which keras-mha cannot apply; "
                "expected an activation_scheme='dynamic' checkpoint",
            )

    # The loader's questions, answered as for a float checkpoint.
    def keys(self) -> list[str]:
        return [key for key in self.checkpoint.keys() if not _is_scale(key)]

    def __contains__(self, key: str) -> bool:
        return key in self.checkpoint and not _is_scale(key)

    def file_of(self, key: str):
        return self.checkpoint.file_of(key)

    def shape_of(self, key: str) -> tuple[int, ...]:
        return self.checkpoint.shape_of(key)

    def describe(self) -> str:
        return self.checkpoint.describe()

    def nbytes_of(self, key: str) -> int:
        """The bytes `read(key)` returns (an fp8 weight: dequantized)."""
        if key in self.scales:
            return math.prod(self.shape_of(key)) * self.dtype.itemsize
        return self.checkpoint.nbytes_of(key)

    def read(self, key: str) -> np.ndarray:
        """Tensor `key`; an fp8 weight dequantized into `dtype` (see `dequantize_blocks`)."""
        if key not in self.scales:
            return self.checkpoint.read(key)
        codes = self.checkpoint.read(key)
        scale_inv = self.checkpoint.read(self.scales[key])
        return dequantize_blocks(codes, scale_inv, self.block, self.dtype)


def _is_scale(key: str) -> bool:
    return key.endswith(".weight" + SCALE_SUFFIX)


def open_checkpoint(directory, config: dict, source: str, dtype="float32"):
    """The checkpoint of `directory`: a `SafetensorsCheckpoint`, or for an fp8 block-scaled
    one an `Fp8BlockCheckpoint` checked from its headers (see the module docstring).

    Raises:
        CheckpointError, ConfigError, UnsupportedModelError: as `fp8_block_size` and
            `Fp8BlockCheckpoint`.
    """
    block = fp8_block_size(config, source)
    checkpoint = SafetensorsCheckpoint(directory)
    return checkpoint if block is None else Fp8BlockCheckpoint(checkpoint, block, dtype)


__all__ = [
    "QUANTIZED_FORMATS",
    "Fp8BlockCheckpoint",
    "dequantize_blocks",
    "expected_scale_shape",
    "fp8_block_size",
    "open_checkpoint",
]
