"""How each weight quantization mode stores one `(in_features, out_features)` matrix.

One table, read by the planner (`planner.quantization.dtype_format`: the generic `int8`,
`int4` and `float8` of `--weights-dtype`) and by the runtime (`keras_mha.models.quantize`:
the modes `model.quantize` / `from_pretrained(quantize=)` take and the Keras config each
runs with), so that the bytes the planner states for a mode are the bytes Keras allocates.

The runtime's schemes are Keras's own `Dense` quantization (keras-mha's attention layers
quantize through a `Dense` per projection):

- `int8`: int8 codes, one scale per output column in the layer's float (variable) dtype.
- `int4`: two int4 codes per byte (packed along the output columns), and per block of 128
  inputs of each output column a scale in the float dtype and an int8 zero point
  (asymmetric), plus a float32 group index per input (`g_idx`). Keras's default since its
  sub-channel int4; keras-mha asks for it explicitly.
- `int4-column`: Keras's per-column int4 (`Int4QuantizationConfig(block_size=-1)`): codes
  as `int4`, one scale per output column.
- `keras-float8`: Keras's `float8`, an FP8 *training* scheme: the kernel stays in the float
  dtype, with three float32 scales and three float32 amax histories of 1,024 per layer.

`float8` (1-byte weights and a float32 scale per 128x128 block, as fp8 checkpoints and
vLLM store them) has no runtime: the planner labels it "plan only".

Everything else (embeddings, the LM head, norms, biases, routers) stays in the float dtype.

Pure Python.

Example:
    >>> weight_format("int8").matrix_bytes(256, 4, "bfloat16")  # 1,024 codes + 4 scales
    1032
    >>> weight_format("float8").runtime_mode is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# Bytes of the float dtypes a kernel or a scale may be stored in.
_FLOAT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _ceil(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


@dataclass(frozen=True)
class WeightFormat:
    """One weight quantization mode (see the module docstring).

    Attributes:
        name: the table's name (`int8`, `int4`, `float8`, ...).
        label: one line for people.
        code_bits: bits per kernel element, packed along the output columns; None where
            the kernel stays in the float dtype.
        scale_block: `(inputs, outputs)` one scale covers; `(None, 1)` is one scale per
            output column, None no per-matrix scales.
        scale_dtype: what a scale is stored in; None: the layer's float dtype.
        zero_point_bits: bits of a zero point per scale (0: symmetric).
        index_bytes_per_input: bytes of the group index kept per input feature.
        layer_float32: float32 values per layer beside kernel and scales (amax histories).
        runtime_mode: the `quantize(mode)` that stores exactly this, or None (plan only).
        block_size: the `Int4QuantizationConfig(block_size=...)` it runs with, or None.
    """

    name: str
    label: str
    code_bits: int | None
    scale_block: tuple[int | None, int] | None
    scale_dtype: str | None = None
    zero_point_bits: int = 0
    index_bytes_per_input: int = 0
    layer_float32: int = 0
    runtime_mode: str | None = None
    block_size: int | None = None

    @property
    def plan_only(self) -> bool:
        """Whether keras-mha's runtime cannot store weights this way."""
        return self.runtime_mode is None

    def scales(self, size_in: int, size_out: int) -> int:
        """How many scales one matrix holds.

        Example:
            >>> weight_format("int4").scales(260, 300)  # 3 blocks of inputs x 300 columns
            900
        """
        if self.scale_block is None:
            return 0
        block_in, block_out = self.scale_block
        return _ceil(size_in, block_in or size_in) * _ceil(size_out, block_out)

    def matrix_bytes(self, size_in: int, size_out: int, float_dtype: str) -> int:
        """Bytes of one quantized `(size_in, size_out)` matrix: codes, scales, zero points,
        indices and per-layer state; `float_dtype` is the layer's float (variable) dtype.

        Example:
            >>> weight_format("keras-float8").matrix_bytes(2, 2, "float32")  # 16 + 3,075 x 4
            12316
        """
        if float_dtype not in _FLOAT_BYTES:
            raise ValueError(f"float_dtype={float_dtype!r}: expected one of {list(_FLOAT_BYTES)}")
        if self.code_bits is None:
            codes = size_in * size_out * _FLOAT_BYTES[float_dtype]
        else:
            codes = size_in * _ceil(size_out * self.code_bits, 8)
        count = self.scales(size_in, size_out)
        scale_bytes = _FLOAT_BYTES[self.scale_dtype or float_dtype]
        return (
            codes
            + count * scale_bytes
            + _ceil(count * self.zero_point_bits, 8)
            + size_in * self.index_bytes_per_input
            + 4 * self.layer_float32
        )


_COLUMN = (None, 1)

WEIGHT_FORMATS = {
    "int8": WeightFormat(
        "int8", "int8 weights, a scale per output column (Keras's int8)", 8, _COLUMN,
        runtime_mode="int8",
    ),
    "int4": WeightFormat(
        "int4", "int4 weights, a scale and an int8 zero point per 128 inputs of each column "
        "(Keras's int4)", 4, (128, 1), zero_point_bits=8, index_bytes_per_input=4,
        runtime_mode="int4", block_size=128,
    ),
    "int4-column": WeightFormat(
        "int4-column", "int4 weights, a scale per output column (Keras's int4, block_size=-1)",
        4, _COLUMN, runtime_mode="int4", block_size=-1,
    ),
    "float8": WeightFormat(
        "float8", "float8 weights, a float32 scale per 128x128 block", 8, (128, 128),
        scale_dtype="float32",
    ),
    "keras-float8": WeightFormat(
        "keras-float8", "float kernel with float8 scaling (Keras's float8, for FP8 training)",
        None, None, layer_float32=3 * (1 + 1024), runtime_mode="float8",
    ),
}  # fmt: skip

#: The planner's generic quantized `--weights-dtype` values.
PLANNER_FORMATS = ("float8", "int8", "int4")
#: `quantize=` mode -> the format it stores by default.
RUNTIME_FORMATS = {"int8": "int8", "int4": "int4", "float8": "keras-float8"}


def weight_format(name: str) -> WeightFormat:
    """The format of a table name (`int4-column`).

    Example:
        >>> weight_format("int4").block_size
        128
    """
    if name not in WEIGHT_FORMATS:
        raise ValueError(f"weight format {name!r} is not known; expected one of "
                         f"{list(WEIGHT_FORMATS)}")  # fmt: skip
    return WEIGHT_FORMATS[name]


def runtime_format(mode: str, block_size: int | None = None) -> WeightFormat:
    """The format `quantize(mode)` stores (int4: with `block_size`, None for the default).

    Example:
        >>> runtime_format("float8").name, runtime_format("int4", block_size=-1).name
        ('keras-float8', 'int4-column')
        >>> runtime_format("int4", block_size=64).scale_block
        (64, 1)
    """
    if mode not in RUNTIME_FORMATS:
        raise ValueError(f"quantize mode {mode!r} is not known; expected one of "
                         f"{list(RUNTIME_FORMATS)}")  # fmt: skip
    default = WEIGHT_FORMATS[RUNTIME_FORMATS[mode]]
    if block_size is None or block_size == default.block_size:
        return default
    if mode != "int4" or isinstance(block_size, bool) or not isinstance(block_size, int):
        raise ValueError(f"block_size={block_size!r} for {mode}: only int4 takes a block size")
    if block_size == -1:
        return WEIGHT_FORMATS["int4-column"]
    if block_size <= 0:
        raise ValueError(f"block_size={block_size!r}: expected -1 or a positive integer")
    return replace(default, name=f"int4-block{block_size}", scale_block=(block_size, 1),
                   block_size=block_size)  # fmt: skip


__all__ = [
    "PLANNER_FORMATS",
    "RUNTIME_FORMATS",
    "WEIGHT_FORMATS",
    "WeightFormat",
    "runtime_format",
    "weight_format",
]
