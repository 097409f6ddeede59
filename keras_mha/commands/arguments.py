"""argparse for `keras-mha`: a bad argument is one short line (`UsageError`, exit 2)
naming the flag, the value and what is expected, never a usage block.

Example:
    >>> parser = ArgumentParser(prog="keras-mha demo")
    >>> _ = parser.add_argument("--batch", type=int)
    >>> parser.parse_args(["--batch", "4"]).batch
    4
"""

from __future__ import annotations

import argparse
import contextlib

from keras_mha.errors import UsageError


class ArgumentParser(argparse.ArgumentParser):
    """argparse, except that a bad argument raises `UsageError` (one short line naming the
    flag, the value and what is expected, exit 2) instead of printing a usage block.

    Subparsers (and so every subcommand's options) use this class too.

    Example:
        >>> parser = ArgumentParser(prog="demo")
        >>> _ = parser.add_argument("--batch", type=int)
        >>> parser.parse_args(["--batch", "x"])
        Traceback (most recent call last):
        ...
        keras_mha.errors.UsageError: --batch: invalid int value: 'x'; see `demo --help`
    """

    def error(self, message: str):
        raise UsageError(_usage_line(self.prog, message))

    def parse_args(self, args=None, namespace=None):
        arguments, extras = self.parse_known_args(args, namespace)
        if extras:
            # argparse reports these from the top-level parser; name the subcommand's help,
            # where the user's flags live.
            command = getattr(arguments, "command", None)
            prog = f"{self.prog} {command}" if command else self.prog
            raise UsageError(_usage_line(prog, f"unrecognized arguments: {' '.join(extras)}"))
        return arguments


def _usage_line(prog: str, message: str) -> str:
    text = " ".join(str(message).split())
    if text.startswith("argument "):
        flag, _, rest = text[len("argument ") :].partition(": ")
        # Type functions that name their flag would otherwise print it twice.
        if rest.startswith(flag + " ") and ": " in rest:
            rest = rest.partition(": ")[2]
        flag = flag.split("/")[-1]  # "-h/--help" -> "--help"
        text = f"{flag}: {rest}"
    return f"{text}; see `{prog} --help`"


@contextlib.contextmanager
def one_line_argparse_errors():
    """While a tool parses its flags with plain argparse (a benchmark also runs standalone,
    as `python -m ...`, where argparse's usage block is right), a bad flag raises
    `UsageError` like every other subcommand's instead of printing usage lines.

    Example:
        >>> with one_line_argparse_errors():
        ...     argparse.ArgumentParser(prog="bench").parse_args(["--x"])
        Traceback (most recent call last):
        ...
        keras_mha.errors.UsageError: unrecognized arguments: --x; see `bench --help`
    """
    original = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = ArgumentParser.error
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original
