"""`keras-mha compare MODEL MODEL ...`: several models side by side, and a memory plot.

One column per model: attention kind, heads, KV heads, head dim, layers, parameters, what
one more token costs in the KV cache, the KV cache and the serving memory at one context
and batch, and with `--gpu`/`--memory` the largest context and batch that fit and whether
training fits. `--format json` prints `{"batch", "seq_len", "kv_dtype", "memory_bytes",
"gpu", "models": [one inspect report per model]}` (each report has the keys of `keras-mha
inspect --format json`). `--plot FILE.png` draws the KV cache (`--plot-total`: the whole
serving memory) against context length, with the memory size as a horizontal line.

Like `inspect`, nothing here imports keras or a backend; matplotlib only for `--plot`.

Example:
    >>> from keras_mha.cli import main
    >>> main(["compare", "bundled:meta-llama/Llama-2-7b-hf",
    ...       "bundled:meta-llama/Meta-Llama-3-8B", "--gpu", "A100-80GB"])  # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
import sys

from keras_mha.commands import options
from keras_mha.commands.output import write_stdout
from keras_mha.commands.terminal import report_width, write_report
from keras_mha.planning.render.formatting import format_bytes, format_count, format_thousands

OUTPUT_FORMATS = ("table", "json", "markdown")
PLOT_FORMATS = (".png", ".svg", ".pdf")
DEFAULT_SEQ_LEN = 8192
# The plot starts here and doubles up to --plot-max-seq-len.
PLOT_MIN_SEQ_LEN = 1024
BEYOND_CONTEXT = (
    "beyond the model's context length: memory would allow it, the model was not trained for it"
)


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `compare` on the CLI's subparsers.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> parser = add_parser(parser.add_subparsers(dest="command"))
        >>> parser.parse_args(["a/b", "c/d", "--seq-len", "32k"]).seq_len
        32768
    """
    parser = subparsers.add_parser(
        "compare",
        help="several models side by side: attention, parameters, KV cache, memory, fit",
        description=(
            "Compare models side by side: attention layout, parameters, KV-cache and "
            "serving memory at one context and batch and, with --gpu or --memory, the "
            "largest context and batch that fit. --plot draws memory against context."
        ),
    )
    parser.add_argument(
        "models",
        nargs="+",
        metavar="MODEL",
        help="org/name, a Hub URL (https://huggingface.co/org/name[/tree/REV]), a local path, "
        "or bundled:org/name",
    )
    parser.add_argument(
        "--seq-len",
        type=options.seq_len_type,
        default=DEFAULT_SEQ_LEN,
        metavar="N",
        help="tokens per sequence (the context) for the memory figures, e.g. 8k or 1m "
        f"(default {DEFAULT_SEQ_LEN})",
    )
    options.add_batch_argument(
        parser, default=1, help_text="sequences served at once (default 1; also --batch-size)"
    )
    options.add_kv_dtype_argument(parser)
    options.add_memory_arguments(parser)
    parser.add_argument("--format", default="table", choices=OUTPUT_FORMATS)
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw memory against context length into this file (.png, .svg, .pdf; "
        "needs matplotlib: pip install 'keras-mha[plot]')",
    )
    parser.add_argument(
        "--plot-total",
        action="store_true",
        help="plot the whole serving memory (weights + KV cache + workspace), not the KV cache",
    )
    parser.add_argument(
        "--plot-max-seq-len",
        type=options.seq_len_type,
        metavar="N",
        help="longest context on the plot (default: the longest context length of the "
        "models, at least --seq-len)",
    )
    options.add_hub_arguments(parser, revision=False)
    parser.set_defaults(run=run)
    return parser


def run(arguments: argparse.Namespace) -> int:
    """Run `compare`; returns the exit status. Errors are raised (`KerasMHAError`), and the
    CLI's `main` prints them as one line with their exit code.

    Example:
        >>> from keras_mha.cli import build_parser
        >>> arguments = build_parser().parse_args(["compare", "bundled:openai-community/gpt2",
        ...     "bundled:EleutherAI/pythia-1b", "--format", "json"])
        >>> run(arguments)  # doctest: +SKIP
        0
    """
    comparison = build_comparison(arguments)
    if arguments.plot:
        plot_comparison(comparison, arguments.plot, total=arguments.plot_total,
                        max_seq_len=arguments.plot_max_seq_len)  # fmt: skip
    if arguments.format == "table":
        width = report_width(wide=arguments.wide)
        write_report(render(comparison, arguments.format, width))
    else:
        write_stdout(render(comparison, arguments.format))
    if arguments.plot:
        sys.stderr.write(f"saved {_terminal(arguments.plot)}\n")
    return 0


def _check_arguments(arguments: argparse.Namespace) -> None:
    from keras_mha.errors import UsageError

    if len(arguments.models) < 2:
        raise UsageError(
            f"compare needs at least two models; got {len(arguments.models)} "
            f"({arguments.models[0]!r}): use `keras-mha inspect` for one",
            key="MODEL",
            value=arguments.models,
        )
    if len(set(arguments.models)) != len(arguments.models):
        raise UsageError(
            f"MODEL: {arguments.models!r} names a model twice; expected different models",
            key="MODEL",
            value=arguments.models,
        )
    if arguments.plot and not arguments.plot.lower().endswith(PLOT_FORMATS):
        raise UsageError(
            f"--plot {arguments.plot!r}: expected a file name ending in {', '.join(PLOT_FORMATS)}",
            key="--plot",
            value=arguments.plot,
        )
    if (arguments.plot_total or arguments.plot_max_seq_len) and not arguments.plot:
        flag = "--plot-total" if arguments.plot_total else "--plot-max-seq-len"
        raise UsageError(f"{flag} needs --plot FILE.png", key=flag, value=True)


def build_comparison(arguments: argparse.Namespace) -> dict:
    """One plan per model at the shared context, batch and KV dtype, in its JSON form
    (`models`, each `inspect --format json`'s object).

    Raises:
        KerasMHAError: bad arguments, or a model that cannot be loaded or read (the
            message names the model).
    """
    from keras_mha.planning.plan import plan_model

    _check_arguments(arguments)
    request = options.memory_request(arguments)
    hub = options.hub_options(arguments)
    # Each model through the one pipeline of `inspect` and `keras_mha.plan`; its errors
    # name the model.
    plans = [
        plan_model(
            model,
            seq_lens=[arguments.seq_len],
            batch=arguments.batch,
            kv_dtype=arguments.kv_dtype,
            request=request,
            hub=hub,
        )  # fmt: skip
        for model in arguments.models
    ]
    models = [plan.to_dict() for plan in plans]
    specs = [plan.spec for plan in plans]
    devices = request.device_set()
    return {
        "batch": arguments.batch,
        "seq_len": arguments.seq_len,
        "kv_dtype": arguments.kv_dtype,
        "weights_dtype": request.weights_dtype,
        "memory_bytes": devices.usable_memory_bytes if devices else None,
        "gpu": devices.gpu.name if devices and devices.gpu else None,
        "devices": devices.as_dict() if devices else None,
        "sources": [report["source"] for report in models],
        "source_notes": [report.get("source_note") for report in models],
        "models": models,
        "_specs": specs,
        "_request": request,
    }


# -- rendering ----------------------------------------------------------------------------------


def _rows(comparison: dict) -> list[tuple[str, list[str]]]:
    reports = comparison["models"]

    def each(function) -> list[str]:
        return [function(report) for report in reports]

    def layers(report: dict) -> str:
        attention = report["attention"]
        text = str(attention["num_layers"])
        kinds = attention["layer_kinds"]
        if kinds["sliding"]:
            text += f" ({kinds['sliding']} sliding, window {attention['sliding_window']:,})"
        if kinds["none"]:
            text += f" (+{kinds['none']} without attention)"
        return text

    def kv(report: dict, key: str) -> str:
        entry = report["kv_cache"]
        return format_bytes(entry[key]) if entry.get("applicable", True) else "none"

    def weights(report: dict) -> str:
        serving = report["memory"]["serving"]
        return f"{format_bytes(serving['weights_bytes'])} ({serving['weights_dtype']})"

    seq_len, batch = comparison["seq_len"], comparison["batch"]
    rows = []
    if comparison["memory_bytes"] is not None:
        rows.append(("serving fits", each(lambda r: _serving_fits(r["fits"]))))
    rows += [
        ("attention", each(lambda r: r["attention"]["kind"])),
        ("query heads", each(lambda r: str(r["attention"]["num_attention_heads"]))),
        ("KV heads", each(lambda r: str(r["attention"]["num_key_value_heads"]))),
        ("head dim", each(lambda r: str(r["attention"]["head_dim"]))),
        ("attention layers", each(layers)),
        ("parameters", each(lambda r: format_count(r["parameters"]["total"]))),
        ("context length", each(lambda r: format_thousands(r.get("context_length")))),
        ("KV per token", each(lambda r: kv(r, "bytes_per_token"))),
        (f"KV next token at {seq_len:,}", each(lambda r: kv(r, "marginal_bytes_per_token"))),
        (f"KV cache at {seq_len:,} x {batch}", each(lambda r: kv(r, "total_bytes"))),
        ("weights", each(weights)),
        ("serving memory", each(lambda r: format_bytes(r["memory"]["serving_bytes"]))),
        ("training memory", each(lambda r: format_bytes(r["memory"]["training_bytes"]))),
    ]
    if comparison["memory_bytes"] is not None:
        rows += [
            ("serving per device", each(lambda r: format_bytes(r["fits"]["serving_bytes"]))),
            (f"max context at batch {batch}", each(lambda r: _length(r["fits"]))),
            (f"max batch at {seq_len:,}", each(lambda r: _batch(r["fits"]["max_batch"]))),
            ("training fits", each(lambda r: _yes_no(r["fits"]))),
        ]
    if any(report.get("speed_bounds") for report in comparison["models"]):
        rows.append(("decode at most", each(lambda r: _decode_bound(r.get("speed_bounds")))))
    return rows


def _serving_fits(fits: dict) -> str:
    if fits["serving_fits"]:
        return "yes"
    return "no (weights)" if not fits["weights_fit"] else "no"


def _decode_bound(bounds) -> str:
    if not bounds:
        return "-"
    return f"{bounds['decode_tokens_per_s']:,.0f} tok/s"


def _length(fits: dict) -> str:
    if not fits["weights_fit"]:
        return "0 (weights do not fit)"
    if fits["max_seq_len"] is None:
        return "unbounded by memory"
    context = fits.get("context_length")
    beyond = " (!)" if context and fits["max_seq_len"] > context else ""
    return f"{fits['max_seq_len']:,}{beyond}"


def _batch(value) -> str:
    return "unbounded" if value is None else f"{value:,}"


def _yes_no(fits: dict) -> str:
    if fits["training_fits"]:
        return "yes"
    return "with checkpointing" if fits["training_fits_checkpointed"] else "no"


def _source_notes(reports: list[dict]) -> list[str]:
    """Why a source answered (e.g. offline: the bundled snapshot), once per distinct note,
    naming the models it applies to when not all of them."""
    by_note: dict[str, list[str]] = {}
    for report in reports:
        if report.get("source_note"):
            by_note.setdefault(report["source_note"], []).append(report["model"])
    return [
        note if len(models) == len(reports) else f"{', '.join(models)}: {note}"
        for note, models in by_note.items()
    ]


def _title(comparison: dict) -> str:
    weights = comparison["weights_dtype"] or "each checkpoint's own format"
    title = (
        f"compared at batch {comparison['batch']}, context {comparison['seq_len']:,}, "
        f"KV cache {comparison['kv_dtype']}, weights {weights}"
    )
    if comparison["memory_bytes"] is not None:
        fitting = sum(report["fits"]["serving_fits"] for report in comparison["models"])
        devices = comparison.get("devices") or {}
        where = devices.get("name") or comparison["gpu"] or "--memory"
        title += (
            f"; on {where} ({format_bytes(comparison['memory_bytes'])} usable per device): "
            f"{fitting} of {len(comparison['models'])} models fit for serving"
        )
    return title


def _column_groups(names, rows, label_width: int, width: int) -> list[list[int]]:
    """Model columns in groups that fit `width` beside the labels (one group when wide)."""
    widths = [
        max(len(name), *(len(values[index]) for _, values in rows))
        for index, name in enumerate(names)
    ]
    groups, current, used = [], [], label_width
    for index, column in enumerate(widths):
        if current and used + 2 + column > width:
            groups.append(current)
            current, used = [], label_width
        current.append(index)
        used += 2 + column
    return groups + [current] if current else groups


def _short_names(reports: list[dict], escape) -> list[str]:
    """Model names for column headings: the part after the organisation when the full
    names would not fit and the short ones stay distinct."""
    full = [escape(report["model"]) for report in reports]
    short = [name.rsplit("/", 1)[-1] for name in full]
    return short if len(set(short)) == len(short) else full


def render(comparison: dict, output_format: str, width: int = 80) -> str:
    """The comparison as an aligned table (within `width` columns: the models are laid out
    in as many column groups as needed), JSON or markdown.

    Example:
        >>> render({"batch": 1, "seq_len": 8, "kv_dtype": "int8", "models": []}, "json")
        '{\\n  "batch": 1,\\n  "seq_len": 8,\\n  "kv_dtype": "int8",\\n  "models": []\\n}'
    """
    from keras_mha.planning.render.text import UNLIMITED, wrap, wrap_markdown

    if output_format == "json":
        import json

        public = {key: value for key, value in comparison.items() if not key.startswith("_")}
        return json.dumps(public, indent=2, allow_nan=False)
    escape = _markdown if output_format == "markdown" else _terminal
    # Every cell escaped: values can quote a config (a format name, a model id).
    rows = [(label, [escape(value) for value in values]) for label, values in _rows(comparison)]
    beyond_context = any(value.endswith("(!)") for _, values in rows for value in values)
    warnings = [
        (report["model"], warning)
        for report in comparison["models"]
        for warning in report.get("warnings", [])
    ]
    verdicts = [
        (report["model"], report["fits"]["verdict"])
        for report in comparison["models"]
        if report.get("fits")
    ]
    notes = _source_notes(comparison["models"])
    if output_format == "markdown":
        names = [escape(report["model"]) for report in comparison["models"]]
        lines = [f"**{_title(comparison)[0].upper()}{_title(comparison)[1:]}.**", ""]
        lines += [f"> Note: {_markdown(note)}" for note in notes] + ([""] if notes else [])
        lines.append("| | " + " | ".join(names) + " |")
        lines.append("|---|" + "---:|" * len(names))
        lines += [f"| {label} | " + " | ".join(values) + " |" for label, values in rows]
        if verdicts:
            lines += [""] + [f"- {_markdown(model)}: {_markdown(text)}" for model, text in verdicts]
        if beyond_context:
            lines += ["", f"(!) {BEYOND_CONTEXT}"]
        if warnings:
            lines += ["", "**Warnings**", ""]
            lines += [f"- {_markdown(model)}: {_markdown(text)}" for model, text in warnings]
        return "\n".join(wrap_markdown(lines)) + "\n"
    names = [escape(report["model"]) for report in comparison["models"]]
    label_width = max(len(label) for label, _ in rows)
    if width < UNLIMITED:
        full_width = label_width + sum(
            2 + max(len(name), *(len(values[i]) for _, values in rows))
            for i, name in enumerate(names)
        )
        if full_width > width:
            names = _short_names(comparison["models"], escape)
    lines = wrap(_title(comparison), width, "", "  ")
    for note in notes:
        lines += wrap(f"note: {_terminal(note)}", width, "", "  ")
    for group in _column_groups(names, rows, label_width, width):
        widths = [max(len(names[i]), *(len(values[i]) for _, values in rows)) for i in group]
        lines.append("")
        heading = "  ".join(names[i].rjust(w) for i, w in zip(group, widths, strict=True))
        lines.append(" " * label_width + "  " + heading)
        for label, values in rows:
            cells = "  ".join(values[i].rjust(w) for i, w in zip(group, widths, strict=True))
            lines.append(f"{label:<{label_width}}  {cells}")
    if verdicts:
        lines.append("")
        for model, text in verdicts:
            lines += wrap(f"{_terminal(model)}: {_terminal(text)}", width, "", "  ")
    if beyond_context:
        lines += [""] + wrap(f"(!) {BEYOND_CONTEXT}", width, "", "    ")
    if warnings:
        lines += ["", "warnings"]
        for model, text in warnings:
            lines += wrap(f"{_terminal(model)}: {_terminal(text)}", width, "  - ", "    ")
    return "\n".join(lines)


def _terminal(text) -> str:
    # Model ids and paths come from the command line or a Hub answer: shown, never obeyed.
    from keras_mha.planning.render.report import terminal_text

    return terminal_text(text)


def _markdown(text) -> str:
    from keras_mha.planning.render.report import markdown_text

    return markdown_text(text)


# -- plot ---------------------------------------------------------------------------------------


def plot_lengths(maximum: int, minimum: int = PLOT_MIN_SEQ_LEN) -> list[int]:
    """Powers of two from `minimum` to the first one at or above `maximum`.

    Example:
        >>> plot_lengths(8192)
        [1024, 2048, 4096, 8192]
        >>> plot_lengths(5000)
        [1024, 2048, 4096, 8192]
    """
    minimum = min(minimum, maximum)
    lengths, length = [], 1 << (minimum.bit_length() - 1)
    while True:
        lengths.append(length)
        if length >= maximum:
            return lengths
        length *= 2


def plot_series(comparison: dict, *, total: bool, max_seq_len: int | None) -> dict:
    """The plotted numbers: `{"seq_lens": [...], "series": [{"model", "kind",
    "context_length", "bytes": [...]}], "memory_bytes", "total"}`.

    Example:
        >>> from keras_mha.cli import build_parser
        >>> arguments = build_parser().parse_args(["compare", "bundled:openai-community/gpt2",
        ...     "bundled:EleutherAI/pythia-1b"])
        >>> series = plot_series(build_comparison(arguments), total=False, max_seq_len=4096)
        >>> series["seq_lens"], series["series"][0]["bytes"][0]
        ([1024, 2048, 4096], 37748736)
    """
    from keras_mha.planning.costs import kv_cache_cost
    from keras_mha.planning.planner.memory import serving_bytes_function
    from keras_mha.planning.planner.request import plan_format

    reports, specs = comparison["models"], comparison["_specs"]
    if max_seq_len is None:
        contexts = [report.get("context_length") or 0 for report in reports]
        max_seq_len = max([comparison["seq_len"], *contexts])
    seq_lens = plot_lengths(max_seq_len)
    request, batch = comparison["_request"], comparison["batch"]
    series = []
    for report, spec in zip(reports, specs, strict=True):
        if total:
            serving = serving_bytes_function(
                spec, weights_format=plan_format(spec, request), kv_dtype=comparison["kv_dtype"],
                prefill_chunk=request.prefill_chunk,
            )  # fmt: skip
            sizes = [serving(batch, seq_len) for seq_len in seq_lens]
        else:
            sizes = [
                kv_cache_cost(
                    spec, seq_len=seq_len, batch=batch, kv_dtype=comparison["kv_dtype"]
                ).total_bytes
                for seq_len in seq_lens
            ]
        series.append(
            {
                "model": report["model"],
                "kind": report["attention"]["kind"],
                "context_length": report.get("context_length"),
                "bytes": sizes,
            }
        )
    return {
        "seq_lens": seq_lens,
        "series": series,
        "memory_bytes": comparison["memory_bytes"],
        "total": total,
    }


def plot_comparison(
    comparison: dict, path: str, *, total: bool = False, max_seq_len: int | None = None
) -> None:
    """Draw `plot_series` on log-log axes into `path` (lines dashed beyond each model's
    context length; the memory size as a horizontal line).

    Raises:
        MissingDependencyError: matplotlib is not installed.
        PathError: the file cannot be written.
    """
    from keras_mha.errors import MissingDependencyError, PathError

    try:
        import matplotlib
    except ImportError:
        raise MissingDependencyError(
            "--plot needs matplotlib, which is not installed: pip install 'keras-mha[plot]'",
            key="--plot",
            value=path,
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    data = plot_series(comparison, total=total, max_seq_len=max_seq_len)
    seq_lens, gib = data["seq_lens"], 1024**3
    figure, axes = plt.subplots(figsize=(9, 5.5), dpi=120)
    for index, line in enumerate(data["series"]):
        color, marker = f"C{index % 10}", "osD^vP<>*X"[index % 10]
        values = [size / gib for size in line["bytes"]]
        limit = line["context_length"] or seq_lens[-1]
        inside = [i for i, length in enumerate(seq_lens) if length <= limit]
        # Dashed from the last point within the context (so the line stays joined) onward.
        beyond = [i for i, length in enumerate(seq_lens) if length > limit]
        outside = list(range(max(inside, default=0), len(seq_lens))) if beyond else []
        label = f"{line['model']} ({line['kind']})"
        if inside:
            axes.plot([seq_lens[i] for i in inside], [values[i] for i in inside], color=color,
                      marker=marker, markersize=4.5, linewidth=2, label=label)  # fmt: skip
        if len(outside) > 1 or not inside:
            axes.plot([seq_lens[i] for i in outside], [values[i] for i in outside], color=color,
                      linestyle="--", linewidth=1.2, alpha=0.7,
                      label=None if inside else label)  # fmt: skip
    if data["memory_bytes"] is not None:
        where = comparison["gpu"] or "--memory"
        axes.axhline(data["memory_bytes"] / gib, color="black", linestyle=":", linewidth=1.5,
                     label=f"{where}: {data['memory_bytes'] / gib:.1f} GiB")  # fmt: skip
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.xaxis.set_major_formatter(
        FuncFormatter(lambda value, _: f"{value / 1024:g}k" if value >= 1024 else f"{value:g}")
    )
    axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axes.set_xlabel("context length (tokens)")
    what = "serving memory (weights + KV cache + workspace)" if total else "KV cache"
    axes.set_ylabel(f"{what}, GiB (log scale)")
    axes.set_title(
        f"{what} against context ({comparison['kv_dtype']} KV cache, batch {comparison['batch']})"
    )
    axes.grid(True, which="major", alpha=0.3)
    axes.legend(loc="upper left", fontsize=8, title="dashed: beyond the model's context")
    figure.tight_layout()
    try:
        figure.savefig(path)
    except OSError as error:
        raise PathError(
            f"--plot {path!r}: cannot write the file ({error.strerror or error})",
            path=path,
        ) from None
    finally:
        plt.close(figure)


__all__ = ["add_parser", "build_comparison", "plot_comparison", "plot_series", "render", "run"]
