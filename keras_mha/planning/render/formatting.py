"""Numbers as the reports print them: parameter counts in decimal units, bytes in binary
units, integers with thousands separators; durations, token rates, FLOP rates and
bandwidths for the speed bounds.

Example:
    >>> format_count(8030261248), format_bytes(1073741824), format_thousands(131072)
    ('8.03 B', '1.00 GiB', '131,072')
    >>> format_seconds(0.0123), format_rate(1234.5), format_flops(9.89e14)
    ('12.3 ms', '1,234 tokens/s', '989 TFLOPS')
"""

from __future__ import annotations


def format_count(count: int | None) -> str:
    """A parameter count in decimal units: 8030261248 -> '8.03 B'.

    Example:
        >>> format_count(8030261248), format_count(124439808), format_count(512)
        ('8.03 B', '124.44 M', '512')
    """
    if count is None:
        return "-"
    for threshold, unit in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if abs(count) >= threshold:
            return f"{count / threshold:.2f} {unit}"
    return str(count)


def format_bytes(size: int | float | None) -> str:
    """A byte count in binary units: 1073741824 -> '1.00 GiB'.

    Example:
        >>> format_bytes(131072), format_bytes(1073741824), format_bytes(100)
        ('128.00 KiB', '1.00 GiB', '100 B')
    """
    if size is None:
        return "-"
    for exponent, unit in ((5, "PiB"), (4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB")):
        if abs(size) >= 1024**exponent:
            return f"{size / 1024**exponent:.2f} {unit}"
    return f"{size:g} B"


def format_thousands(value) -> str:
    """An integer with thousands separators; '-' for anything else (a missing value).

    Example:
        >>> format_thousands(8192), format_thousands(None)
        ('8,192', '-')
    """
    return f"{value:,}" if isinstance(value, int) else "-"


def format_seconds(seconds: float | None) -> str:
    """A duration: `12.3 ms`, `1.50 s`, `2.5 min`.

    Example:
        >>> format_seconds(90), format_seconds(2e-5)
        ('1.5 min', '20.0 us')
    """
    if seconds is None:
        return "-"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.1f} us"


def format_rate(tokens_per_s: float | None) -> str:
    """Tokens per second, three significant figures at most below 1000.

    Example:
        >>> format_rate(12.345), format_rate(0.05)
        ('12.3 tokens/s', '0.05 tokens/s')
    """
    if tokens_per_s is None:
        return "-"
    if tokens_per_s >= 1000:
        return f"{tokens_per_s:,.0f} tokens/s"
    if tokens_per_s >= 10:
        return f"{tokens_per_s:.1f} tokens/s"
    return f"{tokens_per_s:.2g} tokens/s"


def format_flops(flops: float) -> str:
    """A FLOP rate or count in SI units: `989 TFLOPS`, `2.25 PFLOPS`.

    Example:
        >>> format_flops(2.25e15)
        '2.25 PFLOPS'
    """
    units = ((1e15, "PFLOPS"), (1e12, "TFLOPS"), (1e9, "GFLOPS"), (1, "FLOPS"))
    return _three_figures(flops, units)


def format_bandwidth(bytes_per_s: float) -> str:
    """Bytes per second in decimal units, as datasheets give them: `3.35 TB/s`.

    Example:
        >>> format_bandwidth(8.19e11)
        '819 GB/s'
    """
    return _three_figures(bytes_per_s, ((1e12, "TB/s"), (1e9, "GB/s")))


def _three_figures(value: float, units: tuple[tuple[float, str], ...]) -> str:
    """`value` in the first of `units` (scale, name) it reaches, else the last, to three
    significant figures."""
    scale, name = next(((scale, name) for scale, name in units if value >= scale), units[-1])
    return f"{value / scale:.3g} {name}"


def format_number(value, digits=None):
    """A figure for a table: thousands separated, `digits` decimals for floats, "—" for None.

    Example:
        >>> format_number(1234567), format_number(3.14159, 2), format_number(None)
        ('1,234,567', '3.14', '—')
    """
    if value is None:
        return "—"
    if isinstance(value, float) and digits is not None:
        return f"{value:,.{digits}f}"
    return f"{value:,}"
