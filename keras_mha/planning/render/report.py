"""Render a `Plan` (`keras_mha.planning.plan`) as the `keras-mha inspect` report: aligned
text (`render_table`) or a markdown model card (`render_markdown`). Both read the plan's
JSON form (`Plan.to_dict()`, which is `--format json`); they compute nothing.

The report's core keys never change meaning (docs/reference/json.md, "The contract"):

    model, source, model_type,
    attention{kind, num_layers, num_attention_heads, num_key_value_heads, head_dim,
              sliding_window, layer_kinds{full, sliding, none}},
    parameters{total, attention},
    kv_cache{dtype, batch, seq_len, bytes_per_token, total_bytes, mha_equivalent_bytes}

Extra keys add detail: `revision`, `commit`, `source_note`, `architecture`,
`context_length`, `attention.num_hidden_layers`, `attention.hidden_size`,
`parameters.active` (MoE, else null), `parameters.breakdown`, `parameters.vision`
(multimodal vision tower + projector, else null), `kv_cache_by_seq_len`
(one `kv_cache`-shaped entry per requested length, in the order asked),
`bundled_card` (provenance of a bundled snapshot) and `warnings`; with a memory size,
`fits` and `speed_bounds` (keras_mha.planning.render.memory_report).

With several sequence lengths, `kv_cache` is the LAST one requested (so
`--seq-len 4096,32768` reports 32768 there) and `kv_cache_by_seq_len` lists all.

Pure Python: nothing here imports keras, a backend or huggingface_hub.

Example:
    >>> import keras_mha
    >>> text = render_markdown(keras_mha.plan("bundled:meta-llama/Meta-Llama-3-8B"))
    >>> text.splitlines()[0]
    '# meta-llama/Meta-Llama-3-8B'
"""

from __future__ import annotations

from keras_mha import moved_paths
from keras_mha.planning.render import memory_report
from keras_mha.planning.render.formatting import format_bytes, format_count, format_thousands
from keras_mha.planning.render.text import DEFAULT_WIDTH, aligned, wrap, wrap_markdown
from keras_mha.safe_text import visible

PARAMETER_BREAKDOWN_KEYS = ("embeddings", "attention", "mlp", "norms", "lm_head", "other")
# The row under `other` that says how much of it is a multimodal model's vision side.
VISION_LABEL = "of which vision tower + projector"


def _report(plan) -> dict:
    """The JSON form the renderers read: a `Plan`'s `to_dict()`, or that dict already."""
    return plan if isinstance(plan, dict) else plan.to_dict()


def _saving(entry: dict) -> str:
    total, equivalent = entry["total_bytes"], entry["mha_equivalent_bytes"]
    if not total or not equivalent:
        return "-"
    if total >= equivalent:
        return "none" if total == equivalent else f"{total / equivalent:.2f}x more"
    return f"{equivalent / total:.1f}x smaller ({1 - total / equivalent:.0%} saved)"


def _heads_sentence(attention: dict) -> str:
    heads, kv_heads = attention["num_attention_heads"], attention["num_key_value_heads"]
    kind = attention["kind"]
    if kind == "MLA":
        return f"{heads} query heads reading a shared compressed (latent) KV cache"
    if kind == "MHA" or heads == kv_heads:
        return f"{heads} heads, each with its own keys and values"
    if kind == "MQA" or kv_heads == 1:
        return f"{heads} query heads sharing 1 key/value head"
    group = heads // kv_heads if kv_heads else "?"
    return f"{heads} query heads sharing {kv_heads} key/value heads ({group} per group)"


def _layers_sentence(attention: dict) -> str:
    kinds = attention["layer_kinds"]
    parts = [f"{kinds['full']} full"]
    if kinds["sliding"]:
        parts.append(f"{kinds['sliding']} sliding-window")
    if kinds["none"]:
        parts.append(f"{kinds['none']} without attention")
    total = attention.get("num_hidden_layers")
    suffix = f" (of {total} layers)" if total and total != attention["num_layers"] else ""
    return f"{attention['num_layers']} attention layers: {', '.join(parts)}{suffix}"


def _source_line(report: dict) -> str:
    words = [report["source"]]
    if report.get("revision"):
        words.append(f"revision {report['revision']}")
    if report.get("commit") and report.get("commit") != report.get("revision"):
        words.append(f"commit {report['commit'][:12]}")
    return ", ".join(words)


# -- escaping: strings in a report can come from a stranger's config.json -----------------------

# Markdown characters that could open raw HTML, an entity, a link, a code span, emphasis or a
# table cell; `_` is left alone (intraword underscores, as in `num_key_value_heads`, are text).
_MARKDOWN_SPECIAL = str.maketrans({character: f"\\{character}" for character in "\\`*[]<>|&~"})


def terminal_text(value) -> str:
    r"""`value` as text a terminal shows literally: control characters, ANSI escapes, bidi
    overrides and newlines become visible escapes (`\x1b`, `\u202e`, `\x0a`).

    Example:
        >>> print(terminal_text("llama\x1b[31m\u202e"))
        llama\x1b[31m\u202e
    """
    return visible(str(value))


def markdown_text(value) -> str:
    r"""`value` as markdown that renders as the same text: no raw HTML, links, code spans or
    table breaks (backslash, backtick, `*`, `[`, `]`, `<`, `>`, `|`, `&` and `~` are
    backslash-escaped), no newlines, and control characters shown as escapes.

    Example:
        >>> print(markdown_text("<b>x</b> | `y`"))
        \<b\>x\</b\> \| \`y\`
    """
    return visible(" ".join(str(value).split())).translate(_MARKDOWN_SPECIAL)


def _escaped(value, escape):
    """A copy of a report with `escape` applied to every string value (keys are ours)."""
    if isinstance(value, str):
        return escape(value)
    if isinstance(value, dict):
        return {key: _escaped(item, escape) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_escaped(item, escape) for item in value]
    return value


# -- renderers ---------------------------------------------------------------------------------


def render_table(plan, width: int = DEFAULT_WIDTH) -> str:
    """Readable aligned text within `width` columns (`text.UNLIMITED`: no wrapping): with a
    memory size, the verdict first; then the attention layout, parameters with breakdown,
    KV cache per length, memory, speed bounds and warnings.

    Example:
        >>> import keras_mha
        >>> text = render_table(keras_mha.plan("bundled:meta-llama/Meta-Llama-3-8B"))
        >>> "8,030,261,248" in text, max(len(line) for line in text.splitlines()) <= 80
        (True, True)
    """
    report = _escaped(_report(plan), terminal_text)
    attention = report["attention"]
    parameters = report["parameters"]
    rows: list[tuple[str, str]] = [
        ("source", _source_line(report)),
        ("model type", _model_type_text(report)),
        ("attention", f"{attention['kind']}: {_heads_sentence(attention)}"),
        ("layers", _layers_sentence(attention)),
        ("heads", str(attention["num_attention_heads"])),
        ("KV heads", str(attention["num_key_value_heads"])),
        ("head dim", str(attention["head_dim"])),
        ("hidden size", str(attention.get("hidden_size"))),
        ("sliding window", _sliding_text(attention)),
    ]
    if report.get("context_length"):
        rows.append(("context length", f"{report['context_length']:,}"))
    title = report["model"]
    lines = [title, "=" * min(len(title), width)]
    if report.get("source_note"):
        lines += wrap(f"note: {report['source_note']}", width, "", "  ")
    if report.get("fits"):
        lines += memory_report.fits_table_lines(report, width)[1:] + [""]
    label_width = max(len(label) for label, _ in rows)
    for label, value in rows:
        lines += wrap(value, width, f"{label:<{label_width}}  ", " " * (label_width + 4))

    lines += ["", "parameters"]
    parameter_rows = [("total", parameters["total"])]
    if parameters.get("active") is not None:
        parameter_rows.append(("active per token", parameters["active"]))
    breakdown = parameters.get("breakdown") or {}
    parameter_rows += [
        (f"  {name.replace('_', ' ')}", value)
        for name, value in breakdown.items()
        if value is not None and (value or name != "other")
    ]
    if parameters.get("vision"):
        parameter_rows.append((f"    {VISION_LABEL}", parameters["vision"]))
    name_width = max(len(name) for name, _ in parameter_rows)
    total = parameters["total"] or 0
    for name, value in parameter_rows:
        line = f"  {name:<{name_width}}  {format_count(value):>10}  {value:>17,}"
        if total and name.startswith("  "):
            line += f"  {value / total:6.1%}"
        lines.append(line)

    kv = report["kv_cache"]
    lines += ["", f"KV cache ({kv['dtype']}, batch {kv['batch']})"]
    if kv.get("applicable") is False:
        lines += wrap(f"none: {kv.get('note') or 'this model keeps no KV cache'}", width,
                      "  ", "    ")  # fmt: skip
    else:
        header = ("seq len", "per token", "total", "MHA equivalent", "saving vs MHA")
        table = [header] + [
            (
                f"{entry['seq_len']:,}",
                format_bytes(_next_token_bytes(entry)),
                format_bytes(entry["total_bytes"]),
                format_bytes(entry["mha_equivalent_bytes"]),
                _saving(entry),
            )
            for entry in report["kv_cache_by_seq_len"]
        ]
        lines += aligned(table, (True, True, True, True, False))
        lines.append(
            f"  {format_bytes(kv['total_bytes'])} = {kv['total_bytes']:,} bytes at "
            f"{kv['seq_len']:,} tokens"
        )
        for note in _kv_notes(kv):
            lines += wrap(f"note: {note}", width, "  ", "    ")
    report_without_fits = {key: value for key, value in report.items() if key != "fits"}
    lines += memory_report.memory_table_lines(report_without_fits, width)
    return "\n".join(lines + _warning_lines(report, width))


def _next_token_bytes(entry: dict) -> int:
    """What one more token adds at this length (the "per token" column), for one sequence."""
    return entry.get("marginal_bytes_per_token", entry["bytes_per_token"])


def _warning_lines(report: dict, width: int = DEFAULT_WIDTH) -> list[str]:
    if not report.get("warnings"):
        return []
    lines = ["", "warnings"]
    for warning in report["warnings"]:
        lines += wrap(warning, width, "  - ", "    ")
    return lines


def _kv_notes(kv: dict) -> list[str]:
    notes = []
    if kv.get("encoder_seq_len"):
        notes.append(
            f"includes the decoder's cross-attention cache over {kv['encoder_seq_len']:,} "
            "encoder tokens"
        )
    if kv.get("note"):
        notes.append(kv["note"])
    marginal = kv.get("marginal_bytes_per_token")
    if marginal is not None and marginal != kv["bytes_per_token"]:
        notes.append(
            f"per token is what one more token adds at that length: "
            f"{format_bytes(kv['bytes_per_token'])} while no sliding window is full, "
            f"{format_bytes(marginal)} at {kv['seq_len']:,} tokens"
        )
    return notes


def _model_type_text(report: dict) -> str:
    text = str(report["model_type"])
    if report.get("architecture"):
        text += f" ({report['architecture']})"
    if report["attention"].get("is_encoder_decoder"):
        text += ", encoder-decoder"
    return text


def _sliding_text(attention: dict) -> str:
    window = attention["sliding_window"]
    sliding_layers = attention["layer_kinds"]["sliding"]
    if window is None or not sliding_layers:
        return "none"
    return f"{window:,} tokens in {sliding_layers} layers"


def render_markdown(plan) -> str:
    """A markdown model card: summary, attention, parameters, KV cache, source and warnings.

    Example:
        >>> import keras_mha
        >>> render_markdown(keras_mha.plan("bundled:meta-llama/Meta-Llama-3-8B")).splitlines()[0]
        '# meta-llama/Meta-Llama-3-8B'
    """
    report = _escaped(_report(plan), markdown_text)
    attention = report["attention"]
    parameters = report["parameters"]
    kv = report["kv_cache"]
    lines = [f"# {report['model']}", ""]
    summary = (
        f"**{attention['kind']}** attention: {_heads_sentence(attention)}, head dim "
        f"{attention['head_dim']}, in {_layers_sentence(attention)}. "
        f"**{format_count(parameters['total'])}** parameters"
    )
    if parameters.get("active") is not None:
        summary += f" ({format_count(parameters['active'])} active per token)"
    if kv.get("applicable") is False:
        summary += "; it keeps no KV cache (encoder-only)."
    else:
        summary += (
            f"; the KV cache takes **{format_bytes(kv['total_bytes'])}** at "
            f"{kv['seq_len']:,} tokens ({kv['dtype']}, batch {kv['batch']})."
        )
    lines += [summary, ""]
    if report.get("source_note"):
        lines += [f"> Note: {report['source_note']}", ""]
    fits = memory_report.fits_markdown_lines(report)
    lines += fits[1:] + [""] if fits else []

    lines += ["## Attention", "", "| property | value |", "|---|---|"]
    attention_rows = [
        ("kind", attention["kind"]),
        ("model type", _model_type_text(report)),
        ("attention layers", attention["num_layers"]),
        ("hidden layers", attention.get("num_hidden_layers")),
        ("query heads", attention["num_attention_heads"]),
        ("key/value heads", attention["num_key_value_heads"]),
        ("head dim", attention["head_dim"]),
        ("hidden size", attention.get("hidden_size")),
        (
            "layer kinds",
            ", ".join(f"{count} {kind}" for kind, count in attention["layer_kinds"].items()),
        ),
        ("sliding window", _sliding_text(attention)),
        ("context length", format_thousands(report.get("context_length"))),
        ("vocabulary", format_thousands(report.get("vocab_size"))),
    ]
    lines += [f"| {name} | {value} |" for name, value in attention_rows]

    lines += [
        "",
        "## Parameters",
        "",
        "| part | parameters | exact | share |",
        "|---|---:|---:|---:|",
    ]
    total = parameters["total"] or 0
    lines.append(f"| **total** | **{format_count(total)}** | {total:,} | 100% |")
    if parameters.get("active") is not None:
        active = parameters["active"]
        lines.append(
            f"| active per token | {format_count(active)} | {active:,} | {active / total:.1%} |"
        )
    for name, value in (parameters.get("breakdown") or {}).items():
        if value is None or (name == "other" and not value):
            continue
        share = f"{value / total:.1%}" if total else "-"
        lines.append(f"| {name.replace('_', ' ')} | {format_count(value)} | {value:,} | {share} |")
    if parameters.get("vision"):
        vision = parameters["vision"]
        share = f"{vision / total:.1%}" if total else "-"
        lines.append(f"| {VISION_LABEL} | {format_count(vision)} | {vision:,} | {share} |")

    lines += ["", "## KV cache", ""]
    if kv.get("applicable") is False:
        lines.append(f"None: {kv.get('note') or 'this model keeps no KV cache'}.")
    else:
        lines += [
            f"{kv['dtype']}, batch {kv['batch']}; the MHA equivalent gives every query head "
            "its own keys and values.",
            "",
            "| sequence length | per token | total | MHA equivalent | saving |",
            "|---:|---:|---:|---:|---|",
        ]
        for entry in report["kv_cache_by_seq_len"]:
            lines.append(
                f"| {entry['seq_len']:,} | {format_bytes(_next_token_bytes(entry))} | "
                f"{format_bytes(entry['total_bytes'])} | "
                f"{format_bytes(entry['mha_equivalent_bytes'])} | {_saving(entry)} |"
            )
        notes = _kv_notes(kv)
        if notes:
            lines += [""] + [f"Note: {note}." for note in notes]

    lines += memory_report.memory_markdown_lines(report)
    lines += ["", "## Source", ""]
    lines.append(f"- model: `{report['model']}` ({_source_line(report)})")
    provenance = report.get("bundled_card") or {}
    if provenance.get("source"):
        lines.append(f"- numbers from: {provenance['source']}")
    if provenance.get("notes"):
        lines.append(f"- notes: {provenance['notes']}")
    if report.get("warnings"):
        lines += ["", "## Warnings", ""] + [f"- {warning}" for warning in report["warnings"]]
    lines += [
        "",
        "<sub>Generated by `keras-mha inspect --format markdown`; costs are computed from "
        "config.json alone, without downloading weights.</sub>",
        "",
    ]
    return "\n".join(wrap_markdown(lines))


def __getattr__(name):
    # context_length, default_seq_len and DEFAULT_SEQ_LEN_CAP moved to keras_mha.planning.plan
    # in 0.4, with the report's computation (build_report is `plan_config(...).to_dict()`).
    return moved_paths.moved_attribute(__name__, name)


__all__ = [
    "format_bytes",
    "format_count",
    "markdown_text",
    "render_markdown",
    "render_table",
    "terminal_text",
]
