"""The `memory` and `fits` parts of the inspect report, and how they are rendered.

`memory_entry` and `fits_entry` build the JSON-ready dicts (keys documented in the README,
"JSON output"); `memory_table_lines` and `memory_markdown_lines` render them. The formulas
live in `keras_mha.cards.planner.memory`. Pure Python: no keras, backend or numpy import.

Example:
    >>> from keras_mha.hub.config import load_config
    >>> from keras_mha.cards.spec import from_config
    >>> spec = from_config(load_config("bundled:meta-llama/Meta-Llama-3-8B").config)
    >>> entry = memory_entry(spec, batch=1, seq_len=8192, kv_dtype="bfloat16")
    >>> entry["weights_bytes"]["bfloat16"], entry["serving_bytes"] > 16060522496
    (16060522496, True)
"""

from __future__ import annotations

from dataclasses import dataclass

from keras_mha.cards.costs import ParameterCounts, parameter_counts
from keras_mha.cards.planner import memory
from keras_mha.cards.planner.gpus import GPU
from keras_mha.cards.rendering.formatting import format_bytes


@dataclass(frozen=True)
class MemoryRequest:
    """What the memory figures assume, beyond batch, length and KV dtype.

    Attributes:
        weights_dtype: serving weights (float32, bfloat16, float16, float8, int8, int4).
        prefill_chunk: tokens per prefill chunk for the serving workspace.
        optimizer: adamw, adam, sgd-momentum or sgd.
        precision: training precision: mixed (float32 master weights), bfloat16, float32.
        memory_bytes: a memory size to fit into (from `--memory` or `--gpu`), or None.
        gpu: the `GPU` row `memory_bytes` came from, or None.

    Example:
        >>> MemoryRequest().weights_dtype
        'bfloat16'
    """

    weights_dtype: str = "bfloat16"
    prefill_chunk: int = memory.DEFAULT_PREFILL_CHUNK
    optimizer: str = "adamw"
    precision: str = "mixed"
    memory_bytes: int | None = None
    gpu: GPU | None = None


def memory_entry(
    spec,
    *,
    batch: int,
    seq_len: int,
    kv_dtype: str,
    request: MemoryRequest | None = None,
    counts: ParameterCounts | None = None,
) -> dict:
    """The report's `memory` entry: weights per dtype, serving and training at the request.

    Example:
        >>> from keras_mha.hub.config import load_config
        >>> from keras_mha.cards.spec import from_config
        >>> spec = from_config(load_config("bundled:openai-community/gpt2").config)
        >>> sorted(memory_entry(spec, batch=1, seq_len=1024, kv_dtype="int8"))[:3]
        ['serving', 'serving_bytes', 'training']
    """
    request = request or MemoryRequest()
    counts = counts or parameter_counts(spec)
    by_dtype = memory.weights_bytes_by_dtype(counts)
    serving = memory.serving_memory(
        spec,
        batch=batch,
        seq_len=seq_len,
        weights_dtype=request.weights_dtype,
        kv_dtype=kv_dtype,
        prefill_chunk=request.prefill_chunk,
        counts=counts,
    )
    training = memory.training_memory(
        spec,
        batch=batch,
        seq_len=seq_len,
        optimizer=request.optimizer,
        precision=request.precision,
        counts=counts,
    )
    return {
        "weights_bytes": {dtype: weights.total for dtype, weights in by_dtype.items()},
        "weights_bytes_by_part": {dtype: weights.by_part for dtype, weights in by_dtype.items()},
        "weights_scale_bytes": {dtype: weights.scale_bytes for dtype, weights in by_dtype.items()},
        "serving_bytes": serving.total_bytes,
        "serving": serving.as_dict(),
        "training_bytes": training.total_bytes,
        "training_bytes_checkpointed": training.total_bytes_checkpointed,
        "training": training.as_dict(),
    }


def fits_entry(
    spec,
    *,
    batch: int,
    seq_len: int,
    kv_dtype: str,
    request: MemoryRequest,
    context_length: int | None = None,
    counts: ParameterCounts | None = None,
) -> dict:
    """The report's `fits` entry for `request.memory_bytes` (see `memory.plan_fit`).

    Besides `FitPlan`'s fields: `gpu` (the table's name or None), `gpu_memory_source`,
    `context_length`, and `max_seq_len_unbounded` (True when `max_seq_len` is None).

    Example:
        >>> from keras_mha.hub.config import load_config
        >>> from keras_mha.cards.spec import from_config
        >>> spec = from_config(load_config("bundled:openai-community/gpt2").config)
        >>> fits = fits_entry(spec, batch=1, seq_len=1024, kv_dtype="bfloat16",
        ...                   request=MemoryRequest(memory_bytes=2**30))
        >>> fits["training_fits"], fits["max_batch"]
        (False, 20)
    """
    plan = memory.plan_fit(
        spec,
        memory_bytes=request.memory_bytes,
        batch=batch,
        seq_len=seq_len,
        weights_dtype=request.weights_dtype,
        kv_dtype=kv_dtype,
        prefill_chunk=request.prefill_chunk,
        optimizer=request.optimizer,
        precision=request.precision,
        counts=counts,
    )
    entry = {
        "memory_bytes": plan.memory_bytes,
        "max_seq_len": plan.max_seq_len,
        "max_batch": plan.max_batch,
        "training_fits": plan.training_fits,
    }
    for key, value in plan.as_dict().items():
        entry.setdefault(key, value)
    entry["max_seq_len_unbounded"] = plan.max_seq_len is None
    entry["context_length"] = context_length
    entry["gpu"] = request.gpu.name if request.gpu else None
    entry["gpu_memory_source"] = request.gpu.source if request.gpu else None
    return entry


def fits_warnings(report: dict) -> list[str]:
    """Warnings about what does not fit, with the numbers (for the report's `warnings`).

    Example:
        >>> fits_warnings({"fits": {"weights_fit": False, "memory_bytes": 2**30,
        ...     "weights_dtype": "bfloat16", "gpu": None}, "memory": {"weights_bytes":
        ...     {"bfloat16": 2**31, "int4": 2**29}}})[0][:62]
        'the weights alone need 2.00 GiB in bfloat16, more than the 1.0'
    """
    fits = report.get("fits")
    if not fits or fits["weights_fit"]:
        return []
    weights = report["memory"]["weights_bytes"]
    needed = weights[fits["weights_dtype"]]
    smaller = [
        f"{dtype} {format_bytes(size)}"
        for dtype, size in weights.items()
        if size <= fits["memory_bytes"] and dtype != fits["weights_dtype"]
    ]
    hint = (
        f"; in {', '.join(smaller)} they would fit (--weights-dtype)"
        if smaller
        else "; no weight dtype fits"
    )
    return [
        f"the weights alone need {format_bytes(needed)} in {fits['weights_dtype']}, more than the "
        f"{format_bytes(fits['memory_bytes'])} of {_memory_name(fits)}: nothing fits{hint}"
    ]


# -- rendering ----------------------------------------------------------------------------------


def _memory_name(fits: dict) -> str:
    return f"the {fits['gpu']}" if fits.get("gpu") else "--memory"


def _length(value, fits: dict) -> str:
    if value is None:
        return "unbounded by memory"
    context = fits.get("context_length")
    return f"{value:,}" + (" (!)" if context and value > context else "")


def _count(value) -> str:
    return "unbounded" if value is None else f"{value:,}"


# Columns of the weights-by-part table: (part of `parameter_counts`, table heading).
_WEIGHT_PARTS = (
    ("embeddings", "embeddings"),
    ("attention", "attention"),
    ("mlp", "mlp/experts"),
    ("norms", "norms"),
    ("lm_head", "lm head"),
    ("other", "other"),
)
QUANTIZATION_NOTE = (
    "int8/int4 count one float16 scale per 128 weights, float8 one float32 scale per "
    "128x128 block; embeddings, norms and the LM head stay bfloat16."
)


def _weights_table_lines(entry: dict) -> list[str]:
    """Weights per dtype, in total and per part (the `other` column only when used)."""
    by_part = entry["weights_bytes_by_part"]
    parts = [
        (part, heading)
        for part, heading in _WEIGHT_PARTS
        if part != "other" or any(sizes["other"] for sizes in by_part.values())
    ]
    table = [("weights", "total", *(heading for _, heading in parts))]
    for dtype, total in entry["weights_bytes"].items():
        sizes = by_part[dtype]
        table.append(
            (dtype, format_bytes(total), *(format_bytes(sizes[part]) for part, _ in parts))
        )
    widths = [max(len(row[column]) for row in table) for column in range(len(table[0]))]
    lines = []
    for row in table:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        lines.append("  " + "  ".join(cells))
    return lines + [f"  ({QUANTIZATION_NOTE})"]


def _summary_rows(report: dict) -> list[tuple[str, str]]:
    entry = report["memory"]
    serving, training = entry["serving"], entry["training"]
    rows = [
        (
            f"serving ({serving['weights_dtype']} weights, {serving['kv_dtype']} KV)",
            f"{format_bytes(serving['total_bytes'])} = "
            f"weights {format_bytes(serving['weights_bytes'])}"
            f" + KV cache {format_bytes(serving['kv_cache_bytes'])}"
            + (
                f" + recurrent state {format_bytes(serving['recurrent_state_bytes'])}"
                if serving["recurrent_state_bytes"]
                else ""
            )
            + f" + prefill workspace {format_bytes(serving['activation_bytes'])}",
        ),
        (
            f"training ({training['optimizer']}, {training['precision']})",
            f"{format_bytes(training['total_bytes'])} = "
            f"weights {format_bytes(training['weights_bytes'])}"
            + (
                f" + float32 master weights {format_bytes(training['master_weights_bytes'])}"
                if training["master_weights_bytes"]
                else ""
            )
            + f" + gradients {format_bytes(training['gradient_bytes'])} + optimizer "
            f"{format_bytes(training['optimizer_bytes'])} + activations "
            f"{format_bytes(training['activation_bytes'])}",
        ),
        (
            "  with checkpointing",
            f"{format_bytes(training['total_bytes_checkpointed'])} (activations "
            f"{format_bytes(training['activation_bytes_checkpointed'])})",
        ),
    ]
    return rows


def _fits_title(report: dict) -> str:
    fits = report["fits"]
    where = fits["gpu"] or "--memory"
    return (
        f"fits in {where}: {format_bytes(fits['memory_bytes'])} = {fits['memory_bytes']:,} bytes "
        f"({fits['weights_dtype']} weights, batch {fits['batch']}, {fits['seq_len']:,} tokens)"
    )


def _fits_rows(report: dict) -> list[tuple[str, str, str, str]]:
    fits = report["fits"]
    rows = []
    for dtype, values in fits["by_kv_dtype"].items():
        marker = " *" if dtype == fits["kv_dtype"] else ""
        rows.append(
            (
                f"{dtype}{marker}",
                format_bytes(values["serving_bytes"]),
                _length(values["max_seq_len"], fits),
                _count(values["max_batch"]),
            )
        )
    return rows


def _training_verdict(fits: dict) -> str:
    def verdict(fit: bool) -> str:
        return "fits" if fit else "does not fit"

    return (
        f"{verdict(fits['training_fits'])} ({format_bytes(fits['training_bytes'])}); with "
        f"activation checkpointing {verdict(fits['training_fits_checkpointed'])} "
        f"({format_bytes(fits['training_bytes_checkpointed'])})"
    )


def _fits_notes(fits: dict) -> list[str]:
    context = fits.get("context_length")
    lengths = [values["max_seq_len"] for values in fits["by_kv_dtype"].values()]
    notes = []
    if context and any(length is not None and length > context for length in lengths):
        notes.append(
            f"(!) beyond the model's context length ({context:,} tokens): memory would allow "
            "it, the model was not trained for it"
        )
    if any(length is None for length in lengths):
        notes.append(
            "unbounded by memory: the KV cache stops growing (every attention layer has a "
            "sliding window), so memory never limits the context"
        )
    return notes


def memory_table_lines(report: dict) -> list[str]:
    """The memory (and fits) section of the text report.

    Example:
        >>> from keras_mha.hub.config import load_config
        >>> from keras_mha.cards.spec import from_config
        >>> spec = from_config(load_config("bundled:openai-community/gpt2").config)
        >>> report = {"memory": memory_entry(spec, batch=1, seq_len=1024, kv_dtype="int8")}
        >>> memory_table_lines(report)[1].startswith("memory (batch 1, 1,024 tokens)")
        True
    """
    if "memory" not in report:
        return []
    entry = report["memory"]
    serving = entry["serving"]
    lines = ["", f"memory (batch {serving['batch']}, {serving['seq_len']:,} tokens)"]
    lines += _weights_table_lines(entry)
    rows = _summary_rows(report)
    width = max(len(label) for label, _ in rows)
    lines += [f"  {label:<{width}}  {value}" for label, value in rows]
    if report.get("fits"):
        fits = report["fits"]
        lines += ["", _fits_title(report)]
        header = ("KV dtype", "serving", "max context at batch", "max batch at context")
        table = [header] + _fits_rows(report)
        widths = [max(len(row[column]) for row in table) for column in range(4)]
        for row in table:
            lines.append(
                "  "
                + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            )
        lines.append(f"  training: {_training_verdict(fits)}")
        lines += [f"  {note}" for note in _fits_notes(fits)]
        lines.append(
            f"  (* the requested KV dtype; batch {fits['batch']}, context {fits['seq_len']:,})"
        )
    return lines


def memory_markdown_lines(report: dict) -> list[str]:
    """The memory (and fits) section of the markdown card.

    Example:
        >>> from keras_mha.hub.config import load_config
        >>> from keras_mha.cards.spec import from_config
        >>> spec = from_config(load_config("bundled:openai-community/gpt2").config)
        >>> report = {"memory": memory_entry(spec, batch=1, seq_len=1024, kv_dtype="int8")}
        >>> memory_markdown_lines(report)[1]
        '## Memory'
    """
    if "memory" not in report:
        return []
    entry = report["memory"]
    serving = entry["serving"]
    lines = [
        "",
        "## Memory",
        "",
        "| weights dtype | total | embeddings | attention | MLP | norms | LM head | other |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for dtype, size in entry["weights_bytes"].items():
        parts = entry["weights_bytes_by_part"][dtype]
        lines.append(
            f"| {dtype} | {format_bytes(size)} | {format_bytes(parts['embeddings'])} | "
            f"{format_bytes(parts['attention'])} | {format_bytes(parts['mlp'])} | "
            f"{format_bytes(parts['norms'])} | {format_bytes(parts['lm_head'])} | "
            f"{format_bytes(parts['other'])} |"
        )
    lines += [
        "",
        f"At batch {serving['batch']} and {serving['seq_len']:,} tokens:",
        "",
    ]
    lines += [f"- {label.strip()}: {value}" for label, value in _summary_rows(report)]
    lines += ["", QUANTIZATION_NOTE]
    if report.get("fits"):
        fits = report["fits"]
        lines += [
            "",
            f"### {_fits_title(report)[0].upper()}{_fits_title(report)[1:]}",
            "",
            "| KV dtype | serving | max context at batch | max batch at context |",
            "|---|---:|---:|---:|",
        ]
        for row in _fits_rows(report):
            dtype = row[0].removesuffix(" *")
            cell = f"**{dtype}** (requested)" if row[0].endswith(" *") else dtype
            lines.append(f"| {' | '.join((cell, *row[1:]))} |")
        lines += ["", f"Training: {_training_verdict(fits)}."]
        lines += [line for note in _fits_notes(fits) for line in ("", note)]
    return lines


__all__ = [
    "MemoryRequest",
    "fits_entry",
    "fits_warnings",
    "memory_entry",
    "memory_markdown_lines",
    "memory_table_lines",
]
