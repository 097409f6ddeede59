"""Plain-text layout shared by the reports: human units, aligned columns, and lines wrapped
to a width (80 columns unless `--wide`). Pure Python.

Example:
    >>> wrap("serving needs 38.10 GiB: weights 32.90 GiB + KV cache 1.25 GiB", 30, "  ", "    ")
    ['  serving needs 38.10 GiB:', '    weights 32.90 GiB + KV', '    cache 1.25 GiB']
    >>> format_seconds(0.0123), format_rate(1234.5), format_flops(9.89e14)
    ('12.3 ms', '1,234 tokens/s', '989 TFLOPS')
"""

from __future__ import annotations

# `--wide`: no line is wrapped.
UNLIMITED = 10**9
DEFAULT_WIDTH = 80


def wrap(text: str, width: int | None, first: str = "", rest: str | None = None) -> list[str]:
    """`text` as lines of at most `width` characters (None or `UNLIMITED`: one line),
    starting with `first` and continuing with `rest` (default: `first`).

    Example:
        >>> wrap("a b c", None, "- ")
        ['- a b c']
    """
    rest = first if rest is None else rest
    if width is None or width >= UNLIMITED or len(first) + len(text) <= width:
        return [first + text]
    import textwrap  # only when a line is too long: kept off the JSON path's start-up

    return textwrap.wrap(
        text,
        width=max(width, len(rest) + 20),
        initial_indent=first,
        subsequent_indent=rest,
        break_on_hyphens=False,
        break_long_words=False,
    )


def aligned(rows: list[tuple[str, ...]], right: tuple[bool, ...], indent: str = "  ") -> list[str]:
    """Rows as columns two spaces apart, each column left- or right-aligned.

    Example:
        >>> aligned([("a", "1"), ("bb", "22")], (False, True))
        ['  a    1', '  bb  22']
    """
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(width) if is_right else cell.ljust(width)
            for cell, width, is_right in zip(row, widths, right, strict=True)
        ]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


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
    for threshold, unit in ((1e15, "P"), (1e12, "T"), (1e9, "G")):
        if flops >= threshold:
            value = flops / threshold
            return f"{value:.3g} {unit}FLOPS"
    return f"{flops:.3g} FLOPS"


def format_bandwidth(bytes_per_s: float) -> str:
    """Bytes per second in decimal units, as datasheets give them: `3.35 TB/s`.

    Example:
        >>> format_bandwidth(8.19e11)
        '819 GB/s'
    """
    if bytes_per_s >= 1e12:
        return f"{bytes_per_s / 1e12:.3g} TB/s"
    return f"{bytes_per_s / 1e9:.3g} GB/s"


MARKDOWN_WIDTH = 100


def wrap_markdown(lines: list[str], width: int = MARKDOWN_WIDTH) -> list[str]:
    """Prose lines of a markdown document wrapped at `width` (a soft break renders as a
    space); table rows, headings, HTML and code fences stay whole. List items and quotes
    continue indented.

    Example:
        >>> wrap_markdown(["- " + "word " * 30], 40)[1]
        '  word word word word word word word'
    """
    wrapped, fenced = [], False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        if fenced or len(line) <= width or line.startswith(("|", "#", "<", "```")):
            wrapped.append(line)
        elif line.startswith("> "):
            wrapped += wrap(line[2:], width, "> ", "> ")
        elif line.startswith("- "):
            wrapped += wrap(line[2:], width, "- ", "  ")
        else:
            wrapped += wrap(line, width)
    return wrapped


__all__ = [
    "DEFAULT_WIDTH",
    "MARKDOWN_WIDTH",
    "wrap_markdown",
    "UNLIMITED",
    "aligned",
    "format_bandwidth",
    "format_flops",
    "format_rate",
    "format_seconds",
    "wrap",
]
