"""Before/after figures of `keras-mha prune`, measured on the model, and their rendering.

Figures (the same keys in `--format json`, under `"before"` and `"after"`):

- `parameters`: `model.count_params()` of the Keras model.
- `attention_heads`, `kv_heads`: query heads and key/value heads over all layers.
- `kv_cache_bytes_per_token`: bytes one more token adds to the KV cache (decoders;
  `null` for encoders, which keep none).
- `attention_flops_per_token`: FLOPs of the attention layers per token of a sequence of
  the report's `flops_sequence_length` tokens (`keras_mha.pruning.model_attention_flops`
  / length): the projections cost the same per token at every length, the scores and
  the weighted values grow with it, so the table names the length.
- `perplexity`: `exp(mean next-token cross-entropy)` on the data (decoders; `null`
  otherwise or without data).
- `embedding_cosine`, `embedding_cosine_min`: mean and smallest cosine between this
  model's and the original model's mean-pooled sentence embeddings on the data
  (encoders; 1.0 before).
- `latency_ms`: median wall time of one forward pass (`predict_on_batch`) on one batch
  of the data, on the current backend.

Example:
    >>> figures = measure(model, "decoder", data, batch_size=8)  # doctest: +SKIP
    >>> sorted(figures)[:3]  # doctest: +SKIP
    ['attention_flops_per_token', 'attention_heads', 'embedding_cosine']
"""

from __future__ import annotations

import statistics
import time

import keras
import numpy as np

from keras_mha.planning.render.formatting import format_number
from keras_mha.planning.render.text import DEFAULT_WIDTH, wrap
from keras_mha.pruning import find_attention_layers, model_attention_flops

LATENCY_WARMUP_CALLS = 1
DEFAULT_LATENCY_RUNS = 10
# Stop timing early once this many seconds were spent (a big model on a CPU).
LATENCY_BUDGET_SECONDS = 20.0


def dtype_bytes(dtype) -> int:
    """Bytes per element of a Keras dtype (bfloat16 included).

    Example:
        >>> dtype_bytes("bfloat16"), dtype_bytes("float32")
        (2, 4)
    """
    return int(
        np.dtype(keras.backend.standardize_dtype(dtype).replace("bfloat16", "float16")).itemsize
    )


def kv_cache_bytes_per_token(model) -> int:
    """Bytes one more token adds to the KV cache of every attention layer (K and V).

    Example:
        >>> kv_cache_bytes_per_token(model)  # doctest: +SKIP
        24576
    """
    total = 0
    for layer in find_attention_layers(model).values():
        window_free = 2 * layer.num_key_value_heads * layer.head_dim
        total += window_free * dtype_bytes(layer.compute_dtype)
    return total


def mean_pooled_embeddings(hidden, padding_mask):
    """Mean over real tokens, L2-normalised (sentence-transformers' pooling), in NumPy.

    Example:
        >>> mean_pooled_embeddings(np.ones((1, 2, 3)), np.array([[True, False]])).round(3)
        array([[0.577, 0.577, 0.577]])
    """
    hidden = np.asarray(hidden, dtype="float64")
    mask = np.asarray(padding_mask, dtype="float64")[..., None]
    pooled = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)


def _to_numpy(value):
    return np.asarray(keras.ops.convert_to_numpy(value))


def encoder_embeddings(model, data, batch_size):
    """Mean-pooled, normalised embeddings of every sentence of `data` (`EncoderData`)."""
    outputs = []
    for start in range(0, data.num_examples, batch_size):
        x = data.inputs(start, start + batch_size)
        hidden = _to_numpy(model.predict_on_batch(x))
        outputs.append(mean_pooled_embeddings(hidden, x["padding_mask"]))
    return np.concatenate(outputs)


def perplexity(model, data, batch_size):
    """`exp(mean next-token negative log-likelihood)` over every window of `data`.

    Log-softmax in float64 NumPy, so the figure does not depend on the backend's
    reductions.
    """
    total, count = 0.0, 0
    for x, targets, _ in data.batches(batch_size):
        logits = _to_numpy(model.predict_on_batch(x)).astype("float64")
        logits -= logits.max(axis=-1, keepdims=True)
        log_norm = np.log(np.exp(logits).sum(axis=-1))
        picked = np.take_along_axis(logits, targets[..., None].astype("int64"), axis=-1)[..., 0]
        total += float((log_norm - picked).sum())
        count += targets.size
    return float(np.exp(total / count))


def forward_latency_ms(model, inputs, runs=DEFAULT_LATENCY_RUNS):
    """Median milliseconds of `model.predict_on_batch(inputs)` after warm-up calls."""
    for _ in range(LATENCY_WARMUP_CALLS):
        _to_numpy(model.predict_on_batch(inputs))
    times = []
    started = time.perf_counter()
    for _ in range(runs):
        begin = time.perf_counter()
        _to_numpy(model.predict_on_batch(inputs))
        times.append(time.perf_counter() - begin)
        if time.perf_counter() - started > LATENCY_BUDGET_SECONDS and len(times) >= min(3, runs):
            break
    return 1000.0 * statistics.median(times)


def paired_latency_ms(models, inputs, runs=DEFAULT_LATENCY_RUNS):
    """Median ms of `predict_on_batch(inputs)` per model, timed in turns, and paired ratios.

    On a machine shared with other work, timing one model and then the other lets a
    change of load land on one of them only. Here every round calls each model once
    (the order reversed every other round), so load hits all alike; the ratio of
    model `i` to model 0 is the median over rounds of their times in that round.

    Returns:
        `(medians_ms, ratios)`: one median per model, and one ratio per model to the
        first (1.0 for the first).

    Example:
        >>> (before, after), (_, ratio) = paired_latency_ms([original, pruned], x, runs=20)
        ... # doctest: +SKIP
    """
    if runs < 1:
        raise ValueError(f"`runs`={runs!r}: expected at least 1 timed round.")
    for model in models:
        for _ in range(LATENCY_WARMUP_CALLS):
            _to_numpy(model.predict_on_batch(inputs))
    rounds = []
    for index in range(runs):
        order = range(len(models)) if index % 2 == 0 else reversed(range(len(models)))
        times = [0.0] * len(models)
        for position in order:
            begin = time.perf_counter()
            _to_numpy(models[position].predict_on_batch(inputs))
            times[position] = time.perf_counter() - begin
        rounds.append(times)
    medians = [1000.0 * statistics.median(r[i] for r in rounds) for i in range(len(models))]
    ratios = [statistics.median(r[i] / r[0] for r in rounds) for i in range(len(models))]
    return medians, ratios


def measure(
    model,
    kind,
    data,
    *,
    batch_size,
    sequence_length,
    latency_inputs,
    reference=None,
    latency_runs=DEFAULT_LATENCY_RUNS,
):
    """The figures of the module table for `model`.

    Args:
        model: the Keras model (original or pruned).
        kind: `"decoder"` or `"encoder"`.
        data: `DecoderData` / `EncoderData`, or None (no perplexity / cosine).
        batch_size: batch size for the passes over `data`.
        sequence_length: tokens per example, for the FLOPs per token.
        latency_inputs: one batch of model inputs to time.
        reference: the original model's embeddings (encoders), from `encoder_embeddings`.
        latency_runs: timed forward passes (after a warm-up pass); the median is kept.

    Returns:
        `(figures, embeddings)`: the dict, and the encoder embeddings (None for decoders).
    """
    layers = find_attention_layers(model).values()
    figures = {
        "parameters": int(model.count_params()),
        "attention_heads": int(sum(layer.num_heads for layer in layers)),
        "kv_heads": int(sum(layer.num_key_value_heads for layer in layers)),
        "kv_cache_bytes_per_token": kv_cache_bytes_per_token(model) if kind == "decoder" else None,
        "attention_flops_per_token": int(
            round(model_attention_flops(model, sequence_length) / sequence_length)
        ),
        "perplexity": None,
        "embedding_cosine": None,
        "embedding_cosine_min": None,
    }
    embeddings = None
    if data is not None and kind == "decoder":
        figures["perplexity"] = perplexity(model, data, batch_size)
    elif data is not None:
        embeddings = encoder_embeddings(model, data, batch_size)
        cosines = np.sum(embeddings * (embeddings if reference is None else reference), axis=-1)
        figures["embedding_cosine"] = float(np.mean(cosines))
        figures["embedding_cosine_min"] = float(np.min(cosines))
    figures["latency_ms"] = forward_latency_ms(model, latency_inputs, latency_runs)
    return figures, embeddings


# -- rendering --------------------------------------------------------------------------------


def _change(before, after):
    if before in (None, 0) or after is None:
        return ""
    return f"{(after - before) / before:+.1%}"


ROWS = (
    ("parameters (Keras model)", "parameters", None),
    ("attention heads (query)", "attention_heads", None),
    ("KV heads", "kv_heads", None),
    ("KV-cache bytes / token", "kv_cache_bytes_per_token", None),
    ("attention FLOPs / token", "attention_flops_per_token", None),
    ("perplexity", "perplexity", 3),
    ("embedding cosine to original (mean)", "embedding_cosine", 4),
    ("embedding cosine to original (min)", "embedding_cosine_min", 4),
    ("forward latency (ms)", "latency_ms", 1),
)


def render_table(report, width=DEFAULT_WIDTH) -> str:
    """The human-readable before/after table (what `--format table` prints); its sentences
    wrap within `width` columns (`UNLIMITED`: `--wide`), continued two spaces in.

    Example:
        >>> print(render_table(report))  # doctest: +SKIP
    """
    before, after = report["before"], report["after"]
    flops_length = report.get("flops_sequence_length")
    rows = [
        (
            f"{label} at {flops_length:,} tokens"
            if key == "attention_flops_per_token" and flops_length
            else label,
            format_number(before[key], digits),
            format_number(after[key], digits),
            _change(before[key], after[key]),
        )
        for label, key, digits in ROWS
        if before.get(key) is not None or after.get(key) is not None
    ]
    header = ("", "before", "after", "change")
    widths = [max(len(row[i]) for row in (*rows, header)) for i in range(4)]
    lines = []
    target = report["target"]
    lines.append(
        f"{report['source']}: removed {target['heads_removed']} of {target['heads_total']} "
        f"attention heads ({report['method']}, policy {report['policy']}, "
        f"{'uniform' if report['uniform'] else 'non-uniform'}; {report['backend']} backend, "
        f"{report['dtype']})"
    )
    if target.get("rounding"):
        lines.append(f"target: {target['rounding']}")
    data = report.get("data")
    if data:
        lines.append(
            f"data: {data['file']} — {data['tokens']:,} tokens in {data['examples']} "
            f"{'windows' if report['architecture'] == 'decoder' else 'sentences'}, "
            f"{data['batches']} batches; scoring took {report['scoring_seconds']:.1f} s"
        )
    table = [
        "  ".join(
            text.ljust(column) if i == 0 else text.rjust(column)
            for i, (text, column) in enumerate(zip(row, widths, strict=True))
        )
        for row in (header, *rows)
    ]
    lines += ["", *table, ""]
    export = report["export"]
    if export.get("format") == "keras":
        lines.append(
            f"wrote {export['path']}: a .keras model (layers keep different head counts, which "
            "a Hub config cannot state; rerun with --uniform for a Hub checkpoint)"
        )
    else:
        lines.append(
            f"wrote {export['path']}: {', '.join(export['files'])} "
            f"({_megabytes(export['bytes'])}; num_attention_heads={export['num_attention_heads']}, "
            f"num_key_value_heads={export['num_key_value_heads']}"
            + (f", head_dim={export['head_dim']}" if export.get("head_dim") else "")
            + ")"
        )
        if export.get("heads_zeroed"):
            lines.append(
                f"note: {export['model_type']} derives the head size from hidden_size / "
                "num_attention_heads, so the checkpoint keeps "
                f"{export['num_attention_heads']} heads per layer with the removed heads' "
                "weights zeroed: same outputs, file not smaller; the Keras model above is the "
                "physically smaller one"
            )
    if report.get("heatmap"):
        lines.append(f"heatmap: {report['heatmap']}")
    prose = [wrap(line, width, "", "  ") if line not in table else [line] for line in lines]
    return "\n".join(part for parts in prose for part in parts)


def _megabytes(count):
    return f"{count / 1e6:,.1f} MB"
