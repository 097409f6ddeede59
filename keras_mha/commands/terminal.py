"""How a report reaches the terminal: its width (the terminal's, 80 columns when piped,
unlimited with `--wide`) and, on a terminal, colour through `rich` (plain text when piped,
with `NO_COLOR` set, or on a `TERM=dumb` terminal). `rich` is imported only to colour.

Example:
    >>> import io
    >>> report_width(wide=False, stream=io.StringIO())
    80
    >>> use_colour(io.StringIO())
    False
"""

from __future__ import annotations

import os
import re
import shutil
import sys

from keras_mha.commands.output import write_stdout
from keras_mha.planning.render.text import DEFAULT_WIDTH, UNLIMITED

# The narrowest layout the reports are laid out for, even on a narrower terminal.
MIN_WIDTH = 60
# Line patterns and their rich style, first match wins.
_STYLES = (
    (re.compile(r"serving fits: yes"), "bold green"),
    (re.compile(r"serving does not fit"), "bold red"),
    (re.compile(r"=+$"), "dim"),
    (re.compile(r"(note|  note): "), "dim"),
    (re.compile(r"warnings$"), "bold yellow"),
    (re.compile(r"  - "), "yellow"),
    (re.compile(r"(parameters|KV cache|memory|speed on|compared at)\b"), "bold cyan"),
)


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def report_width(*, wide: bool, stream=None) -> int:
    """Columns to lay a table out in (see the module docstring).

    Example:
        >>> report_width(wide=True) > 10**6
        True
    """
    if wide:
        return UNLIMITED
    stream = sys.stdout if stream is None else stream
    if not _is_terminal(stream):
        return DEFAULT_WIDTH
    return max(MIN_WIDTH, shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns)


def use_colour(stream=None) -> bool:
    """Colour only on a terminal, and never with `NO_COLOR` (https://no-color.org) or
    `TERM=dumb`.

    Example:
        >>> import io
        >>> use_colour(io.StringIO())
        False
    """
    stream = sys.stdout if stream is None else stream
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return _is_terminal(stream)


def line_style(line: str, index: int) -> str | None:
    """The rich style of one line of a text report (the first line is its title).

    Example:
        >>> line_style("serving fits: yes, up to 8 tokens", 3)
        'bold green'
    """
    if index == 0:
        return "bold"
    for pattern, style in _STYLES:
        if pattern.match(line):
            return style
    return None


def write_report(text: str, *, colour: bool | None = None) -> None:
    """Write a text report: coloured by `line_style` through rich on a terminal, else
    exactly `text` (`write_stdout`).

    Example:
        >>> write_report("plain", colour=False)
        plain
    """
    if not (use_colour() if colour is None else colour):
        write_stdout(text)
        return
    from rich.console import Console
    from rich.text import Text

    console = Console(file=sys.stdout, highlight=False, soft_wrap=True)
    for index, line in enumerate(text.splitlines()):
        console.print(Text(line, style=line_style(line, index) or ""))
    sys.stdout.flush()


__all__ = ["MIN_WIDTH", "line_style", "report_width", "use_colour", "write_report"]
