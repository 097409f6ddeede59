"""Paired timing and its report: calls that take turns, quartiles, tables.

Load elsewhere on the machine slows every side of a round alike, so the ratio of two
calls of the same round holds on a busy machine while their absolute times do not.

Example:
    >>> [turn_order(2, r) for r in range(3)]
    [[0, 1], [1, 0], [0, 1]]
    >>> quartiles([1.0, 2.0, 3.0, 4.0, 5.0])
    (2.0, 3.0, 4.0)
"""

from __future__ import annotations

import statistics
import textwrap

#: The terminal width reports keep to, as `keras-mha inspect` does.
COLUMNS = 80


def turn_order(count: int, round_number: int) -> list[int]:
    """The order of the entries' calls in one round: each round starts one entry later.

    Every entry takes every place equally often and none runs twice in a row. (In
    A B C, C B A turns the first and the last entry ran back to back, their weights
    and caches still warm: placed first, the same decode step came out 3% slower than
    the reference, placed second 27% slower.)

    Example:
        >>> [turn_order(3, r) for r in range(4)]
        [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]
    """
    shift = round_number % count
    return [*range(shift, count), *range(shift)]


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile); (min, median, max) under 4 values.

    Example:
        >>> quartiles([3.0, 1.0])
        (1.0, 2.0, 3.0)
    """
    if len(values) < 4:
        middle = statistics.median(values)
        return min(values), middle, max(values)
    low, middle, high = statistics.quantiles(values, n=4, method="inclusive")
    return low, statistics.median(values), high


def caption(text: str) -> list[str]:
    """`text` as lines of at most `COLUMNS` characters.

    Example:
        >>> caption("a " * 50)[0] == ("a " * 40).strip()
        True
    """
    return textwrap.wrap(text, COLUMNS)


def table(header: list[str], body: list[list[str]], markdown: bool) -> list[str]:
    """Rows as a markdown table, or as text columns padded to their widest cell.

    Example:
        >>> table(["a", "bb"], [["1", "2"]], markdown=True)
        ['| a | bb |', '|---|---|', '| 1 | 2 |']
    """
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return lines + ["| " + " | ".join(cells) + " |" for cells in body]
    widths = [max(len(c) for c in column) for column in zip(header, *body, strict=True)]
    lines = []
    for cells in [header, ["-" * w for w in widths], *body]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    return lines


__all__ = ["COLUMNS", "caption", "quartiles", "table", "turn_order"]
