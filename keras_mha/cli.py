"""The `keras-mha` command line: `inspect` a model's attention and costs, `cards`, `bench`.

    keras-mha inspect MODEL [--revision R] [--seq-len N[,N...]] [--batch B]
                            [--kv-dtype D] [--format table|json|markdown]
                            [--token T] [--offline] [--endpoint URL] [--timeout S]
    keras-mha cards                      list the bundled cards
    keras-mha bench [layers|inspect] ... benchmarks (default: layers)

MODEL is a Hub model id, a local directory or config.json, or `bundled:org/name`.
Errors are one line on stderr (`keras-mha: error: ...`) and the exit code names the
error (see `keras_mha.cards.errors`); argparse usage errors exit with 2.

`inspect` imports neither keras nor a backend, and imports `huggingface_hub` only
when it has to reach the Hub (or its cache) for a model id.

Example:
    >>> from keras_mha.cli import main
    >>> main(["inspect", "bundled:openai-community/gpt2", "--format", "json"])  # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

PROGRAM = "keras-mha"
OUTPUT_FORMATS = ("table", "json", "markdown")
# Mirrors keras_mha.cards.costs; kept here so `--help` needs no import of the cost model.
KV_DTYPES = ("float32", "bfloat16", "float16", "float8", "int8", "int4")
EXIT_INTERRUPTED = 130


def parse_seq_lens(text: str) -> list[int]:
    """`--seq-len` values: comma-separated positive integers, `k` meaning 1024 (`8k` = 8192).

    Example:
        >>> parse_seq_lens("4096,8k,128K")
        [4096, 8192, 131072]
    """
    lengths = []
    for part in text.split(","):
        item = part.strip().lower()
        multiplier = 1
        if item.endswith("k"):
            item, multiplier = item[:-1], 1024
        try:
            length = int(item) * multiplier
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--seq-len {text!r}: {part.strip()!r} is not an integer (use e.g. 4096,8k)"
            ) from None
        if length <= 0:
            raise argparse.ArgumentTypeError(f"--seq-len {text!r}: lengths must be positive")
        lengths.append(length)
    return lengths


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be a positive integer")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be positive")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand.

    Example:
        >>> build_parser().parse_args(["inspect", "gpt2", "--seq-len", "1k"]).seq_len
        [1024]
    """
    parser = argparse.ArgumentParser(
        prog=PROGRAM,
        description="Attention layers for Keras 3, and model-card tools for Hub configs.",
    )
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
        "model", metavar="MODEL", help="org/name, a local path, or bundled:org/name"
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
        choices=KV_DTYPES,
        help="KV-cache element type (default bfloat16)",
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
        type=_positive_float,
        default=10.0,
        help="seconds to wait for the Hub (default 10; HF_HUB_ETAG_TIMEOUT wins)",
    )

    subcommands.add_parser("cards", help="list the bundled model cards")
    from keras_mha.commands import prune as prune_command

    prune_command.add_parser(subcommands)
    subcommands.add_parser(
        "bench",
        help="benchmarks: `bench layers [...]` (default) or `bench inspect [...]`",
        add_help=False,
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status.

    Example:
        >>> main(["cards"])  # doctest: +SKIP
        0
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        # Everything after `bench` belongs to the benchmark's own parser.
        return _run_bench(argv[1:])
    parser = build_parser()
    arguments = parser.parse_args(argv)
    try:
        if arguments.command == "inspect":
            return _inspect(arguments)
        if arguments.command == "cards":
            return _list_cards()
        if arguments.command == "prune":
            return _run_command(arguments)
        parser.print_help()
        return 0
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `keras-mha inspect ... | head`: the reader left; nothing more to say.
        _silence_stdout()
        return 0


def _inspect(arguments: argparse.Namespace) -> int:
    from keras_mha.cards.errors import CardError, ConfigError

    _configure_huggingface_hub(arguments.timeout)
    try:
        from keras_mha.cards.hub import load_config

        loaded = load_config(
            arguments.model,
            revision=arguments.revision,
            token=arguments.token,
            endpoint=arguments.endpoint,
            offline=True if arguments.offline else None,
            timeout=arguments.timeout,
        )
    except CardError as error:
        # Loading errors name the model id, revision or path themselves.
        return _fail(str(error), error.exit_code)
    try:
        rendered = _render(loaded, arguments)
    except CardError as error:
        return _fail(f"{arguments.model}: {error}", error.exit_code)
    except (ValueError, KeyError, TypeError) as error:
        # Raised while normalising a config that is valid JSON but not a model we can read.
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        return _fail(f"{arguments.model}: {message}", ConfigError.exit_code)
    sys.stdout.write(rendered if rendered.endswith("\n") else rendered + "\n")
    sys.stdout.flush()
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
        loaded, spec, seq_lens=seq_lens, batch=arguments.batch, kv_dtype=arguments.kv_dtype
    )
    if arguments.format == "json":
        import json

        return json.dumps(report, indent=2)
    if arguments.format == "markdown":
        return reports.render_markdown(report)
    return reports.render_table(report)


def _configure_huggingface_hub(timeout: float) -> None:
    """Defaults for huggingface_hub, which reads them from the environment once, at import.

    The download timeout follows `--timeout` and progress bars stay off (a config.json is
    small and stderr is for errors); a value the user set in the environment wins.
    """
    if "huggingface_hub" in sys.modules:
        return
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", str(max(1, round(timeout))))
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _list_cards() -> int:
    from keras_mha.cards.bundled import bundled_source, list_bundled

    for repo_id in list_bundled():
        revision = bundled_source(repo_id).get("revision") or ""
        sys.stdout.write(f"{repo_id}\t{revision}\n")
    return 0


def _run_bench(argv: list[str]) -> int:
    """`bench` [layers|inspect] [args]: the first word picks the benchmark (default layers)."""
    if argv and argv[0] in ("-h", "--help"):
        sys.stdout.write(
            f"usage: {PROGRAM} bench [layers|inspect] [ARGS...]\n\n"
            "  layers   attention-layer speed across backends (the default)\n"
            "  inspect  startup time of `keras-mha inspect` beside transformers' meta-device "
            "instantiation\n\nRun `keras-mha bench layers --help` or `keras-mha bench inspect "
            "--help` for their options.\n"
        )
        return 0
    target = "layers"
    if argv and argv[0] in ("layers", "inspect"):
        target, argv = argv[0], argv[1:]
    module_name = {
        "layers": "keras_mha.benchmarks.layers",
        "inspect": "keras_mha.benchmarks.inspect_startup",
    }[target]
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name == module_name or module_name.startswith(f"{error.name}."):
            return _fail(
                f"bench {target}: {module_name} is not available in this installation "
                f"({error}); reinstall keras-mha from a complete source tree",
                1,
            )
        return _fail(
            f"bench {target}: a package it needs is missing ({error}); "
            "install it (e.g. pip install 'keras-mha[jax]' or a backend of your choice)",
            1,
        )
    try:
        return int(module.main(argv) or 0)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _run_command(arguments: argparse.Namespace) -> int:
    """A subcommand module's `run`; its keras-mha errors become one line and their exit code."""
    from keras_mha.errors import KerasMHAError

    try:
        return int(arguments.run(arguments) or 0)
    except KerasMHAError as error:
        return _fail(str(error), error.exit_code)


def _fail(message: str, exit_code: int) -> int:
    # One line, whatever the message holds: scripts read the first line of stderr.
    one_line = " ".join(str(message).split())
    sys.stderr.write(f"{PROGRAM}: error: {one_line}\n")
    sys.stderr.flush()
    return exit_code


def _silence_stdout() -> None:
    # Python would complain about the closed pipe again while flushing at exit.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
