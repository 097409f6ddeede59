"""`keras-mha prune SOURCE --target T --out DIR`: a smaller Hub checkpoint from a Hub checkpoint.

Steps: check every argument and the output folder (before anything heavy), load the
model (`keras_mha.models.from_pretrained`), tokenise `--data` with the checkpoint's own
`tokenizer.json`, measure the original model, score the heads (progress bar on
stderr), choose the heads to remove (`keras_mha.pruning.heads_to_prune`; uniform:
the same number in every layer), remove them physically
(`keras_mha.pruning.prune_heads`), measure again, and write the checkpoint
(`keras_mha.models.save_pretrained`) into a temporary folder beside `--out` that is
moved into place only when complete. Prints the before/after table
(`keras_mha.commands.prune_report`) or, with `--format json`, the same figures.

Head scores:
- decoders: next-token cross-entropy on windows of `--seq-len` tokens of the text;
- encoders: the in-batch contrastive loss sentence-transformers trains with
  (`MultipleNegativesRankingLoss`, scale 20), each sentence's embedding against the
  original model's embeddings of the batch: a head matters as much as it keeps
  sentences apart from each other as the original model did;
- `magnitude`: the weights alone (`--data` then only feeds the figures).

Example:
    keras-mha prune ./Llama-3.2-1B --target 25% --data notes.txt --out ./llama-pruned
    keras-mha prune ./all-MiniLM-L6-v2 --target 0.5 --method ablation --data text.txt \\
        --out ./minilm-half --format json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
import warnings
from pathlib import Path

from keras_mha.commands.options import (
    BACKEND_EPILOG,
    add_checkpoint_arguments,
    check_checkpoint_arguments,
    fit_text_batching_to_model,
    load_checkpoint,
    positive_int_type,
)
from keras_mha.commands.terminal import report_width
from keras_mha.errors import ExportError, PruningError, UsageError

METHODS = ("taylor", "ablation", "magnitude")
POLICIES = ("group", "query")
FORMATS = ("table", "json")
CONTRASTIVE_SCALE = 20.0  # sentence-transformers' MultipleNegativesRankingLoss default


def parse_target(text: str):
    """`--target`: `25%` or `0.25` (a fraction of heads) or `12` (a number of heads).

    Example:
        >>> parse_target("25%"), parse_target("0.5"), parse_target("12")
        (0.25, 0.5, 12)
    """
    raw = text.strip()
    try:
        if raw.endswith("%"):
            value = float(raw[:-1]) / 100.0
            is_fraction = True
        elif any(character in raw for character in ".eE"):
            value = float(raw)
            is_fraction = True
        else:
            value = int(raw)
            is_fraction = False
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a target; expected a percentage (25%), a fraction (0.25) or a "
            "number of heads (12)"
        ) from None
    if is_fraction and not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a fraction of heads in (0, 1): a layer must keep at least one head"
        )
    if not is_fraction and value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of heads")
    return value


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `prune` on the CLI's subparsers.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_parser(parser.add_subparsers())  # doctest: +SKIP
    """
    parser = subparsers.add_parser(
        "prune",
        help="remove attention heads of a Hub checkpoint and write a smaller one",
        description=(
            "Score the attention heads of a checkpoint on a text, remove the least important "
            "ones, and write a Hub checkpoint (config.json + safetensors + tokenizer) that "
            "transformers loads, with a before/after report."
        ),
        epilog=BACKEND_EPILOG,
    )
    add_checkpoint_arguments(parser, data_help="plain UTF-8 text to score on and measure with")
    parser.add_argument(
        "--target",
        required=True,
        type=parse_target,
        help="heads to remove: 25%% or 0.25 of all heads, or a number of heads (with --uniform "
        "a multiple of the number of layers)",
    )
    parser.add_argument(
        "--method", default="taylor", help=f"head importance: {', '.join(METHODS)} (default taylor)"
    )
    parser.add_argument(
        "--policy",
        default="group",
        choices=POLICIES,
        help="GQA: remove whole KV groups (group) or query heads from every group (query)",
    )
    parser.add_argument(
        "--uniform",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="remove the same number of heads in every layer (default), so that the result is "
        "a Hub checkpoint; --no-uniform ranks heads across layers and writes a .keras model "
        "when the layers end up different",
    )
    parser.add_argument("--format", default="table", choices=FORMATS, help="output (default table)")
    parser.add_argument(
        "--heatmap", metavar="FILE.png", help="also save head importance per layer and head"
    )
    parser.add_argument(
        "--latency-runs",
        type=positive_int_type("--latency-runs"),
        default=10,
        help="timed forward passes for the latency figure, median kept (default 10)",
    )
    parser.set_defaults(run=run)
    return parser


def _check_arguments(arguments):
    """Everything that can be refused without loading the model."""
    from keras_mha.models.export_files import check_not_in_source, check_output_file

    if arguments.method not in METHODS:
        raise UsageError(
            f"--method {arguments.method!r} is not a head-importance method; expected one of "
            f"{', '.join(METHODS)}",
            key="--method",
            value=arguments.method,
        )
    if arguments.data is None and arguments.method != "magnitude":
        raise UsageError(
            f"--method {arguments.method} scores heads on text: pass --data FILE (plain text), "
            "or use --method magnitude, which needs none",
            key="--data",
        )
    sources = check_checkpoint_arguments(arguments)
    if arguments.heatmap:
        check_output_file(arguments.heatmap, suffix=".png", argument="--heatmap")
        check_not_in_source(
            arguments.heatmap, sources, argument="--heatmap", shown=arguments.heatmap
        )
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            from keras_mha.errors import MissingDependencyError

            raise MissingDependencyError(
                "--heatmap needs matplotlib: pip install 'keras-mha[plot]'"
            )


def _prune_target(target, layers, uniform):
    """(target for heads_to_prune, scope) from the CLI's target."""
    if not uniform:
        return target, "global"
    if isinstance(target, float):
        return target, "per_layer"
    if target % len(layers):
        lower = (target // len(layers)) * len(layers)
        nearest = [count for count in (lower, lower + len(layers)) if count > 0]
        raise PruningError(
            f"--target {target}: with --uniform every one of the {len(layers)} attention layers "
            f"loses the same number of heads, so the count must be a multiple of {len(layers)} "
            f"(e.g. {' or '.join(map(str, nearest))}); or pass a fraction",
            key="--target",
            value=target,
        )
    return target // len(layers), "per_layer"


def _choose_heads(model, scores, arguments):
    from keras_mha.pruning import find_attention_layers, heads_to_prune

    layers = find_attention_layers(model)
    target, scope = _prune_target(arguments.target, layers, arguments.uniform)
    try:
        chosen = heads_to_prune(
            model, scores, target, scope=scope, gqa_policy=arguments.policy, min_heads_per_layer=1
        )
    except ValueError as error:
        text = str(error).replace("`target`", "--target").replace("`gqa_policy`", "--policy")
        raise PruningError(
            f"--target {_shown_target(arguments.target)}: {text}", key="--target"
        ) from None
    removed = sum(len(heads) for heads in chosen.values())
    if removed == 0:
        group_sizes = sorted({layer.num_query_groups for layer in layers.values()})
        unit = (
            f"whole KV groups of {'/'.join(map(str, group_sizes))} query heads"
            if arguments.policy == "group"
            else "one query head from every KV group"
        )
        raise PruningError(
            f"--target {_shown_target(arguments.target)} removes no head: heads go in units of "
            f"{unit}{' in every layer' if arguments.uniform else ''}, and the target rounds "
            "down to none; pass a larger target",
            key="--target",
        )
    return chosen


def _requested_heads(target, heads_total: int) -> float:
    """Heads the target asks for: a fraction of all heads, or a count."""
    return target * heads_total if isinstance(target, float) else float(target)


def _rounding(arguments, removed: int, total: int) -> str | None:
    """How the target was rounded to what the layers can lose, or None when it was not."""
    asked = _requested_heads(arguments.target, total)
    if removed == asked:
        return None
    unit = "whole KV groups" if arguments.policy == "group" else "one query head per KV group"
    where = " in every layer alike (--uniform)" if arguments.uniform else ""
    return (
        f"--target {_shown_target(arguments.target)} asks for {asked:g} of {total} heads; "
        f"{removed} ({removed / total:.1%}) removed: heads go in {unit}{where}, at least one "
        "kept per layer"
    )


def _uniform_scores(model):
    import numpy as np

    from keras_mha.pruning import find_attention_layers

    return {path: np.zeros(layer.num_heads) for path, layer in find_attention_layers(model).items()}


def _shown_target(target):
    return f"{target:.4g}" if isinstance(target, float) else str(target)


class _ProgressBatches:
    """Batches that advance a progress bar as each one is consumed (re-iterable).

    A batch counts once the consumer asks for the next one (or the loop ends), so the
    bar shows finished work; `head_importance` peeking at the first batch to check
    the data is not empty does not move it.
    """

    def __init__(self, batches, tokens, bar):
        self.batches, self.tokens, self.bar = batches, tokens, bar

    def __iter__(self):
        for index, batch in enumerate(self.batches):
            yield batch
            self.bar.advance(tokens=self.tokens[index])


def _encoder_scoring(model, data, batch_size, reference):
    """(scoring model, batches, loss, {scoring path: model path}) for an encoder."""
    import keras

    from keras_mha.models.sentence_embedding import sentence_embedding_model
    from keras_mha.pruning import find_attention_layers

    embedding_model = sentence_embedding_model(model)
    embedding_model(data.inputs(0, 1))
    batches = [
        (data.inputs(start, stop), reference[start:stop], None)
        for start, stop in data.batch_bounds(batch_size)
    ]

    def contrastive(y_true, y_pred):
        logits = CONTRASTIVE_SCALE * keras.ops.matmul(
            y_pred, keras.ops.transpose(keras.ops.cast(y_true, y_pred.dtype))
        )
        labels = keras.ops.arange(keras.ops.shape(logits)[0])
        return keras.ops.mean(
            keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        )

    by_id = {id(layer): path for path, layer in find_attention_layers(model).items()}
    paths = {
        path: by_id[id(layer)] for path, layer in find_attention_layers(embedding_model).items()
    }
    return embedding_model, batches, contrastive, paths


def score_heads(model, kind, data, arguments, reference, progress_enabled):
    """`{model path: scores}` with a progress bar over the scoring batches."""
    import keras

    from keras_mha.progress import ProgressBar
    from keras_mha.pruning import head_importance

    if arguments.method == "magnitude":
        return head_importance(model, method="magnitude")
    if kind == "decoder":
        scoring_model, paths = model, None
        batches = data.batches(arguments.batch_size)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    else:
        scoring_model, batches, loss, paths = _encoder_scoring(
            model, data, arguments.batch_size, reference
        )
    tokens = data.batch_tokens(arguments.batch_size)
    with ProgressBar(
        total=len(batches),
        unit="batches",
        total_tokens=sum(tokens),
        label=f"scoring heads ({arguments.method})",
        enabled=progress_enabled,
    ) as bar:
        scores = head_importance(
            scoring_model,
            _ProgressBatches(batches, tokens, bar),
            method=arguments.method,
            loss=loss,
        )
    if paths is not None:
        scores = {paths[path]: value for path, value in scores.items()}
    return scores


def _load_data(arguments, directory, kind):
    from keras_mha.data import text as text_data

    if arguments.data is None:
        return None
    tokenizer = text_data.load_tokenizer(directory)
    text = text_data.read_text(
        arguments.data, max_characters=text_data.characters_to_read(arguments.max_tokens)
    )
    return scoring_data(tokenizer, text, kind, arguments)


def scoring_data(tokenizer, text, kind, arguments, argument="--data"):
    """`DecoderData` windows or `EncoderData` sentences of `text` to score heads on.

    `arguments` holds `method`, `seq_len`, `max_tokens` and `batch_size` (as parsed).

    Example:
        >>> data = scoring_data(tokenizer, text, "decoder", arguments)  # doctest: +SKIP
    """
    from keras_mha.data import text as text_data

    if kind == "encoder" and arguments.method != "magnitude" and arguments.batch_size < 2:
        # The encoder loss ranks each sentence against the others in its batch: alone
        # in a batch, a sentence's loss is exactly 0 and would score nothing.
        raise UsageError(
            f"--batch-size {arguments.batch_size}: an encoder is scored by comparing the "
            "sentences of a batch with each other; expected at least 2",
            key="--batch-size",
            value=arguments.batch_size,
        )
    return text_data.examples_of_text(
        tokenizer, text, kind=kind, seq_len=arguments.seq_len,
        max_tokens=arguments.max_tokens, argument=argument,
    )  # fmt: skip


def _latency_inputs(data, kind, arguments, vocabulary_size):
    import numpy as np

    if data is not None and kind == "decoder":
        return data.batches(arguments.batch_size)[0][0]
    if data is not None:
        return data.inputs(0, arguments.batch_size)
    # No text (magnitude without --data): time random tokens of --seq-len.
    ids = np.random.default_rng(0).integers(
        0, vocabulary_size, size=(arguments.batch_size, arguments.seq_len), dtype="int32"
    )
    return {"token_ids": ids, "padding_mask": np.ones_like(ids, dtype=bool)}


def run(arguments) -> int:
    """Run `keras-mha prune`; returns the exit status (errors are raised, main() prints them).

    Example:
        >>> from keras_mha.cli import main
        >>> main(["prune", "./tiny-llama", "--target", "50%", "--method", "magnitude",
        ...       "--out", "./tiny-pruned"])  # doctest: +SKIP
        0
    """
    _check_arguments(arguments)
    from keras_mha import backends
    from keras_mha.models import export as exporting
    from keras_mha.pruning import get_head_gates, prune_heads, set_head_gates

    json_output = arguments.format == "json"
    progress_enabled = None  # on stderr, when it is a terminal, whatever the format
    model = load_checkpoint(arguments, arguments.source)
    kind = exporting.model_kind(model)
    fit_text_batching_to_model(model, arguments)
    # Refuse a target the layers cannot take before any measuring or scoring.
    _choose_heads(model, _uniform_scores(model), arguments)
    directory = exporting.source_directory(model)
    data = _load_data(arguments, directory, kind)
    sequence_length = (
        arguments.seq_len if data is None or kind == "decoder" else data.token_ids.shape[1]
    )
    latency_inputs = _latency_inputs(data, kind, arguments, exporting.vocabulary_size(model))

    before, reference = measure_model(model, kind, data, arguments, sequence_length, latency_inputs)
    started = time.perf_counter()
    scores = score_heads(model, kind, data, arguments, reference, progress_enabled)
    scoring_seconds = time.perf_counter() - started
    chosen = _choose_heads(model, scores, arguments)
    gates = get_head_gates(model)
    for path, heads in chosen.items():
        gates[path][heads] = 0.0
    set_head_gates(model, gates)
    heads_total = int(sum(len(values) for values in gates.values()))
    heads_removed = int(sum(len(heads) for heads in chosen.values()))
    rounding = _rounding(arguments, heads_removed, heads_total)
    prune_heads(model)
    after, _ = measure_model(
        model, kind, data, arguments, sequence_length, latency_inputs, reference=reference
    )

    export = _export(model, arguments)
    heatmap = None
    if arguments.heatmap:
        heatmap = _save_heatmap(arguments.heatmap, scores, gates, arguments)
    report = {
        "source": arguments.source,
        "architecture": kind,
        "model_type": exporting.model_type(model),
        "backend": backends.name(),
        "dtype": arguments.dtype or exporting.compute_dtype(model),
        "method": arguments.method,
        "policy": arguments.policy,
        "uniform": arguments.uniform,
        "target": {
            "requested": arguments.target,
            "heads_removed": heads_removed,
            "heads_total": heads_total,
            "requested_heads": _requested_heads(arguments.target, heads_total),
            "rounding": rounding,
        },
        "data": None
        if data is None
        else {
            "file": arguments.data,
            "tokens": int(data.num_tokens),
            "examples": int(data.num_examples),
            "batches": len(data.batch_tokens(arguments.batch_size)),
            "sequence_length": int(sequence_length),
        },
        "flops_sequence_length": int(sequence_length),
        "scoring_seconds": round(scoring_seconds, 3),
        "pruned_heads": {path: [int(h) for h in heads] for path, heads in chosen.items()},
        "before": before,
        "after": after,
        "export": export,
        "heatmap": heatmap,
    }
    from keras_mha.commands.prune_report import render_table

    width = report_width(wide=arguments.wide)
    text = json.dumps(report, indent=2) if json_output else render_table(report, width)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    return 0


def measure_model(model, kind, data, arguments, sequence_length, latency_inputs, reference=None):
    from keras_mha.commands.prune_report import measure

    return measure(
        model,
        kind,
        data,
        batch_size=arguments.batch_size,
        sequence_length=sequence_length,
        latency_inputs=latency_inputs,
        reference=reference,
        latency_runs=arguments.latency_runs,
    )


def _export(model, arguments):
    from keras_mha.models import export as exporting

    if not exporting.is_uniform(model):
        if arguments.uniform:  # pragma: no cover - a uniform plan always gives uniform layers
            raise ExportError("the pruned model is not uniform although --uniform was given")
        return exporting.save_keras(model, arguments.out, overwrite=arguments.overwrite)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = exporting.save_pretrained(
            model,
            arguments.out,
            max_shard_size=arguments.max_shard_size,
            overwrite=arguments.overwrite,
        )
    del caught  # The zeroed-heads warning is said in the table instead.
    return {"format": "hub", **result.as_dict()}


def _save_heatmap(path, scores, gates, arguments):
    from keras_mha.models.export_files import write_atomic_file
    from keras_mha.pruning import save_head_heatmap

    buffer = io.BytesIO()
    with contextlib.suppress(AttributeError):
        buffer.name = "heatmap.png"
    save_head_heatmap(
        buffer,
        scores,
        gates,
        title=f"{Path(arguments.source).name}: {arguments.method} importance, pruned heads",
    )
    write_atomic_file(path, buffer.getvalue(), argument="--heatmap")
    return str(path)
