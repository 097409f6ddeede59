"""`keras-mha gpus`: the accelerator table `--gpu` reads: memory, memory bandwidth and
dense 16-bit and float8 peaks of each device, and where each figure comes from.

Example:
    >>> from keras_mha.cli import main
    >>> main(["gpus", "--format", "json"])  # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
import json

from keras_mha.commands import options
from keras_mha.commands.output import write_stdout
from keras_mha.commands.terminal import report_width, write_report
from keras_mha.planning.planner.gpus import GPUS
from keras_mha.planning.render.formatting import format_bandwidth, format_bytes
from keras_mha.planning.render.text import aligned, wrap

FORMATS = ("table", "json", "markdown")


def add_parser(subcommands) -> argparse.ArgumentParser:
    """Register `gpus` on the CLI's subparsers.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> gpus = add_parser(parser.add_subparsers(dest="command"))
        >>> parser.parse_args(["gpus", "--format", "json"]).format
        'json'
    """
    parser = subcommands.add_parser(
        "gpus",
        help="list the accelerators --gpu knows: memory, bandwidth, peak FLOPS",
        description=(
            "List the accelerators `--gpu NAME` accepts, with the memory the plan fits into, "
            "the peak memory bandwidth (decode speed bound) and the dense bfloat16 and float8 "
            "tensor peaks (prefill speed bound), and each figure's source."
        ),
    )
    parser.add_argument("--format", default="table", choices=FORMATS, help="output format")
    options.add_wide_argument(parser)
    parser.set_defaults(run=run)
    return parser


def _tflops(flops) -> str:
    return "-" if flops is None else f"{flops / 1e12:,.0f}"


def rows() -> list[tuple[str, ...]]:
    """The table: name, memory, bandwidth, 16-bit and float8 TFLOPS.

    Example:
        >>> rows()[0]
        ('accelerator', 'memory', 'bandwidth', '16-bit TFLOPS', 'fp8 TFLOPS')
    """
    table = [("accelerator", "memory", "bandwidth", "16-bit TFLOPS", "fp8 TFLOPS")]
    for gpu in GPUS:
        table.append((gpu.name, format_bytes(gpu.memory_bytes),
                      format_bandwidth(gpu.bandwidth_bytes_per_s),
                      _tflops(gpu.dense_16bit_flops), _tflops(gpu.dense_fp8_flops)))  # fmt: skip
    return table


def run(arguments: argparse.Namespace) -> int:
    """Print the table; returns the exit status.

    Example:
        >>> run(argparse.Namespace(format="json", wide=False))  # doctest: +SKIP
        0
    """
    if arguments.format == "json":
        write_stdout(json.dumps([gpu.as_dict() for gpu in GPUS], indent=2))
        return 0
    table = rows()
    if arguments.format == "markdown":
        lines = ["| " + " | ".join(table[0]) + " | source |", "|---|" + "---:|" * 4 + "---|"]
        for gpu, row in zip(GPUS, table[1:], strict=True):
            lines.append("| " + " | ".join(row) + f" | {gpu.spec_source} |")
        write_stdout("\n".join(lines))
        return 0
    width = report_width(wide=arguments.wide)
    lines = aligned(table, (False, True, True, True, True), indent="")
    lines.append("")
    lines += wrap(
        "memory: what the plan fits into (the published nvidia-smi figure for NVIDIA cards, "
        "else the datasheet's); bandwidth and dense (no sparsity) tensor peaks from each "
        "datasheet, listed with `--format markdown` or json; 16-bit is bfloat16 (float16 on "
        "T4 and V100); TPUs per chip.",
        width,
    )
    write_report("\n".join(lines))
    return 0


__all__ = ["add_parser", "rows", "run"]
