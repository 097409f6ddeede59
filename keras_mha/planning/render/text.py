"""Plain-text layout shared by the reports: aligned columns, and lines wrapped to a width
(80 columns unless `--wide`); markdown prose wrapped at 100. Pure Python.

Example:
    >>> wrap("serving needs 38.10 GiB: weights 32.90 GiB + KV cache 1.25 GiB", 30, "  ", "    ")
    ['  serving needs 38.10 GiB:', '    weights 32.90 GiB + KV', '    cache 1.25 GiB']
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
    "wrap",
]
