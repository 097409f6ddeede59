"""The planner's part of the inspect report rendered: `memory` (one device holding the
whole model), `fits` (what fits on the chosen devices, verdict first) and `speed_bounds`,
as text or markdown, from the JSON form of a `Plan` (`keras_mha.planning.plan`).

Keys are documented in docs/reference/json.md. Pure Python: no keras, backend or numpy
import.

Example:
    >>> import keras_mha
    >>> fits = keras_mha.plan("bundled:meta-llama/Meta-Llama-3-8B", gpu="H100").to_dict()["fits"]
    >>> verdict(fits) == fits["verdict"]
    True
"""

from __future__ import annotations

from keras_mha import moved_paths
from keras_mha.planning.kv_formats import kv_format
from keras_mha.planning.render.formatting import (
    format_bandwidth,
    format_bytes,
    format_flops,
    format_rate,
    format_seconds,
)
from keras_mha.planning.render.text import UNLIMITED, aligned, wrap
from keras_mha.planning.weight_formats import PLANNER_FORMATS, weight_format

# -- the verdict ----------------------------------------------------------------------------------


def _where(fits: dict) -> str:
    devices = fits.get("devices") or {}
    name = devices.get("name") or fits.get("gpu") or format_bytes(fits["memory_bytes"])
    tensor, pipeline = devices.get("tensor_parallel", 1), devices.get("pipeline_parallel", 1)
    if pipeline > 1:
        return f"{name} (tensor parallel {tensor} x {pipeline} pipeline stages)"
    return name


def _length(value, fits: dict) -> str:
    if value is None:
        return "unbounded by memory"
    context = fits.get("context_length")
    return f"{value:,}" + (" (!)" if context and value > context else "")


def _count(value) -> str:
    return "unbounded" if value is None else f"{value:,}"


def suggestion_text(suggestion: dict, fits: dict) -> str:
    """`int4 weights` or `4x H100 80GB SXM` (what one suggestion changes).

    Example:
        >>> suggestion_text({"weights_dtype": "int4", "devices": 1, "tensor_parallel": 1,
        ...     "pipeline_parallel": 1}, {"weights_dtype": "bfloat16", "devices": {"count": 1}})
        'in int4'
    """
    if suggestion["weights_dtype"] != fits["weights_dtype"]:
        return f"in {suggestion['weights_dtype']}"
    name = (fits.get("gpu") or format_bytes(fits.get("device_memory_bytes", 0))).strip()
    text = f"on {suggestion['devices']}x {name}"
    if suggestion["pipeline_parallel"] > 1:
        text += f" ({suggestion['pipeline_parallel']} pipeline stages)"
    return text


def verdict(fits: dict) -> str:
    """The answer in one sentence, e.g. `serving fits: yes, its whole 8,192-token context at
    batch 1 on H100 80GB SXM (bfloat16 weights, bfloat16 KV); the memory would hold 463,088
    tokens, more than the model can use`: what the model can use, then what memory holds.

    Example:
        >>> verdict({"serving_fits": False, "weights_fit": False, "weights_bytes": 2**31,
        ...     "memory_bytes": 2**30, "weights_dtype": "bfloat16", "kv_dtype": "bfloat16",
        ...     "batch": 1, "seq_len": 8, "serving_bytes": 2**31, "suggestions": []})
        'serving does not fit: the weights need 2.00 GiB per device, 1.00 GiB is usable'
    """
    what = f"({fits['weights_dtype']} weights, {fits['kv_dtype']} KV)"
    if fits["serving_fits"]:
        memory, context = fits["max_seq_len"], fits.get("context_length")
        beyond = ""
        if memory is None:
            length = "a context unbounded by memory"
        elif context and memory > context:
            # Say what the model can use first; what memory would hold is not a promise.
            length = f"its whole {context:,}-token context"
            beyond = f"; the memory would hold {memory:,} tokens, more than the model can use"
        elif context:
            length = f"up to {memory:,} tokens of its {context:,}-token context"
        else:
            length = f"up to {memory:,} tokens"
        return (
            f"serving fits: yes, {length} at batch {fits['batch']:,} on {_where(fits)} "
            f"{what}{beyond}"
        )
    if not fits["weights_fit"]:
        text = (
            f"serving does not fit: the weights need {format_bytes(fits['weights_bytes'])} per "
            f"device, {format_bytes(fits['memory_bytes'])} is usable"
        )
    else:
        text = (
            f"serving does not fit at batch {fits['batch']:,} x {fits['seq_len']:,} tokens: it "
            f"needs {format_bytes(fits['serving_bytes'])} per device, "
            f"{format_bytes(fits['memory_bytes'])} is usable; up to "
            f"{_length(fits['max_seq_len'], fits)} tokens fit at batch "
            f"{fits['batch']:,}"
        )
    found = fits.get("suggestions", [])
    dtypes = [
        item["weights_dtype"] + (" (plan only)" if _plan_only(item["weights_dtype"]) else "")
        for item in found
        if item["weights_dtype"] != fits["weights_dtype"]
    ]
    alternatives = [f"in {_either(dtypes)} weights"] if dtypes else []
    alternatives += [suggestion_text(item, fits) for item in found if item["weights_dtype"]
                     == fits["weights_dtype"]]  # fmt: skip
    if alternatives:
        text += f"; it would fit {_either(alternatives, ', or ')}"
    return text


def _plan_only(weights_dtype: str) -> bool:
    return weights_dtype in PLANNER_FORMATS and weight_format(weights_dtype).plan_only


def _either(items: list[str], last: str = " or ") -> str:
    """`a`, `a or b`, `a, b or c`."""
    if len(items) < 2:
        return "".join(items)
    return ", ".join(items[:-1]) + last + items[-1]


def _training_verdict(fits: dict) -> str:
    def verdict_word(fit: bool) -> str:
        return "fits" if fit else "does not fit"

    devices = (fits.get("devices") or {}).get("count", 1)
    per = " per device" if devices > 1 else ""
    how = f"fully sharded over {devices} devices, " if devices > 1 else ""
    return (
        f"{how}{verdict_word(fits['training_fits'])} "
        f"({format_bytes(fits['training_bytes'])}{per}); "
        f"with activation checkpointing {verdict_word(fits['training_fits_checkpointed'])} "
        f"({format_bytes(fits['training_bytes_checkpointed'])}{per})"
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
    plan_only = [dtype for dtype in fits["by_kv_dtype"] if kv_format(dtype).runtime_dtype is None]
    if plan_only:
        notes.append(
            f"{_either(plan_only)} KV: plan only, keras-mha's runtime cannot store it; int8 "
            "and float8 KV carry a scale per token and KV head (counted)"
        )
    return notes


def _budget_line(fits: dict) -> str:
    share = fits.get("memory_utilization", 1.0)
    device = fits.get("device_memory_bytes", fits["memory_bytes"])
    source = f", {fits['gpu_memory_source']}" if fits.get("gpu_memory_source") else ""
    return (
        f"per device: {format_bytes(fits['memory_bytes'])} usable = {share:.0%} of "
        f"{format_bytes(device)}{source}"
    )


# -- text ---------------------------------------------------------------------------------------

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
    "int8: a scale per output column; int4: a scale and a zero point per 128 inputs of each "
    "column (Keras's schemes: the bytes model.quantize allocates); float8: a float32 scale "
    "per 128x128 block, plan only (Keras's float8 keeps float kernels); embeddings, norms, "
    "biases, routers and the LM head stay bfloat16."
)


def _weights_rows(entry: dict, width: int) -> list[tuple[str, ...]]:
    by_part = entry["weights_bytes_by_part"]
    checkpoint = entry["weights_format"]
    parts = [
        (part, heading)
        for part, heading in _WEIGHT_PARTS
        if part != "other" or any(sizes["other"] for sizes in by_part.values())
    ]
    if width < 90:  # the narrow table: total and the two largest parts
        parts = [(part, heading) for part, heading in parts if part in ("attention", "mlp")]
    rows = [("weights", "total", *(heading for _, heading in parts))]
    for dtype, total in entry["weights_bytes"].items():
        sizes = by_part[dtype]
        rows.append((dtype, format_bytes(total), *(format_bytes(sizes[part]) for part, _ in parts)))
    if checkpoint["id"] not in entry["weights_bytes"]:
        sizes = checkpoint["by_part"]
        rows.append(
            (
                checkpoint["id"],
                format_bytes(checkpoint["bytes"]),
                *(format_bytes(sizes[part]) for part, _ in parts),
            )
        )
    return rows


def _summary_lines(report: dict, width: int) -> list[str]:
    entry = report["memory"]
    serving, training = entry["serving"], entry["training"]
    serving_parts = (
        f"weights {format_bytes(serving['weights_bytes'])} + KV cache "
        f"{format_bytes(serving['kv_cache_bytes'])}"
        + (
            f" + recurrent state {format_bytes(serving['recurrent_state_bytes'])}"
            if serving["recurrent_state_bytes"]
            else ""
        )
        + f" + prefill workspace {format_bytes(serving['activation_bytes'])}"
    )
    training_parts = f"weights {format_bytes(training['weights_bytes'])}" + (
        f" + float32 master weights {format_bytes(training['master_weights_bytes'])}"
        if training["master_weights_bytes"]
        else ""
    ) + (
        f" + gradients {format_bytes(training['gradient_bytes'])} + optimizer "
        f"{format_bytes(training['optimizer_bytes'])} + activations "
        f"{format_bytes(training['activation_bytes'])}"
    )  # fmt: skip
    rows = (
        (f"serving ({serving['weights_dtype']} weights, {serving['kv_dtype']} KV)",
         format_bytes(serving["total_bytes"]), serving_parts),
        (f"training ({training['optimizer']}, {training['precision']})",
         format_bytes(training["total_bytes"]), training_parts),
    )  # fmt: skip
    label_width = max(len(label) for label, _, _ in rows)
    lines = []
    for label, total, parts in rows:
        if width >= UNLIMITED:
            lines.append(f"  {label:<{label_width}}  {total} = {parts}")
        else:
            lines.append(f"  {label:<{label_width}}  {total}")
            lines += wrap(f"= {parts}", width, "      ", "        ")
    checkpointed = (
        f"{format_bytes(training['total_bytes_checkpointed'])} (activations "
        f"{format_bytes(training['activation_bytes_checkpointed'])})"
    )
    lines += wrap(checkpointed, width, f"  {'  with checkpointing':<{label_width}}  ", " " * 8)
    return lines


def format_lines(report: dict, width: int) -> list[str]:
    """Where the plan's weights format comes from, and its notes."""
    checkpoint = report["memory"]["weights_format"]
    origin = "the checkpoint's format" if checkpoint["from_checkpoint"] else "--weights-dtype"
    text = (
        f"weights as {checkpoint['id']} ({origin}): {checkpoint['label']}; "
        f"{format_bytes(checkpoint['bytes'])}"
    )
    files = report["memory"].get("checkpoint_bytes")
    if files:
        share = files["bytes"] / checkpoint["bytes"] if checkpoint["bytes"] else 0
        text += (
            f"; the checkpoint's files hold {format_bytes(files['bytes'])} of tensors "
            f"({files['source']}; {share:.1%} of the computed figure)"
        )
    return wrap(text, width, "  ", "    ")


def memory_table_lines(report: dict, width: int = 80) -> list[str]:
    """The memory (and fits and speed) section of the text report, within `width` columns.

    Example:
        >>> import keras_mha
        >>> report = keras_mha.plan("bundled:openai-community/gpt2", kv_dtype="int8").to_dict()
        >>> memory_table_lines(report)[1].startswith("memory (batch 1, 1,024 tokens")
        True
    """
    if "memory" not in report:
        return []
    entry = report["memory"]
    serving = entry["serving"]
    lines = []
    if report.get("fits"):
        lines += fits_table_lines(report, width)
    lines += ["", f"memory (batch {serving['batch']}, {serving['seq_len']:,} tokens, one device)"]
    rows = _weights_rows(entry, width)
    lines += aligned(rows, (False,) + (True,) * (len(rows[0]) - 1))
    lines += wrap(QUANTIZATION_NOTE, width, "  (", "   ")
    lines[-1] += ")"
    lines += format_lines(report, width)
    lines += _summary_lines(report, width)
    if report.get("speed_bounds"):
        lines += speed_table_lines(report["speed_bounds"], width)
    return lines


def fits_table_lines(report: dict, width: int = 80) -> list[str]:
    """The fits block: the verdict first, then the per-device budget, the table per KV
    dtype, training and notes.

    Example:
        >>> import keras_mha
        >>> report = keras_mha.plan("bundled:openai-community/gpt2", memory="1GiB").to_dict()
        >>> fits_table_lines(report, 80)[1].startswith("serving fits: yes")
        True
    """
    fits = report["fits"]
    lines = [""] + wrap(fits["verdict"], width, "", "  ")
    lines += wrap(_budget_line(fits), width, "  ", "    ")
    header = ("KV dtype", "serving", "max context", "max batch")
    if width >= UNLIMITED:
        header = ("KV dtype", "serving", "max context at batch", "max batch at context")
    rows = [header]
    for dtype, values in fits["by_kv_dtype"].items():
        marker = " *" if dtype == fits["kv_dtype"] else ""
        max_seq_len, max_batch = values["max_seq_len"], values["max_batch"]
        serving = format_bytes(values["serving_bytes"])
        rows.append((f"{dtype}{marker}", serving, _length(max_seq_len, fits), _count(max_batch)))
    lines += aligned(rows, (False, True, True, True))
    lines += wrap(
        f"(* the requested KV dtype; max context at batch {fits['batch']:,}, max batch at "
        f"{fits['seq_len']:,} tokens; per device)",
        width,
        "  ",
        "   ",
    )
    lines += wrap(f"training: {_training_verdict(fits)}", width, "  ", "    ")
    for note in _fits_notes(fits):
        lines += wrap(note, width, "  ", "    ")
    return lines


def speed_table_lines(bounds: dict, width: int = 80) -> list[str]:
    """The speed bounds, labelled as upper bounds.

    Example:
        >>> import keras_mha
        >>> report = keras_mha.plan("bundled:meta-llama/Meta-Llama-3-8B", gpu="H100").to_dict()
        >>> speed_table_lines(report["speed_bounds"])[1]
        'speed on H100 80GB SXM: upper bounds from memory bandwidth and peak FLOPS'
    """
    devices = bounds["devices"]
    name = f"{devices}x {bounds['gpu']}" if devices > 1 else bounds["gpu"]
    decode = (
        f"decode: at most {format_rate(bounds['decode_tokens_per_s'])} at batch "
        f"{bounds['batch']:,} ({format_rate(bounds['decode_tokens_per_s_per_sequence'])} per "
        f"sequence) with {bounds['seq_len']:,} tokens of context; limited by "
        f"{bounds['decode_limited_by']}: {format_bytes(bounds['decode_bytes_per_step'])} read per "
        f"step per device at {format_bandwidth(bounds['bandwidth_bytes_per_s'])}"
    )
    prefill = (
        f"prefill (time to first token): at least {format_seconds(bounds['prefill_seconds'])} "
        f"for {bounds['batch']:,} prompt(s) of {bounds['seq_len']:,} tokens: "
        f"{bounds['prefill_flops'] / 1e12:,.1f} TFLOP at {format_flops(bounds['peak_flops'])} "
        f"{bounds['peak_dtype']} (dense) per device"
    )
    lines = ["", f"speed on {name}: upper bounds from memory bandwidth and peak FLOPS"]
    lines += wrap(decode, width, "  ", "    ")
    lines += wrap(prefill, width, "  ", "    ")
    return lines


# -- markdown -------------------------------------------------------------------------------------


def memory_markdown_lines(report: dict) -> list[str]:
    """The memory and speed sections of the markdown card (`fits_markdown_lines` is the
    "Will it fit?" section, placed near the top).

    Example:
        >>> import keras_mha
        >>> memory_markdown_lines(keras_mha.plan("bundled:openai-community/gpt2").to_dict())[1]
        '## Memory'
    """
    if "memory" not in report:
        return []
    entry = report["memory"]
    serving = entry["serving"]
    lines = ["", "## Memory", ""]
    rows = _weights_rows(entry, UNLIMITED)
    lines.append("| " + " | ".join(rows[0]) + " |")
    lines.append("|---|" + "---:|" * (len(rows[0]) - 1))
    lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
    lines += ["", QUANTIZATION_NOTE, ""]
    lines += [line.strip() for line in format_lines(report, UNLIMITED)]
    lines += ["", f"At batch {serving['batch']} and {serving['seq_len']:,} tokens, one device:"]
    lines.append("")
    for line in _summary_lines(report, UNLIMITED):
        label, _, rest = line.strip().partition("  ")
        lines.append(f"- {label.strip()}: {rest.strip()}")
    if report.get("speed_bounds"):
        lines += ["", "## Speed (upper bounds)", ""]
        speed = speed_table_lines(report["speed_bounds"], UNLIMITED)
        lines += [f"{speed[1]}.", ""] + [f"- {line.strip()}" for line in speed[2:]]
    return lines


def fits_markdown_lines(report: dict) -> list[str]:
    """The "Will it fit?" section of the markdown card: the verdict in bold, the budget,
    the table per KV dtype, training and notes."""
    fits = report.get("fits")
    if not fits:
        return []
    budget = _budget_line(fits)
    lines = ["", "## Will it fit?", "", f"**{fits['verdict']}.**", ""]
    lines += [f"{budget[0].upper()}{budget[1:]}.", ""]
    lines += [
        "| KV dtype | serving per device | max context at batch | max batch at context |",
        "|---|---:|---:|---:|",
    ]
    for dtype, values in fits["by_kv_dtype"].items():
        cell = f"**{dtype}** (requested)" if dtype == fits["kv_dtype"] else dtype
        lines.append(
            f"| {cell} | {format_bytes(values['serving_bytes'])} | "
            f"{_length(values['max_seq_len'], fits)} | {_count(values['max_batch'])} |"
        )
    lines += ["", f"Training: {_training_verdict(fits)}."]
    lines += [line for note in _fits_notes(fits) for line in ("", note)]
    return lines


def __getattr__(name):
    # MemoryRequest and plan_format moved to keras_mha.planning.planner.request in 0.4.
    return moved_paths.moved_attribute(__name__, name)


__all__ = [
    "fits_markdown_lines",
    "fits_table_lines",
    "memory_markdown_lines",
    "memory_table_lines",
    "speed_table_lines",
    "suggestion_text",
    "verdict",
]
