"""`keras-mha inspect MODEL`: one model's attention layout, parameters and KV-cache memory,
and with `--gpu` / `--memory` what fits.

MODEL is a Hub model id or model page URL, a local directory or config.json, or
`bundled:org/name`. The report is a table (80 columns, verdict first), JSON (the keys
other tools can rely on) or markdown. Nothing here imports keras or a backend;
`huggingface_hub` only when a Hub id has to be resolved.

Example:
    >>> from keras_mha.cli import main
    >>> main(["inspect", "bundled:openai-community/gpt2", "--format", "json"])  # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from keras_mha.commands import options
from keras_mha.commands.output import write_stdout
from keras_mha.commands.terminal import report_width, write_report
from keras_mha.planning.plan import plan_model
from keras_mha.planning.render import report as reports

OUTPUT_FORMATS = ("table", "json", "markdown")


def parse_seq_lens(text: str) -> list[int]:
    """`--seq-len` values: comma-separated lengths, `k` = 1024 and `m` = 1024**2 (any case).

    Example:
        >>> parse_seq_lens("4096,8k,128K,1m")
        [4096, 8192, 131072, 1048576]
    """
    return options.seq_lens_type(text)


def add_parser(subcommands) -> argparse.ArgumentParser:
    """Register `inspect` on the CLI's subparsers.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> inspect = add_parser(parser.add_subparsers(dest="command"))
        >>> inspect.parse_args(["org/name", "--seq-len", "8k"]).seq_len
        [8192]
    """
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
    inspect.add_argument(
        "--seq-len",
        type=parse_seq_lens,
        metavar="N[,N...]",
        help="tokens per sequence (the context) for the KV cache and memory, e.g. "
        "4096,32k (default: the model's context length, capped at 8192); the JSON "
        "`kv_cache` and the memory plan hold the last one",
    )
    options.add_batch_argument(
        inspect, default=1, help_text="sequences served at once (default 1; also --batch-size)"
    )
    options.add_kv_dtype_argument(inspect)
    inspect.add_argument(
        "--format", default="table", choices=OUTPUT_FORMATS, help="output format (default table)"
    )
    options.add_hub_arguments(inspect)
    options.add_memory_arguments(inspect)
    inspect.set_defaults(run=run)
    return inspect


def run(arguments: argparse.Namespace) -> int:
    """Report on `arguments.model` as `arguments.format` asks; 0 when printed. A model that
    cannot be read or reported raises its `KerasMHAError` (`cli.main` prints it).

    Example:
        >>> from keras_mha.cli import build_parser
        >>> arguments = build_parser().parse_args(["inspect", "bundled:openai-community/gpt2"])
        >>> run(arguments)  # doctest: +SKIP
        0
    """
    # Resolved before any loading, so a bad --gpu fails at once (UsageError, exit 2).
    request = options.memory_request(arguments)
    hub = options.hub_options(arguments)
    _configure_huggingface_hub(hub.timeout)
    # Loading errors name the model id, revision or path themselves; the plan's are prefixed
    # with the model. Anything else is a bug (every config value is validated into a
    # ConfigError): `main` reports it as an internal error (exit 70), not as the config's.
    result = plan_model(arguments.model, seq_lens=arguments.seq_len, batch=arguments.batch,
                        kv_dtype=arguments.kv_dtype, request=request, hub=hub)  # fmt: skip
    text = render(result, arguments.format, arguments.wide)
    if arguments.format == "table":
        write_report(text)  # laid out for the terminal: its width and colour
    else:
        write_stdout(text)
    return 0


def render(plan, output_format: str, wide: bool = False) -> str:
    """A `Plan` as `output_format` asks: the table, markdown, or its JSON (`Plan.to_dict()`).

    Example:
        >>> from keras_mha.planning.plan import plan_model
        >>> text = render(plan_model("bundled:openai-community/gpt2"), "json")
        >>> json.loads(text)["attention"]["kind"]
        'MHA'
    """
    if output_format == "json":
        # allow_nan=False: the output is JSON (RFC 8259), which has no NaN or Infinity.
        return json.dumps(plan.to_dict(), indent=2, allow_nan=False)
    if output_format == "markdown":
        return reports.render_markdown(plan)
    return reports.render_table(plan, report_width(wide=wide))


def _configure_huggingface_hub(timeout: float) -> None:
    """Defaults for huggingface_hub, which reads them from the environment once, at import.

    keras-mha fetches config.json itself under `--timeout` (`keras_mha.hub.fetch`); for any
    other huggingface_hub download in the same process the download timeout follows
    `--timeout` and progress bars stay off (stderr is for errors). A value the user set in
    the environment wins.
    """
    if "huggingface_hub" in sys.modules:
        return
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", str(max(1, round(timeout))))
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
