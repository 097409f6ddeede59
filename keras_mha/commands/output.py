"""What every `keras-mha` subcommand writes: the result on stdout, errors and warnings as
one line on stderr (`keras-mha: error: ...`), and what to do when stdout is gone.

A full disk or a closed stdout is a `PathError` (exit 14) at the write, not a message
at interpreter exit; a reader that left (`keras-mha ... | head -1`) raises
`BrokenPipeError`, which `keras_mha.cli.main` ends quietly.

Example:
    >>> write_stdout("hello")
    hello
"""

from __future__ import annotations

import os
import sys

from keras_mha.errors import PathError
from keras_mha.safe_text import one_line

PROGRAM = "keras-mha"


def write_stdout(text: str) -> None:
    """Write `text` (plus a final newline) to stdout and flush, so a full disk or a closed
    stdout is a `PathError` (exit 14) here rather than a message at interpreter exit;
    a reader that left raises BrokenPipeError, which `main` ends quietly.

    Example:
        >>> write_stdout("hello")
        hello
    """
    stream = sys.stdout
    if stream is None:
        raise PathError("cannot write the output: stdout is closed", path="<stdout>")
    try:
        stream.write(text if text.endswith("\n") else text + "\n")
        stream.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as error:
        silence_stdout()
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        raise PathError(f"cannot write the output to stdout: {reason}", path="<stdout>") from None


def flush_stdout() -> None:
    """Flush stdout; a full disk or a closed stream is a `PathError`, as in `write_stdout`.

    Example:
        >>> flush_stdout()
    """
    if sys.stdout is not None:
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as error:
            silence_stdout()
            reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
            raise PathError(
                f"cannot write the output to stdout: {reason}", path="<stdout>"
            ) from None


def print_error(message: str, exit_code: int, secrets=()) -> int:
    """Print `keras-mha: error: <message>` as one line: secrets redacted, control
    characters shown as escapes (scripts read the first line of stderr). Returns
    `exit_code`, for `return print_error(...)`.

    Example:
        >>> import contextlib, io
        >>> with contextlib.redirect_stderr(io.StringIO()) as stderr:
        ...     print_error("--batch: 0 is not positive;\\n hf_secret", 2, secrets=["hf_secret"])
        2
        >>> stderr.getvalue()
        'keras-mha: error: --batch: 0 is not positive; ***\\n'
    """
    try:
        sys.stderr.write(f"{PROGRAM}: error: {one_line(message, secrets)}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass  # stderr itself is gone: the exit code still tells
    return exit_code


def one_line_warning(secrets):
    """A `warnings.showwarning` that prints `keras-mha: warning: <message>` as one line:
    no source file and code line from inside keras-mha, secrets redacted, control
    characters escaped (a warning may quote a config value).

    Example:
        >>> import contextlib, io
        >>> with contextlib.redirect_stderr(io.StringIO()) as stderr:
        ...     one_line_warning(())("guessed head_dim", UserWarning, "spec.py", 1)
        >>> stderr.getvalue()
        'keras-mha: warning: guessed head_dim\\n'
    """

    def show(message, category, filename, lineno, file=None, line=None):
        try:
            sys.stderr.write(f"{PROGRAM}: warning: {one_line(str(message), secrets)}\n")
        except (OSError, ValueError, AttributeError):
            pass

    return show


def silence_stdout() -> None:
    """Point stdout at /dev/null: Python would complain about the closed pipe or full disk
    again while flushing at exit.

    Example:
        >>> silence_stdout()  # doctest: +SKIP
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
