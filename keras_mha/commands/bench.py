"""`keras-mha bench [layers|model|inspect] [ARGS...]`: run the measurement harness.

The harness (`benchmarks/` at the repository root) is not in the wheel: it measures a
checkout's code against Keras, keras-hub and transformers, and its results belong with
that code. When this `keras_mha` was imported from a source checkout (an editable
install, or the checkout on `PYTHONPATH`), `bench` runs the harness with the CLI's
one-line errors and exit codes; otherwise it says in one line how to get it
(`MissingDependencyError`, exit 18). The first word picks the benchmark (default
`layers`); everything after it belongs to that benchmark's own flags.

Example:
    >>> from keras_mha.cli import main
    >>> main(["bench", "inspect", "--repeat", "3", "--skip-transformers"])  # doctest: +SKIP
    0
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import keras_mha
from keras_mha.commands.arguments import one_line_argparse_errors
from keras_mha.commands.options import BACKEND_EPILOG
from keras_mha.commands.output import PROGRAM, print_error
from keras_mha.errors import INTERRUPTED_EXIT_CODE, KerasMHAError, MissingDependencyError

NAME = "bench"
SOURCE_REPOSITORY = "https://github.com/keras-mha/keras-mha"
HARNESS_PACKAGE = "benchmarks"


def add_parser(subcommands) -> None:
    """List `bench` in `keras-mha --help`; its arguments are the benchmark's own (`run`).

    Example:
        >>> import argparse
        >>> add_parser(argparse.ArgumentParser().add_subparsers(dest="command"))
    """
    subcommands.add_parser(
        NAME,
        help="benchmarks from a source checkout: `bench layers [...]` (default), "
        "`bench model [...]`, `bench inspect [...]`, `bench roofline [...]`",
        add_help=False,
    )


def checkout_root() -> Path | None:
    """The source checkout this `keras_mha` was imported from, when it holds the harness.

    Example:
        >>> root = checkout_root()
        >>> root is None or (root / "benchmarks" / "__init__.py").is_file()
        True
    """
    root = Path(keras_mha.__file__).resolve().parent.parent
    # pyproject.toml tells a checkout from site-packages (which may hold anyone's `benchmarks`).
    if (root / HARNESS_PACKAGE / "__init__.py").is_file() and (root / "pyproject.toml").is_file():
        return root
    return None


def run(argv: list[str]) -> int:
    """Run `bench ARGS...`; returns the exit status (errors are one line on stderr).

    Example:
        >>> run(["--help"])  # doctest: +SKIP
        0
    """
    named = bool(argv) and not argv[0].startswith("-")
    target = argv[0] if named else "layers"
    harness = _harness(target)
    if argv and argv[0] in ("-h", "--help"):
        sys.stdout.write(_help(harness) if harness else f"{_not_installed('NAME')}\n")
        return 0
    if harness is None:
        return print_error(_not_installed(target), MissingDependencyError.exit_code)
    if named and target in harness.BENCHMARKS:
        argv = argv[1:]
    else:
        target = harness.DEFAULT_BENCHMARK
    benchmark = harness.BENCHMARKS[target]
    try:
        module = importlib.import_module(benchmark.module)
    except ModuleNotFoundError as error:
        if error.name == benchmark.module or benchmark.module.startswith(f"{error.name}."):
            message = f"bench {target}: {benchmark.module} is not part of this checkout"
        else:
            message = f"bench {target}: needs the package {error.name!r}, which is not installed"
        return print_error(message, MissingDependencyError.exit_code)
    try:
        with one_line_argparse_errors():
            return int(getattr(module, benchmark.function)(argv) or 0)
    except KerasMHAError as error:
        return print_error(f"bench {target}: {error}", error.exit_code)
    except KeyboardInterrupt:
        return INTERRUPTED_EXIT_CODE


def _harness(target: str):
    """The checkout's `benchmarks` package, or None when keras_mha is not from a checkout."""
    root = checkout_root()
    if root is None:
        return None
    harness = importlib.import_module(HARNESS_PACKAGE)
    found = Path(harness.__file__).resolve().parent
    if found != root / HARNESS_PACKAGE:
        raise MissingDependencyError(
            f"bench {target}: `import {HARNESS_PACKAGE}` found {found}, not the harness of "
            f"the checkout at {root}; run from the checkout or put it first on PYTHONPATH"
        )
    return harness


def _not_installed(target: str) -> str:
    return (
        f"bench {target}: the benchmarks are not part of the keras-mha wheel; they run from "
        f"a source checkout: git clone {SOURCE_REPOSITORY} && pip install -e ./keras-mha, "
        f"then {PROGRAM} bench {target}"
    )


def _help(harness) -> str:
    names = "|".join(harness.BENCHMARKS)
    lines = [f"usage: {PROGRAM} bench [{names}] [ARGS...]", ""]
    for name, benchmark in harness.BENCHMARKS.items():
        lines += textwrap.wrap(
            benchmark.help, 80, initial_indent=f"  {name:<8} ", subsequent_indent=" " * 11
        )
    lines += ["", f"Run `{PROGRAM} bench NAME --help` for the options of each.", ""]
    lines += textwrap.wrap(BACKEND_EPILOG.replace("keras-mha ...", f"{PROGRAM} bench"), 80)
    return "\n".join(lines) + "\n"
