"""The `keras-mha` command line: `inspect` a model's attention and costs, `cards`, `bench`.

    keras-mha inspect MODEL [--revision R] [--seq-len N[,N...]] [--batch B]
                            [--kv-dtype D] [--format table|json|markdown]
                            [--gpu NAME | --memory SIZE] [--weights-dtype D]
                            [--optimizer O] [--precision P] [--prefill-chunk T]
                            [--token T] [--offline] [--endpoint URL] [--timeout S]
    keras-mha compare MODEL MODEL ... [--seq-len N] [--gpu NAME] [--plot FILE.png] ...
    keras-mha cards                      list the bundled cards
    keras-mha --version
    keras-mha bench [layers|model|inspect] ...   benchmarks (default: layers)

MODEL is a Hub model id or model page URL, a local directory or config.json, or
`bundled:org/name`. Errors are one line on stderr (`keras-mha: error: ...`), never a
traceback, and the exit code names the error (the table in `keras_mha.errors`): a bad
argument exits with 2, an unexpected exception with 70 (`--debug` prints its
traceback), Ctrl-C with 130, and a reader that closed the pipe (`keras-mha ... | head -1`)
ends the run quietly with 141, as a Unix tool killed by SIGPIPE would.

`inspect` imports neither keras nor a backend, and imports `huggingface_hub` only
when it has to reach the Hub (or its cache) for a model id.

Example:
    >>> from keras_mha.cli import main
    >>> main(["inspect", "bundled:openai-community/gpt2", "--format", "json"])  # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
import warnings

from keras_mha.errors import (
    BROKEN_PIPE_EXIT_CODE,
    INTERNAL_ERROR_EXIT_CODE,
    INTERRUPTED_EXIT_CODE,
    KerasMHAError,
    MissingDependencyError,
    PathError,
    UsageError,
)

PROGRAM = "keras-mha"
OUTPUT_FORMATS = ("table", "json", "markdown")
# Mirrors keras_mha.cards.costs; kept here so `--help` needs no import of the cost model.
KV_DTYPES = ("float32", "bfloat16", "float16", "float8", "int8", "int4")
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


def parse_seq_lens(text: str) -> list[int]:
    """`--seq-len` values: comma-separated lengths, `k` = 1024 and `m` = 1024**2 (any case).

    Example:
        >>> parse_seq_lens("4096,8k,128K,1m")
        [4096, 8192, 131072, 1048576]
    """
    from keras_mha.commands.options import seq_lens_type

    return seq_lens_type(text)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not an integer; expected a positive integer"
        ) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive; expected a positive integer")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand.

    Example:
        >>> build_parser().parse_args(["inspect", "gpt2", "--seq-len", "1k"]).seq_len
        [1024]
    """
    from keras_mha.commands import compare, convert, options, prune

    parser = ArgumentParser(
        prog=PROGRAM,
        description="Attention layers for Keras 3, and model-card tools for Hub configs.",
    )
    parser.add_argument(
        DEBUG_FLAG,
        action="store_true",
        help="print the traceback of an unexpected error (accepted anywhere on the line)",
    )
    parser.add_argument("--version", action="version", version=f"{PROGRAM} {_version()}")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND")

    inspect = subcommands.add_parser(
        "inspect",
        help="report a model's attention layout, parameter count and KV-cache size",
        description=(
            "Read a model's config.json (Hub id, local directory/file, or bundled:org/name) "
            "and report its attention layout, parameters and KV-cache memory. Without "
            "network, a bundled card answers for its model id."
        ),
    )
    inspect.add_argument(
        "model",
        metavar="MODEL",
        help="org/name, a Hub URL (https://huggingface.co/org/name[/tree/REV]), a local "
        "path, or bundled:org/name",
    )
    inspect.add_argument("--revision", help="Hub branch, tag or commit (default: main)")
    inspect.add_argument(
        "--seq-len",
        type=parse_seq_lens,
        metavar="N[,N...]",
        help="sequence length(s) for the KV cache, e.g. 4096,32k (default: the model's "
        "context length, capped at 8192); the JSON `kv_cache` holds the last one",
    )
    inspect.add_argument("--batch", type=_positive_int, default=1, help="batch size (default 1)")
    inspect.add_argument(
        "--kv-dtype",
        default="bfloat16",
        type=options.dtype_type("--kv-dtype"),
        metavar="DTYPE",
        help=f"KV-cache element type: {', '.join(KV_DTYPES)} (aliases bf16, fp16, fp8, fp32, "
        "...; default bfloat16)",
    )
    inspect.add_argument(
        "--format", default="table", choices=OUTPUT_FORMATS, help="output format (default table)"
    )
    inspect.add_argument("--token", help="Hub token (default: HF_TOKEN or the stored login)")
    inspect.add_argument(
        "--offline",
        action="store_true",
        help="never touch the network: HF cache, then the bundled card (also HF_HUB_OFFLINE=1)",
    )
    inspect.add_argument("--endpoint", help="Hub endpoint URL (default: HF_ENDPOINT)")
    inspect.add_argument(
        "--timeout",
        type=options.seconds_type,
        default=10.0,
        help="seconds the whole exchange with the Hub may take (default 10; "
        "HF_HUB_ETAG_TIMEOUT wins)",
    )

    options.add_memory_arguments(inspect)

    subcommands.add_parser("cards", help="list the bundled model cards")
    compare.add_parser(subcommands)
    prune.add_parser(subcommands)
    convert.add_parser(subcommands)
    subcommands.add_parser(
        "bench",
        help="benchmarks: `bench layers [...]` (default) or `bench model [...]`",
        add_help=False,
    )
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
        return _fail("cannot write the output: stdout is closed", PathError.exit_code)
    try:
        try:
            with warnings.catch_warnings():  # restores Python's display when main returns
                warnings.showwarning = _one_line_warning(secrets)
                exit_code = _dispatch(argv)
        except SystemExit as exit_request:  # --help, --version, or a command's sys.exit
            exit_code = _exit_status(exit_request.code)
        _flush_stdout()
        return exit_code
    except KeyboardInterrupt:
        _debug_traceback(debug, secrets)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `keras-mha inspect ... | head -1`: the reader left; say nothing, as `yes` would.
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KerasMHAError as error:
        _debug_traceback(debug, secrets)
        return _fail(str(error), error.exit_code, secrets)
    except ModuleNotFoundError as error:
        _debug_traceback(debug, secrets)
        if error.name and not error.name.startswith("keras_mha"):
            return _fail(
                f"a package this command needs is not installed: {error.name} ({error}); "
                "install it, e.g. pip install 'keras-mha[jax]' (or [torch], [tensorflow])",
                MissingDependencyError.exit_code,
                secrets,
            )
        return _internal_error(error, secrets)
    except OSError as error:
        _debug_traceback(debug, secrets)
        if error.errno in _PATH_ERRNOS:
            return _fail(_describe_os_error(error), PathError.exit_code, secrets)
        return _internal_error(error, secrets)
    except Exception as error:  # noqa: BLE001 - the last line of defence: one line, exit 70
        _debug_traceback(debug, secrets)
        if _is_unknown_keras_backend(error):
            backend = os.environ.get("KERAS_BACKEND")
            where = f"KERAS_BACKEND={backend!r}" if backend else "~/.keras/keras.json's backend"
            return _fail(
                f"{where} is not a Keras backend Keras can import ({error}); set KERAS_BACKEND "
                "to jax, tensorflow or torch",
                UsageError.exit_code,
                secrets,
            )
        return _internal_error(error, secrets)


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] == "bench":
        # Everything after `bench` belongs to the benchmark's own parser.
        return _run_bench(argv[1:])
    parser = build_parser()
    arguments = parser.parse_args(argv)
    if arguments.command == "inspect":
        return _inspect(arguments)
    if arguments.command == "cards":
        return _list_cards()
    # Subcommands from keras_mha/commands/<name>.py set `run` (or `func`) as a default.
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
    _fail(str(code), 1)
    return 1


def _describe_os_error(error: OSError) -> str:
    reason = error.strerror or type(error).__name__
    if error.filename is not None:
        return f"{error.filename}: {reason}"
    if error.errno in (errno.ENOSPC, errno.EBADF, errno.EIO, errno.EFBIG, errno.EDQUOT):
        _silence_stdout()  # most likely stdout; Python would fail again flushing it at exit
        return f"cannot write the output: {reason}"
    return f"cannot read or write as asked: {reason}"


def _is_unknown_keras_backend(error: BaseException) -> bool:
    """`import keras` with a backend name Keras does not know (`KERAS_BACKEND=jaxx`)."""
    return isinstance(error, ValueError) and str(error).startswith("Unable to import backend")


def _internal_error(error: BaseException, secrets) -> int:
    from keras_mha.safe_text import one_line

    detail = one_line(str(error), secrets)[:300]
    return _fail(
        f"internal error: {type(error).__name__}: {detail}; rerun with {DEBUG_FLAG} for the "
        "traceback",
        INTERNAL_ERROR_EXIT_CODE,
        secrets,
    )


def _debug_traceback(debug: bool, secrets) -> None:
    if not debug:
        return
    import traceback

    from keras_mha.safe_text import redact_secrets

    text = "".join(traceback.format_exception(*sys.exc_info()))
    try:
        sys.stderr.write(redact_secrets(text, secrets))
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass


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
        _silence_stdout()
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        raise PathError(f"cannot write the output to stdout: {reason}", path="<stdout>") from None


def _flush_stdout() -> None:
    if sys.stdout is not None:
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            raise
        except (OSError, ValueError) as error:
            _silence_stdout()
            reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
            raise PathError(
                f"cannot write the output to stdout: {reason}", path="<stdout>"
            ) from None


def _inspect(arguments: argparse.Namespace) -> int:
    from keras_mha.cards.hub import load_config
    from keras_mha.commands.options import memory_request

    # Resolved before any loading, so a bad --gpu fails at once (UsageError, exit 2).
    arguments.memory_request = memory_request(arguments)

    _configure_huggingface_hub(arguments.timeout)
    # Loading errors name the model id, revision or path themselves; `main` prints them.
    loaded = load_config(
        arguments.model,
        revision=arguments.revision,
        token=arguments.token,
        endpoint=arguments.endpoint,
        offline=True if arguments.offline else None,
        timeout=arguments.timeout,
    )
    try:
        rendered = _render(loaded, arguments)
    except KerasMHAError as error:
        error.message = f"{arguments.model}: {error.message}"
        raise
    # Anything else is a bug (every config value is validated into a ConfigError): `main`
    # reports it as an internal error (exit 70), not as a fault of the config.
    write_stdout(rendered)
    return 0


def _render(loaded, arguments: argparse.Namespace) -> str:
    from keras_mha.cards import report as reports
    from keras_mha.cards.spec import from_config

    with warnings.catch_warnings():
        # What the reader had to guess is in spec.warnings, and so in the report itself.
        warnings.simplefilter("ignore")
        spec = from_config(loaded.config, model_id=loaded.model_id)
    seq_lens = arguments.seq_len or [reports.default_seq_len(spec)]
    report = reports.build_report(
        loaded,
        spec,
        seq_lens=seq_lens,
        batch=arguments.batch,
        kv_dtype=arguments.kv_dtype,
        memory_request=arguments.memory_request,
    )
    if arguments.format == "json":
        import json

        # allow_nan=False: the output is JSON (RFC 8259), which has no NaN or Infinity.
        return json.dumps(report, indent=2, allow_nan=False)
    if arguments.format == "markdown":
        return reports.render_markdown(report)
    return reports.render_table(report)


def _version() -> str:
    from keras_mha import __version__

    return __version__


def _configure_huggingface_hub(timeout: float) -> None:
    """Defaults for huggingface_hub, which reads them from the environment once, at import.

    keras-mha fetches config.json itself under `--timeout` (`cards.hub_fetch`); for any
    other huggingface_hub download in the same process the download timeout follows
    `--timeout` and progress bars stay off (stderr is for errors). A value the user set in
    the environment wins.
    """
    if "huggingface_hub" in sys.modules:
        return
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", str(max(1, round(timeout))))
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _list_cards() -> int:
    from keras_mha.cards.bundled import bundled_source, list_bundled

    lines = [
        f"{repo_id}\t{bundled_source(repo_id).get('revision') or ''}" for repo_id in list_bundled()
    ]
    write_stdout("\n".join(lines))
    return 0


def _run_bench(argv: list[str]) -> int:
    """`bench [layers|model|inspect] [args]`: the first word picks the benchmark (default
    layers)."""
    if argv and argv[0] in ("-h", "--help"):
        sys.stdout.write(
            f"usage: {PROGRAM} bench [layers|model|inspect] [ARGS...]\n\n"
            "  layers   attention layers against Keras, keras-hub and the backend's fused "
            "kernel (the default)\n"
            "  model    whole models (keras_mha.models.bench)\n"
            "  inspect  `inspect` and `compare` from a cold process (no backend needed)\n\n"
            f"Run `{PROGRAM} bench NAME --help` for the options of each.\n"
        )
        return 0
    target = "layers"
    if argv and argv[0] in _BENCHMARKS:
        target, argv = argv[0], argv[1:]
    module_name, function_name = _BENCHMARKS[target]
    import importlib

    from keras_mha.errors import KerasMHAError, MissingDependencyError

    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name == module_name or module_name.startswith(f"{error.name}."):
            message = f"bench {target}: {module_name} is not part of this keras-mha installation"
        else:
            message = f"bench {target}: needs the package {error.name!r}, which is not installed"
        return _fail(message, MissingDependencyError.exit_code)
    try:
        with _one_line_argparse_errors():
            return int(getattr(module, function_name)(argv) or 0)
    except KerasMHAError as error:
        return _fail(f"bench {target}: {error}", error.exit_code)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


@contextlib.contextmanager
def _one_line_argparse_errors():
    """While a benchmark parses its flags with plain argparse (it also runs standalone, as
    `python -m ...`, where argparse's usage block is right), a bad flag raises `UsageError`
    like every other subcommand's instead of printing usage lines."""
    original = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = ArgumentParser.error
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original


# `bench` targets: (module, function taking argv and returning the exit status), imported lazily.
_BENCHMARKS = {
    "layers": ("keras_mha.benchmarks.layers", "main"),
    "model": ("keras_mha.models.bench", "run_model_benchmark"),
    "inspect": ("keras_mha.benchmarks.startup", "main"),
}


def _fail(message: str, exit_code: int, secrets=()) -> int:
    """Print `keras-mha: error: <message>` as one line: secrets redacted, control
    characters shown as escapes (scripts read the first line of stderr)."""
    from keras_mha.safe_text import one_line

    try:
        sys.stderr.write(f"{PROGRAM}: error: {one_line(message, secrets)}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass  # stderr itself is gone: the exit code still tells
    return exit_code


def _one_line_warning(secrets):
    """A `warnings.showwarning` that prints `keras-mha: warning: <message>` as one line:
    no source file and code line from inside keras-mha, secrets redacted, control
    characters escaped (a warning may quote a config value)."""
    from keras_mha.safe_text import one_line

    def show(message, category, filename, lineno, file=None, line=None):
        try:
            sys.stderr.write(f"{PROGRAM}: warning: {one_line(str(message), secrets)}\n")
        except (OSError, ValueError, AttributeError):
            pass

    return show


def _silence_stdout() -> None:
    # Python would complain about the closed pipe or full disk again while flushing at exit.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


if __name__ == "__main__":
    sys.exit(main())
