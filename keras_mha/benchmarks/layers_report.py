"""The issue's speed targets, and the results of `keras-mha bench layers` as text.

`evaluate_targets` checks the measured figures against issue 2's targets
(CPU, every backend); `format_table` and `format_markdown` render a results
dict from `keras_mha.benchmarks.layers.run_benchmark`.
"""

from __future__ import annotations

from keras_mha.benchmarks.measure_layers import DECODE_STEP, KERAS, OURS, RECOMPUTE

MHA_MIN_SPEEDUP = 1.0
GQA_MIN_SPEEDUP = 1.3
GQA_MIN_MEMORY_SAVING = 0.30
GQA_TARGET_MIN_GROUPS = 4
GQA_TARGET_SEQ_LEN = 1024
DECODE_MIN_SPEEDUP = 20.0
DECODE_TARGET_CONTEXT = 2048


def evaluate_targets(results: dict) -> list[dict]:
    """Check the issue's speed targets against the measured figures.

    A target whose shapes differ from the issue's (GQA with fewer than 4 query
    heads per KV head or a sequence other than 1024; a decode context other
    than 2048; a non-CPU device) is still evaluated but marked not applicable.

    Example:
        >>> evaluate_targets({"settings": {}, "comparisons": [], "decode": None,
        ...                   "environment": {"device": "cpu"}})
        []
    """
    settings, targets = results["settings"], []
    on_cpu = results["environment"]["device"] == "cpu"
    by_case = {}
    for row in results["comparisons"]:
        by_case.setdefault(row["case"], []).append(row)

    def describe(row, with_memory):
        text = f"{row['mode']} {row['speedup']:.2f}x as fast"
        if row.get("speedup_quartiles"):
            low, high = row["speedup_quartiles"]
            text += f" (paired calls: {low:.2f}-{high:.2f})"
        if with_memory and row["memory_saving"] is not None:
            saving = 100 * row["memory_saving"]
            text += f", {saving:.0f}% less" if saving >= 0 else f", {-saving:.0f}% more"
            text += " peak memory"
        return text

    if "mha" in by_case:
        rows = by_case["mha"]
        targets.append(
            {
                "name": "mha_not_slower",
                "description": "MHA not slower than keras.layers.MultiHeadAttention",
                "met": all(row["speedup"] >= MHA_MIN_SPEEDUP for row in rows),
                "applicable": on_cpu,
                "detail": "; ".join(describe(row, False) for row in rows),
            }
        )
    if "gqa" in by_case:
        rows = by_case["gqa"]
        groups = settings["heads"] // settings["kv_heads"]
        targets.append(
            {
                "name": "gqa_faster_or_leaner",
                "description": (
                    f"GQA >= {GQA_MIN_SPEEDUP}x faster or >= {100 * GQA_MIN_MEMORY_SAVING:.0f}% "
                    "less peak memory than keras.layers.GroupQueryAttention (each mode)"
                ),
                "met": all(
                    row["speedup"] >= GQA_MIN_SPEEDUP
                    or (
                        row["memory_saving"] is not None
                        and row["memory_saving"] >= GQA_MIN_MEMORY_SAVING
                    )
                    for row in rows
                ),
                "applicable": on_cpu
                and groups >= GQA_TARGET_MIN_GROUPS
                and settings["seq_len"] == GQA_TARGET_SEQ_LEN,
                "detail": "; ".join(describe(row, True) for row in rows),
            }
        )
    decode = results.get("decode")
    if decode:
        recompute = next(
            row
            for row in decode["rows"]
            if row["implementation"] == OURS and row["mode"] == RECOMPUTE
        )
        targets.append(
            {
                "name": "decode_speedup",
                "description": (
                    f"cached decode step >= {DECODE_MIN_SPEEDUP:.0f}x faster than recomputing "
                    f"the full sequence (context {decode['context']})"
                ),
                "met": recompute["speedup_of_step"] >= DECODE_MIN_SPEEDUP,
                "applicable": on_cpu and decode["context"] == DECODE_TARGET_CONTEXT,
                "detail": f"step {recompute['speedup_of_step']:.0f}x as fast as the recompute",
            }
        )
    return targets


# ------------------------------------------------------------------ formatting
def _fmt(value, spec=".3g", suffix=""):
    if value is None:
        return "n/a"
    return f"{value:{spec}}{suffix}"


def _fmt_ms(value):
    if value is None:
        return "n/a"
    return f"{value:.3f}" if value < 1 else f"{value:.1f}" if value < 1000 else f"{value:.0f}"


def _fmt_speedup(row):
    text = _fmt(row["speedup"], ".2f", "x")
    spread = row.get("speedup_quartiles")
    return text if not spread else f"{text} ({spread[0]:.2f}-{spread[1]:.2f})"


def _fmt_saving(value):
    return "n/a" if value is None else f"{100 * value:.0f}%"


def _header_lines(results: dict) -> list[str]:
    settings, environment = results["settings"], results["environment"]
    versions = ", ".join(f"{name} {version}" for name, version in environment["versions"].items())
    groups = settings["heads"] // settings["kv_heads"]
    return [
        f"backend {environment['backend']} ({versions}) on {environment['device']}, "
        f"{results['machine']['cpu_count']} CPU cores, {results['date']}",
        f"shapes: batch {settings['batch']}, sequence {settings['seq_len']}, features "
        f"{settings['features']}, {settings['heads']} query heads of size {settings['head_dim']}; "
        f"GQA: {settings['kv_heads']} KV heads ({groups} query heads per KV head); "
        f"{'causal' if settings['causal'] else 'not causal'}; float32",
        f"compiled: {settings['compiled']} for both sides"
        + (f"; processes pinned to {settings['cpus']} CPU(s)" if settings.get("cpus") else "")
        + f"; median of {settings['repeats']} timed "
        f"calls after {settings['warmup']} warm-up call(s) (decode step: median of "
        f"{settings['decode_repeats']})",
        f"peak memory: highest RSS during {settings['memory_calls']} calls after the warm-up "
        f"minus the RSS just before them ({settings['memory_method']}); "
        f"{settings['isolation']}",
    ]


def _comparison_table(results: dict):
    header = [
        "case",
        "mode",
        "keras-mha ms",
        "Keras ms",
        "speedup (quartiles)",
        "keras-mha peak MB",
        "Keras peak MB",
        "memory saved",
        "max abs diff",
    ]
    names = {"mha": "MHA vs MultiHeadAttention", "gqa": "GQA vs GroupQueryAttention"}
    rows = [
        [
            names[row["case"]],
            row["mode"],
            _fmt_ms(row["ours_ms"]),
            _fmt_ms(row["keras_ms"]),
            _fmt_speedup(row),
            _fmt(row["ours_peak_mb"], ".1f"),
            _fmt(row["keras_peak_mb"], ".1f"),
            _fmt_saving(row["memory_saving"]),
            _fmt(row["max_abs_diff"], ".1e"),
        ]
        for row in results["comparisons"]
    ]
    return header, rows


def _decode_table(results: dict):
    decode = results["decode"]
    context = decode["context"]
    labels = {
        (OURS, DECODE_STEP): f"keras-mha cached decode step (1 token, context {context})",
        (OURS, RECOMPUTE): f"keras-mha recompute all {context + 1} tokens",
        (KERAS, RECOMPUTE): f"keras GroupQueryAttention recompute all {context + 1} tokens",
    }
    header = ["decode", "median ms", "peak MB", "time / step time", "max abs diff vs step"]
    rows = [
        [
            labels[(row["implementation"], row["mode"])],
            _fmt_ms(row["median_ms"]),
            _fmt(row["peak_mb"], ".1f"),
            _fmt(row["speedup_of_step"], ".0f" if row["speedup_of_step"] >= 10 else ".2f", "x"),
            "-" if row["mode"] == DECODE_STEP else _fmt(row["max_abs_diff_vs_step"], ".1e"),
        ]
        for row in decode["rows"]
    ]
    return header, rows


def _trace_note(decode: dict) -> str:
    positions = decode["step_positions_before_timing"]
    if decode["step_traces"] == 0:
        return f"decode step: eager, nothing traced ({positions} warm-up position(s))"
    return (
        f"decode step compiled {decode['step_traces']} time(s) for {positions} warm-up "
        "position(s) and the timed calls"
    )


def _target_lines(results: dict) -> list[str]:
    lines = []
    for target in results["targets"]:
        verdict = "MET" if target["met"] else "MISSED"
        note = "" if target["applicable"] else " (shapes/device differ from the issue's target)"
        lines.append(f"{verdict:<7}{target['description']}: {target['detail']}{note}")
    return lines


def _plain_table(header, rows) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = []
    for index, row in enumerate([header, *rows]):
        cells = [
            str(cell).ljust(width)
            if position < 2 or index == 0 and position < 2
            else str(cell).rjust(width)
            for position, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return lines


def _markdown_table(header, rows) -> list[str]:
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join("---" if i < 2 else "---:" for i in range(len(header))) + "|")
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines


def format_table(results: dict) -> str:
    """The results as a plain-text report: settings, comparisons, decode, targets.

    Example:
        >>> print(format_table(run_benchmark(BenchmarkConfig(seq_len=32, isolate=False))))
        ... # doctest: +SKIP
    """
    lines = ["keras-mha layer benchmark", *_header_lines(results), ""]
    if results["comparisons"]:
        lines += _plain_table(*_comparison_table(results)) + [""]
    if results["decode"]:
        lines += _plain_table(*_decode_table(results))
        lines.append(_trace_note(results["decode"]))
        lines.append("")
    if results["targets"]:
        lines += ["targets (issue 2, CPU):", *("  " + line for line in _target_lines(results))]
    return "\n".join(lines).rstrip() + "\n"


def format_markdown(results: dict) -> str:
    """The results as Markdown (tables plus the settings as a list).

    Example:
        >>> print(format_markdown(results))  # doctest: +SKIP
    """
    environment = results["environment"]
    lines = [f"#### Backend: {environment['backend']}", ""]
    lines += [f"- {line}" for line in _header_lines(results)] + [""]
    if results["comparisons"]:
        lines += _markdown_table(*_comparison_table(results)) + [""]
    if results["decode"]:
        lines += _markdown_table(*_decode_table(results))
        lines += [
            "",
            _trace_note(results["decode"]),
            "",
        ]
    if results["targets"]:
        lines += [
            f"- **{line.split(' ', 1)[0]}** {line.split(' ', 1)[1].strip()}"
            for line in _target_lines(results)
        ]
    return "\n".join(lines).rstrip() + "\n"
