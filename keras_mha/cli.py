"""The `keras-mha` command line: `inspect` a model's attention and costs, `cards`, `bench`.

    keras-mha inspect MODEL [--revision R] [--seq-len N[,N...]] [--batch B]
                            [--kv-dtype D] [--format table|json|markdown]
                            [--gpu NAME | --memory SIZE] [--weights-dtype D]
                            [--optimizer O] [--precision P] [--prefill-chunk T]
                            [--token T] [--offline] [--endpoint URL] [--timeout S]
    keras-mha compare MODEL MODEL ... [--seq-len N] [--gpu NAME] [--plot FILE.png] ...
    keras-mha heads MODEL --text FILE [--conllu FILE] [--importance METHOD] [--plot FILE.png]
                    [--html FILE.html] [--format table|json|markdown]   what each head does
    keras-mha convert SOURCE --kv-heads N --out DIR [--method M] [--data FILE --steps S]
                      [--distill] [--format table|json|markdown]   MHA -> GQA/MQA
    keras-mha cards                      list the bundled cards
    keras-mha gpus                       list the accelerators --gpu knows
    keras-mha --version
    keras-mha bench [layers|model|inspect] ...   benchmarks (default: layers)

MODEL is a Hub model id or model page URL, a local directory or config.json, or
`bundled:org/name`. Errors are one line on stderr (`keras-mha: error: ...`), never a
traceback, and the exit code names the error (the table in `keras_mha.errors`): a bad
argument exits with 2, an unexpected exception with 70 (`--debug` prints its
traceback), Ctrl-C with 130, and a reader that closed the pipe (`keras-mha ... | head -1`)
ends the run quietly with 141, as a Unix tool killed by SIGPIPE would.

This module only registers the subcommands (`COMMANDS`, one module each in
`keras_mha/commands/`) and turns every error into that one line and exit code.
`inspect` imports neither keras nor a backend, and imports `huggingface_hub` only
when it has to reach the Hub (or its cache) for a model id.

Example:
    >>> from keras_mha.cli import main
    >>> main(["inspect", "bundled:openai-community/gpt2", "--format", "json"])  # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import warnings

from keras_mha.commands import bench, cards, compare, convert, gpus, heads, inspect, prune
from keras_mha.commands.arguments import ArgumentParser
from keras_mha.commands.output import (
    PROGRAM,
    flush_stdout,
    one_line_warning,
    print_error,
    silence_stdout,
)
from keras_mha.errors import (
    BROKEN_PIPE_EXIT_CODE,
    INTERNAL_ERROR_EXIT_CODE,
    INTERRUPTED_EXIT_CODE,
    KerasMHAError,
    MissingDependencyError,
    PathError,
    UsageError,
)
from keras_mha.safe_text import one_line, redact_secrets
from keras_mha.version import __version__

#: The subcommands, in `--help` order: each module's `add_parser(subcommands)` registers it.
COMMANDS = (inspect, cards, compare, gpus, prune, convert, heads, bench)
EXIT_INTERRUPTED = INTERRUPTED_EXIT_CODE
#: Exit status when the reader of stdout went away (128 + SIGPIPE), as for `yes | head -1`.
EXIT_BROKEN_PIPE = BROKEN_PIPE_EXIT_CODE
DEBUG_FLAG = "--debug"
# errno values that mean "this path cannot be used as asked" (PathError, exit 14).
_PATH_ERRNOS = {
    errno.ENOENT,
    errno.EACCES,
    errno.EPERM,
    errno.EISDIR,
    errno.ENOTDIR,
    errno.ENAMETOOLONG,
    errno.ENOSPC,
    errno.EROFS,
    errno.EEXIST,
    errno.ELOOP,
    errno.EFBIG,
    errno.EDQUOT,
    errno.ENOTEMPTY,
    errno.EXDEV,
    errno.EBADF,
    errno.EIO,
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand.

    Example:
        >>> build_parser().parse_args(["inspect", "gpt2", "--seq-len", "1k"]).seq_len
        [1024]
    """
    parser = ArgumentParser(
        prog=PROGRAM,
        description="Attention layers for Keras 3, and model-card tools for Hub configs.",
    )
    parser.add_argument(
        DEBUG_FLAG,
        action="store_true",
        help="print the traceback of an unexpected error (accepted anywhere on the line)",
    )
    parser.add_argument("--version", action="version", version=f"{PROGRAM} {__version__}")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(subcommands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status. Never raises, never prints a traceback
    (unless `--debug` is on the line): every error is one line on stderr.

    Example:
        >>> main(["cards"])  # doctest: +SKIP
        0
    """
    argv = [str(argument) for argument in (sys.argv[1:] if argv is None else argv)]
    argv, debug = _take_debug_flag(argv)
    secrets = _secrets(argv)
    if sys.stdout is None:  # started with stdout closed (`keras-mha ... >&-`)
        return print_error("cannot write the output: stdout is closed", PathError.exit_code)
    try:
        try:
            with warnings.catch_warnings():  # restores Python's display when main returns
                warnings.showwarning = one_line_warning(secrets)
                exit_code = _dispatch(argv)
        except SystemExit as exit_request:  # --help, --version, or a command's sys.exit
            exit_code = _exit_status(exit_request.code)
        flush_stdout()
        return exit_code
    except KeyboardInterrupt:
        _debug_traceback(debug, secrets)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `keras-mha inspect ... | head -1`: the reader left; say nothing, as `yes` would.
        silence_stdout()
        return EXIT_BROKEN_PIPE
    except KerasMHAError as error:
        _debug_traceback(debug, secrets)
        return print_error(str(error), error.exit_code, secrets)
    except ModuleNotFoundError as error:
        _debug_traceback(debug, secrets)
        if error.name and not error.name.startswith("keras_mha"):
            return print_error(
                f"a package this command needs is not installed: {error.name} ({error}); "
                "install it, e.g. pip install 'keras-mha[jax]' (or [torch], [tensorflow])",
                MissingDependencyError.exit_code,
                secrets,
            )
        return _internal_error(error, secrets)
    except OSError as error:
        _debug_traceback(debug, secrets)
        if error.errno in _PATH_ERRNOS:
            return print_error(_describe_os_error(error), PathError.exit_code, secrets)
        return _internal_error(error, secrets)
    except Exception as error:  # noqa: BLE001 - the last line of defence: one line, exit 70
        _debug_traceback(debug, secrets)
        if _is_unknown_keras_backend(error):
            backend = os.environ.get("KERAS_BACKEND")
            where = f"KERAS_BACKEND={backend!r}" if backend else "~/.keras/keras.json's backend"
            return print_error(
                f"{where} is not a Keras backend Keras can import ({error}); set KERAS_BACKEND "
                "to jax, tensorflow or torch",
                UsageError.exit_code,
                secrets,
            )
        return _internal_error(error, secrets)


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] == bench.NAME:
        # Everything after `bench` belongs to the benchmark's own parser.
        return bench.run(argv[1:])
    parser = build_parser()
    arguments = parser.parse_args(argv)
    # Each subcommand's add_parser sets `run` (or `func`) as a default.
    run = getattr(arguments, "run", None) or getattr(arguments, "func", None)
    if callable(run):
        return int(run(arguments) or 0)
    parser.print_help()
    return 0


def _take_debug_flag(argv: list[str]) -> tuple[list[str], bool]:
    """Remove `--debug` wherever it is before a `--`, so it works on every subcommand."""
    end = argv.index("--") if "--" in argv else len(argv)
    kept = [argument for argument in argv[:end] if argument != DEBUG_FLAG] + argv[end:]
    return kept, len(kept) != len(argv)


def _secrets(argv: list[str]) -> tuple[str, ...]:
    """Values never to print: `--token X` / `--token=X` and the Hub tokens in the environment."""
    found = [os.environ.get("HF_TOKEN"), os.environ.get("HUGGING_FACE_HUB_TOKEN")]
    for index, argument in enumerate(argv):
        if argument == "--token" and index + 1 < len(argv):
            found.append(argv[index + 1])
        elif argument.startswith("--token="):
            found.append(argument[len("--token=") :])
    return tuple(value.strip() for value in found if value and value.strip())


def _exit_status(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print_error(str(code), 1)
    return 1


def _describe_os_error(error: OSError) -> str:
    reason = error.strerror or type(error).__name__
    if error.filename is not None:
        return f"{error.filename}: {reason}"
    if error.errno in (errno.ENOSPC, errno.EBADF, errno.EIO, errno.EFBIG, errno.EDQUOT):
        silence_stdout()  # most likely stdout; Python would fail again flushing it at exit
        return f"cannot write the output: {reason}"
    return f"cannot read or write as asked: {reason}"


def _is_unknown_keras_backend(error: BaseException) -> bool:
    """`import keras` with a backend name Keras does not know (`KERAS_BACKEND=jaxx`)."""
    return isinstance(error, ValueError) and str(error).startswith("Unable to import backend")


def _internal_error(error: BaseException, secrets) -> int:
    detail = one_line(str(error), secrets)[:300]
    return print_error(
        f"internal error: {type(error).__name__}: {detail}; rerun with {DEBUG_FLAG} for the "
        "traceback",
        INTERNAL_ERROR_EXIT_CODE,
        secrets,
    )


def _debug_traceback(debug: bool, secrets) -> None:
    if not debug:
        return
    import traceback  # only with --debug: kept off every other command's start-up

    text = "".join(traceback.format_exception(*sys.exc_info()))
    try:
        sys.stderr.write(redact_secrets(text, secrets))
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass


if __name__ == "__main__":
    sys.exit(main())
