"""The figures of `keras-mha convert` and their rendering (table, JSON, markdown).

Keys of `--format json` (all sizes in bytes, times in seconds):

- `kv_heads`: `{"before", "after"}` per layer; `num_attention_heads`, `num_layers`.
- `kv_cache`: from the cost model (`keras_mha.planning.costs.kv_cache_cost`) for the
  source model and for the converted Keras model (`describes`: "keras_model"):
  `{"dtype", "context_length", "applicable", "note", "describes", "before":
  {"bytes_per_token", "bytes_at_context"}, "after": {...}}` (encoders keep no cache:
  `applicable` false, zeros). Every column of the report describes the Keras model the
  command produced; the written checkpoint holds the same heads (`export`), else the
  report says which it describes.
- `parameters`: `{"before", "after"}`, `count_params()` of the Keras model.
- `quality`: `{"metric": "perplexity" | "embedding_cosine", "original", "converted",
  "uptrained"}` on the held-out text (null without `--data`; `uptrained` null without
  `--steps`). Embedding cosine is the mean over held-out sentences of the cosine to
  the original model's embedding (1.0 for the original itself).
- `uptraining`: null, or `{"steps", "batch_size", "learning_rate", "objective",
  "loss_first", "loss_last", "teacher_bytes"}`.
- `data`: null, or `{"file", "tokens", "train_examples", "held_out_examples",
  "sequence_length", "limit"}` (`limit`: null, or why fewer examples were read than the
  text holds, `keras_mha.data.text.most_examples`).
- `seconds`: `{"load", "measure", "convert", "uptrain", "export", "total"}`.
- `export`: what was written (`format` "hub" or "keras"; for "keras", `reason`).

Example:
    >>> print(render_table(report))  # doctest: +SKIP
"""

from __future__ import annotations

from keras_mha.planning.render.formatting import format_bytes
from keras_mha.planning.render.report import markdown_text, terminal_text
from keras_mha.planning.render.text import DEFAULT_WIDTH, wrap

QUALITY_LABELS = {
    "perplexity": "perplexity (held out)",
    "embedding_cosine": "embedding cosine to original (held out)",
}
OBJECTIVE_LABELS = {
    "next_token": "next-token loss",
    "distill_kl": "KL divergence from the original's next-token distribution",
    "distill_cosine": "cosine to the original's sentence embeddings",
}


def kv_cache_figures(config, num_key_value_heads, *, kv_dtype):
    """The cost model's KV cache of `config`'s model, and of the same model holding
    `num_key_value_heads` KV heads per layer (the converted Keras model).

    The "after" figures come from the source's `ModelSpec` with its KV heads replaced,
    not from a config stating them: the configs of GPT-2, BERT and GPT-NeoX cannot state
    fewer KV heads than query heads, and reading one back would give the original size.

    Returns the report's `kv_cache` entry: bytes per token and at the model's context
    length (its config's, else `keras_mha.planning.plan.default_seq_len`), batch 1.

    Example:
        >>> gpt2 = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2,
        ...         "vocab_size": 100, "n_positions": 32}
        >>> figures = kv_cache_figures(gpt2, 1, kv_dtype="float32")
        >>> figures["before"]["bytes_per_token"], figures["after"]["bytes_per_token"]
        (1024, 256)
    """
    import dataclasses

    from keras_mha.planning.plan import context_length, default_seq_len, plan_config
    from keras_mha.planning.spec import from_config

    before = from_config(config)
    heads = before.attention.num_attention_heads
    kind = "MHA" if num_key_value_heads == heads else "MQA" if num_key_value_heads == 1 else "GQA"
    attention = dataclasses.replace(
        before.attention, num_key_value_heads=int(num_key_value_heads), attention_kind=kind
    )
    after = dataclasses.replace(before, attention=attention)
    entry = {"dtype": kv_dtype, "describes": "keras_model"}
    for when, spec in (("before", before), ("after", after)):
        context = context_length(spec) or default_seq_len(spec)
        # The plan of `inspect` and `keras_mha.plan`, at the model's context length.
        plan = plan_config(config, seq_lens=[context], kv_dtype=kv_dtype, spec=spec)
        cost = plan.kv_caches[-1].cost
        entry.update(context_length=context, applicable=cost.applicable, note=cost.note)
        entry[when] = {
            "bytes_per_token": cost.bytes_per_token,
            "bytes_at_context": cost.total_bytes,
        }
    return entry


def _seconds(value):
    return "—" if value is None else f"{value:,.1f} s"


def _rows(report):
    """`(label, original, converted, uptrained)` text rows."""
    from keras_mha.planning.render.formatting import format_number

    uptrained = report["uptraining"] is not None
    kv, cache, quality = report["kv_heads"], report["kv_cache"], report["quality"]
    rows = [
        (
            "KV heads per layer",
            format_number(kv["before"]),
            format_number(kv["after"]),
            format_number(kv["after"]),
        )
    ]
    if cache["applicable"]:
        for label, key in (
            (f"KV cache / token ({cache['dtype']}, Keras model)", "bytes_per_token"),
            (f"KV cache at {cache['context_length']:,} tokens", "bytes_at_context"),
        ):
            after = format_bytes(cache["after"][key])
            rows.append((label, format_bytes(cache["before"][key]), after, after))
    parameters = report["parameters"]
    rows.append(
        (
            "parameters (Keras model)",
            format_number(parameters["before"]),
            format_number(parameters["after"]),
            format_number(parameters["after"]),
        )
    )
    if quality is not None:
        digits = 3 if quality["metric"] == "perplexity" else 4
        rows.append(
            (
                QUALITY_LABELS[quality["metric"]],
                format_number(quality["original"], digits),
                format_number(quality["converted"], digits),
                format_number(quality["uptrained"], digits),
            )
        )
    seconds = report["seconds"]
    rows.append(("time", "—", _seconds(seconds["convert"]), _seconds(seconds["uptrain"])))
    if not uptrained:
        rows = [row[:3] for row in rows]
    return rows


def _header(report):
    return ("", "original", "converted", "uptrained")[: 4 if report["uptraining"] else 3]


def _summary_lines(report, text):
    kv = report["kv_heads"]
    lines = [
        f"{text(report['source'])}: {kv['before']} -> {kv['after']} KV heads per layer "
        f"({report['num_layers']} layers of {report['num_attention_heads']} query heads; method "
        f"{report['method']}; {report['backend']} backend, {report['dtype']})"
    ]
    data = report["data"]
    if data:
        unit = "windows" if report["architecture"] == "decoder" else "sentences"
        lines.append(
            f"data: {text(data['file'])}: {data['tokens']:,} tokens, {data['train_examples']} "
            f"{unit} to uptrain on, {data['held_out_examples']} held out"
            + (f" ({text(data['limit'])})" if data.get("limit") else "")
        )
    uptraining = report["uptraining"]
    if uptraining:
        teacher = (
            f"; the frozen original held {format_bytes(uptraining['teacher_bytes'])} more"
            if uptraining["teacher_bytes"]
            else ""
        )
        lines.append(
            f"uptraining: {uptraining['steps']} steps of {uptraining['batch_size']}, "
            f"{OBJECTIVE_LABELS[uptraining['objective']]}, AdamW peak learning rate "
            f"{uptraining['learning_rate']:g}; loss {uptraining['loss_first']:.4g} -> "
            f"{uptraining['loss_last']:.4g}{teacher}"
        )
    if not report["kv_cache"]["applicable"]:
        lines.append(f"KV cache: {text(report['kv_cache']['note'])}")
    return lines


def _time_line(report):
    seconds = report["seconds"]
    return (
        f"total time {seconds['total']:,.1f} s (loading {seconds['load']:,.1f} s, measuring "
        f"{seconds['measure']:,.1f} s, writing {seconds['export']:,.1f} s)"
    )


def _export_line(report, text):
    export = report["export"]
    if export["format"] == "keras":
        return f"wrote {text(export['path'])}/model.keras ({text(export['reason'])})"
    line = (
        f"wrote {text(export['path'])}: {', '.join(text(name) for name in export['files'])} "
        f"(num_attention_heads={export['num_attention_heads']}, "
        f"num_key_value_heads={export['num_key_value_heads']})"
    )
    if export["num_key_value_heads"] != report["kv_heads"]["after"]:
        line += (
            f"; the figures above describe the Keras model, of {report['kv_heads']['after']} "
            "KV heads per layer"
        )
    return line


def render_table(report, width=DEFAULT_WIDTH) -> str:
    """The report as aligned text (what `--format table` prints); its sentences wrap within
    `width` columns (`UNLIMITED`: `--wide`), continued two spaces in.

    Example:
        >>> print(render_table(report))  # doctest: +SKIP
    """
    rows = _rows(report)
    header = _header(report)
    widths = [max(len(row[i]) for row in (*rows, header)) for i in range(len(header))]

    def line(cells):
        return "  ".join(
            cell.ljust(width) if index == 0 else cell.rjust(width)
            for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    lines = [
        part
        for text in _summary_lines(report, terminal_text)
        for part in wrap(text, width, "", "  ")
    ]
    lines += ["", line(header), *(line(row) for row in rows), ""]
    lines += wrap(_time_line(report), width, "", "  ")
    lines += wrap(_export_line(report, terminal_text), width, "", "  ")
    return "\n".join(lines)


def render_markdown(report) -> str:
    """The report as a markdown paragraph and table (what `--format markdown` prints).

    Example:
        >>> print(render_markdown(report))  # doctest: +SKIP
    """
    header = _header(report)
    lines = [f"{line}  " for line in _summary_lines(report, markdown_text)]
    lines += [
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(report)]
    lines += [
        "",
        f"{_time_line(report)}. {_export_line(report, markdown_text)}.",
    ]
    return "\n".join(lines)
