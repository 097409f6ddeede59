"""Parse what people type for lengths, element types and memory sizes on the command line.

- Sequence lengths: `4096`, `8k`, `128K`, `1m` (`k` = 1024, `m` = 1024**2, any case),
  comma-separated; each must be between 1 and `MAX_SEQ_LEN` (2**30 tokens).
- Element types: the canonical names (`float32`, `bfloat16`, `float16`, `float8`, `int8`,
  `int4`) or the usual aliases (`fp32`, `f32`, `bf16`, `fp16`, `f16`, `half`, `fp8`,
  `f8`, `e4m3`, `i8`, `q8`, `i4`, `q4`, ...), any case.
- Memory sizes: a number and a unit, `24GiB`, `80 GB`, `1.5TB`, `512MiB` (`KB`/`MB`/`GB`/
  `TB` are powers of 1000, `KiB`/`MiB`/`GiB`/`TiB` powers of 1024, any case; `B` bytes).
- Any of them at most `MAX_FLAG_TEXT` (100) characters long.

Each parser raises `keras_mha.errors.UsageError` with one line naming the flag, the
value and what was expected. Nothing here imports more than the standard library.

Example:
    >>> parse_seq_lens("4096,8k,1m")
    [4096, 8192, 1048576]
    >>> normalize_dtype("BF16")
    'bfloat16'
    >>> parse_memory_size("24GiB"), parse_memory_size("80 GB")
    (25769803776, 80000000000)
"""

from __future__ import annotations

import re

from keras_mha.errors import UsageError

DTYPES = ("float32", "bfloat16", "float16", "float8", "int8", "int4")
DTYPE_ALIASES = {
    "float32": "float32", "fp32": "float32", "f32": "float32", "float": "float32",
    "single": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "f16": "float16", "half": "float16",
    "float8": "float8", "fp8": "float8", "f8": "float8", "e4m3": "float8",
    "float8e4m3": "float8", "float8e4m3fn": "float8", "e5m2": "float8", "float8e5m2": "float8",
    "int8": "int8", "i8": "int8", "q8": "int8", "q80": "int8",
    "int4": "int4", "i4": "int4", "q4": "int4",
}  # fmt: skip
# The longest context accepted: 2**30 tokens, far beyond any model today; a typo guard.
MAX_SEQ_LEN = 2**30
# The largest memory size accepted: 2**60 bytes (an exbibyte).
MAX_MEMORY_BYTES = 2**60
# The longest text a length, size, element-type or device flag takes: far beyond any real
# value ("4 x NVIDIA GeForce RTX 4090"), and a bound on the work and on the error message.
MAX_FLAG_TEXT = 100
_LENGTH_SUFFIXES = {"": 1, "k": 1024, "m": 1024**2}
_MEMORY_UNITS = {
    "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}  # fmt: skip


def bounded_text(text, *, flag: str) -> str:
    """`str(text)` if it is at most `MAX_FLAG_TEXT` characters long, else UsageError
    (quoting only its start: the whole of a hostile value would flood the terminal).

    Example:
        >>> bounded_text("H100", flag="--gpu")
        'H100'
    """
    text = str(text)
    if len(text) > MAX_FLAG_TEXT:
        start = f"{text[:24]}..."
        raise UsageError(
            f"{flag} {start!r} is {len(text):,} characters long; expected at most {MAX_FLAG_TEXT}",
            key=flag,
            value=start,
        )
    return text


def parse_seq_len(text: str, *, flag: str = "--seq-len") -> int:
    """One length: an integer with an optional `k` (1024) or `m` (1024**2) suffix.

    Example:
        >>> parse_seq_len("32K"), parse_seq_len("1M")
        (32768, 1048576)
    """
    item = bounded_text(text, flag=flag).strip().lower().replace("_", "")
    match = re.fullmatch(r"([0-9]+)([km]?)", item)
    if match is None:
        raise UsageError(
            f"{flag} {text!r} is not a length; expected a positive integer, optionally "
            "with k (x1024) or m (x1048576), e.g. 4096, 32k or 1m",
            key=flag,
            value=text,
        )
    length = int(match.group(1)) * _LENGTH_SUFFIXES[match.group(2)]
    if length <= 0:
        raise UsageError(f"{flag} {text!r} must be at least 1 token", key=flag, value=text)
    if length > MAX_SEQ_LEN:
        raise UsageError(
            f"{flag} {text!r} is {length:,} tokens, more than the {MAX_SEQ_LEN:,} keras-mha "
            "accepts",
            key=flag,
            value=text,
        )
    return length


def parse_seq_lens(text: str, *, flag: str = "--seq-len") -> list[int]:
    """Comma-separated lengths (see `parse_seq_len`).

    Example:
        >>> parse_seq_lens("4096, 8k")
        [4096, 8192]
    """
    parts = str(text).split(",")
    if not any(part.strip() for part in parts):
        raise UsageError(
            f"{flag} {text!r} holds no length; expected e.g. 4096 or 4096,32k",
            key=flag,
            value=text,
        )
    return [parse_seq_len(part, flag=flag) for part in parts]


def normalize_dtype(text: str, *, flag: str = "--kv-dtype") -> str:
    """The canonical element-type name for `text` (see the module docstring).

    Example:
        >>> normalize_dtype("fp8"), normalize_dtype("Half")
        ('float8', 'float16')
    """
    key = re.sub(r"[\s_\-]+", "", bounded_text(text, flag=flag).lower())
    if key in DTYPE_ALIASES:
        return DTYPE_ALIASES[key]
    raise UsageError(
        f"{flag} {text!r} is not an element type; expected one of {', '.join(DTYPES)} "
        "(or bf16, fp16, fp8, fp32, int8, int4)",
        key=flag,
        value=text,
    )


def parse_memory_size(text: str, *, flag: str = "--memory") -> int:
    """A memory size in bytes from a number and a unit (see the module docstring).

    Example:
        >>> parse_memory_size("1.5 TiB") == 3 * 2**39
        True
    """
    item = bounded_text(text, flag=flag).strip().lower().replace("_", "").replace(",", "")
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([kmgt]i?b|b)", item)
    if match is None:
        raise UsageError(
            f"{flag} {text!r} is not a memory size; expected a number and a unit, e.g. "
            "24GiB, 80GB, 1.5TB or 512MiB",
            key=flag,
            value=text,
        )
    number, unit = match.groups()
    # Exact arithmetic: "1.1GB" is 1,100,000,000 bytes, not a float's neighbour of it.
    whole, _, fraction = number.partition(".")
    numerator = int(whole or "0") * 10 ** len(fraction) + int(fraction or "0")
    size = numerator * _MEMORY_UNITS[unit] // 10 ** len(fraction)
    return check_memory_bytes(size, flag=flag, text=text)


def check_memory_bytes(size: int, *, flag: str = "--memory", text=None) -> int:
    """`size` if it is a memory size keras-mha accepts (1 byte to 1 EiB), else UsageError.

    Example:
        >>> check_memory_bytes(2**30)
        1073741824
    """
    shown = size if text is None else text
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise UsageError(f"{flag} {shown!r} must be more than 0 bytes", key=flag, value=shown)
    if size > MAX_MEMORY_BYTES:
        raise UsageError(
            f"{flag} {shown!r} is more than the 1 EiB keras-mha accepts", key=flag, value=shown
        )
    return size


__all__ = [
    "DTYPES",
    "MAX_FLAG_TEXT",
    "bounded_text",
    "check_memory_bytes",
    "DTYPE_ALIASES",
    "MAX_MEMORY_BYTES",
    "MAX_SEQ_LEN",
    "normalize_dtype",
    "parse_memory_size",
    "parse_seq_len",
    "parse_seq_lens",
]
