"""How each KV-cache dtype stores one cached token: its element bits and its scales.

One table, read by the planner (`costs.kv_cache_cost`, the serving memory) and by the
runtime (`keras_mha.layers.kv_quantization`, `GroupedQueryAttention.init_cache`), so that
the bytes the planner states for a KV dtype are the bytes the runtime allocates.

The quantized formats keep one scale per **row**: one token of one KV head (its
`head_dim` keys, or its `head_dim` values), symmetric, no zero point. A row is quantized
once, when its token is written, and never again: the cache stays a fixed-shape buffer
written in place. The scale is stored in the model's compute dtype (2 bytes for bfloat16,
4 for float32), since Keras converts every floating tensor a layer receives to that dtype.
Rows of an MLA latent cache (the planner only: the runtime has no MLA) are one per token.

Pure Python.

Example:
    >>> fmt = kv_format("int8")
    >>> fmt.row_bits(elements=128, compute_dtype="bfloat16") // 8
    130
    >>> kv_format("int4").runtime_dtype is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass

# Bits of the compute dtypes a scale may be stored in.
_SCALE_BITS = {"float32": 32, "bfloat16": 16, "float16": 16}


@dataclass(frozen=True)
class KVCacheFormat:
    """One KV-cache element type (see the module docstring).

    Attributes:
        name: the planner's name (`int8`, `float8`, ...).
        bits: bits per cached element.
        scaled: whether each row carries a scale (the quantized formats).
        runtime_dtype: the `dtype` that `init_cache` takes for it; None where keras-mha's
            runtime cannot store it (the planner then labels it "plan only").
        max_code: the largest magnitude a code holds (127 for int8, 448 for float8 e4m3);
            a row's scale is its largest magnitude divided by this.
        granularity: how the scales are laid out, for people.
    """

    name: str
    bits: int
    scaled: bool = False
    runtime_dtype: str | None = None
    max_code: float | None = None
    granularity: str = "none (a plain float dtype)"

    def scale_bits(self, compute_dtype: str) -> int:
        """Bits of one row's scale: 0 for plain dtypes, else the compute dtype's width.

        Example:
            >>> kv_format("int8").scale_bits("float32"), kv_format("bfloat16").scale_bits("float32")
            (32, 0)
        """
        if not self.scaled:
            return 0
        if compute_dtype not in _SCALE_BITS:
            raise ValueError(
                f"compute_dtype={compute_dtype!r}: a KV scale is stored in the compute dtype, "
                f"expected one of {list(_SCALE_BITS)}"
            )
        return _SCALE_BITS[compute_dtype]

    def row_bits(self, elements: int, compute_dtype: str, rows: int = 1) -> int:
        """Bits of `rows` rows holding `elements` elements in all, scales included.

        Example:
            >>> kv_format("float8").row_bits(elements=2 * 64, compute_dtype="float32", rows=2)
            1088
        """
        return elements * self.bits + rows * self.scale_bits(compute_dtype)


_PER_ROW = "one scale per token and KV head (keys and values each), symmetric"

KV_CACHE_FORMATS = {
    "float32": KVCacheFormat("float32", 32, runtime_dtype="float32"),
    "bfloat16": KVCacheFormat("bfloat16", 16, runtime_dtype="bfloat16"),
    "float16": KVCacheFormat("float16", 16, runtime_dtype="float16"),
    "float8": KVCacheFormat(
        "float8", 8, scaled=True, runtime_dtype="float8_e4m3fn", max_code=448.0,
        granularity=_PER_ROW,
    ),
    "int8": KVCacheFormat(
        "int8", 8, scaled=True, runtime_dtype="int8", max_code=127.0, granularity=_PER_ROW
    ),
    "int4": KVCacheFormat("int4", 4, scaled=True, granularity=_PER_ROW),
}  # fmt: skip

# The quantized dtypes `init_cache` takes, by their Keras names.
RUNTIME_QUANTIZED = {
    fmt.runtime_dtype: fmt for fmt in KV_CACHE_FORMATS.values() if fmt.scaled and fmt.runtime_dtype
}


def kv_format(name: str) -> KVCacheFormat:
    """The format of a planner KV dtype (`int8`) or of a runtime one (`float8_e4m3fn`).

    Example:
        >>> kv_format("float8_e4m3fn").name
        'float8'
    """
    found = KV_CACHE_FORMATS.get(name) or RUNTIME_QUANTIZED.get(name)
    if found is None:
        expected = list(KV_CACHE_FORMATS) + list(RUNTIME_QUANTIZED)
        raise ValueError(f"KV dtype {name!r} is not known; expected one of {expected}")
    return found


__all__ = ["KV_CACHE_FORMATS", "KVCacheFormat", "RUNTIME_QUANTIZED", "kv_format"]
