"""Numbers as the reports print them: parameter counts in decimal units, bytes in binary
units, integers with thousands separators.

Example:
    >>> format_count(8030261248), format_bytes(1073741824), format_thousands(131072)
    ('8.03 B', '1.00 GiB', '131,072')
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
