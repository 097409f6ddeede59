"""A one-line progress bar on stderr: items, tokens, elapsed time and ETA.

Drawn only on a terminal (`stream.isatty()`), so logs and pipes stay clean, whatever
the output format (the report goes to stdout). It keeps within the terminal's width
(the bar shrinks first, then the line is cut), redraws at most every `min_interval`
seconds and once more when finished.

Example:
    >>> bar = ProgressBar(total=40, unit="batches", total_tokens=20480, label="scoring")
    >>> for batch in range(40):
    ...     bar.advance(tokens=512)
    >>> bar.close()
"""

from __future__ import annotations

import shutil
import sys
import time

# The narrowest bar drawn before the line is cut instead.
MIN_BAR_WIDTH = 5


def format_duration(seconds: float) -> str:
    """`mm:ss`, or `h:mm:ss` from an hour on.

    Example:
        >>> format_duration(75.4), format_duration(3725)
        ('01:15', '1:02:05')
    """
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}:{minutes:02d}:{seconds:02d}"
    return f"{minutes:02d}:{seconds:02d}"


class ProgressBar:
    """Progress of a loop over a known number of items (batches), with tokens counted.

    Args:
        total: number of items the loop will process.
        unit: what an item is, for the line (`"batches"`).
        total_tokens: tokens the whole loop processes (None: not shown).
        label: what is being done (`"scoring heads"`).
        stream: where to draw; default `sys.stderr`.
        enabled: None draws only when `stream` is a terminal; True/False forces it.
        width: characters of the bar itself, at most (it shrinks to fit `columns`).
        min_interval: seconds between redraws.
        columns: the terminal's width (None: asked at each redraw, 80 when unknown).
        clock: the time source (for tests).

    Example:
        >>> import io
        >>> out = io.StringIO()
        >>> bar = ProgressBar(2, "batches", 64, "scoring", stream=out, enabled=True)
        >>> bar.advance(32); bar.advance(32); bar.close()
        >>> "2/2 batches" in out.getvalue() and "64/64 tokens" in out.getvalue()
        True
    """

    def __init__(
        self,
        total: int,
        unit: str = "batches",
        total_tokens: int | None = None,
        label: str = "",
        *,
        stream=None,
        enabled: bool | None = None,
        width: int = 24,
        min_interval: float = 0.1,
        clock=time.monotonic,
        columns: int | None = None,
    ):
        self.total = max(0, int(total))
        self.unit = unit
        self.total_tokens = total_tokens
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.width = width
        self.min_interval = min_interval
        self.clock = clock
        self.columns = columns
        self.done = 0
        self.tokens = 0
        self.started = clock()
        self._last_draw = None
        self._closed = False
        self._last_length = 0

    def advance(self, tokens: int = 0, items: int = 1) -> None:
        """Count `items` more items holding `tokens` tokens, and redraw when due."""
        self.done = min(self.total, self.done + items) if self.total else self.done + items
        self.tokens += int(tokens)
        now = self.clock()
        if self._last_draw is None or now - self._last_draw >= self.min_interval:
            self._draw(now)

    def line(self, now: float | None = None, columns: int | None = None) -> str:
        """The current line (without the carriage return), within `columns - 1`
        characters when given (the last column left free: a full line wraps on some
        terminals): the bar shrinks to `MIN_BAR_WIDTH`, then the line is cut.

        Example:
            >>> bar = ProgressBar(4, "batches", 4096, "scoring heads", clock=lambda: 0.0)
            >>> bar.advance(1024)
            >>> len(bar.line()), len(bar.line(columns=80)), bar.line(columns=80)[:36]
            (87, 79, 'scoring heads [####------------] 1/4')
        """
        now = self.clock() if now is None else now
        text = self._compose(now, self.width)
        if columns is None or len(text) < columns:
            return text
        bar_width = max(MIN_BAR_WIDTH, self.width - (len(text) - columns + 1))
        return self._compose(now, bar_width)[: columns - 1]

    def _compose(self, now: float, bar_width: int) -> str:
        elapsed = now - self.started
        fraction = self.done / self.total if self.total else 1.0
        filled = int(round(fraction * bar_width))
        bar = "#" * filled + "-" * (bar_width - filled)
        parts = [f"{self.label} " if self.label else "", f"[{bar}] "]
        parts.append(f"{self.done}/{self.total} {self.unit}")
        if self.total_tokens is not None:
            parts.append(f", {self.tokens:,}/{self.total_tokens:,} tokens")
        if 0 < self.done < self.total:
            remaining = elapsed / self.done * (self.total - self.done)
            parts.append(f"  {format_duration(elapsed)} < {format_duration(remaining)}")
        else:
            parts.append(f"  {format_duration(elapsed)}")
        return "".join(parts)

    def _draw(self, now: float) -> None:
        self._last_draw = now
        if not self.enabled or self._closed:
            return
        columns = self.columns or shutil.get_terminal_size((80, 24)).columns
        text = self.line(now, columns)
        # Pad over what a longer previous line left on the terminal.
        padding = " " * max(0, self._last_length - len(text))
        self._last_length = len(text)
        self.stream.write("\r" + text + padding)
        self.stream.flush()

    def close(self) -> None:
        """Draw the final state and end the line (nothing when disabled)."""
        if self._closed:
            return
        self._draw(self.clock())
        self._closed = True
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
        return False
