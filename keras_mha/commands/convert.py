"""`keras-mha convert SOURCE --kv-heads N --out DIR`: a multi-head checkpoint made grouped-query.

Steps: check every argument and the output folder (before anything heavy), load the
model (`keras_mha.models.from_pretrained`), check that every attention layer can take
`--kv-heads`, tokenise `--data` with the checkpoint's own `tokenizer.json` and hold its
last `--held-out` fraction out, measure the original, pool the KV heads
(`keras_mha.conversion.convert_attention`), measure again, uptrain for `--steps` steps
with Keras `fit` (`keras_mha.conversion.uptrain`; progress bar on stderr) and measure
once more, then write the result into a temporary folder beside `--out` that is moved
into place only when complete: a Hub checkpoint (`keras_mha.models.save_pretrained`:
config.json with the new `num_key_value_heads`, safetensors, tokenizer files) that
transformers loads, or, for families whose config cannot state fewer KV heads than
query heads (BERT), `model.keras`, saying why. Prints the report
(`keras_mha.conversion.report`) as a table, JSON or markdown.

Quality on the held-out text: perplexity for decoders; for encoders, the cosine of
each sentence embedding to the original model's. Encoders have no language-modelling
head, so they are uptrained with `--distill` only.

Example:
    keras-mha convert ./Llama-2-7b-hf --kv-heads 8 --out ./llama-2-7b-gqa8
    keras-mha convert ./mha-model --kv-heads 2 --method regroup --data notes.txt \\
        --steps 500 --lr 3e-4 --out ./gqa-model --format markdown
"""

from __future__ import annotations

import argparse
import json
import math
import time

from keras_mha.commands.options import (
    BACKEND_EPILOG,
    add_checkpoint_arguments,
    check_checkpoint_arguments,
    fit_text_batching_to_model,
    load_checkpoint,
    positive_int_type,
)
from keras_mha.commands.terminal import report_width
from keras_mha.errors import PruningError, UsageError

METHODS = ("mean", "first", "regroup")  # = keras_mha.layers.kv_conversion.METHODS
FORMATS = ("table", "json", "markdown")
DEFAULT_LEARNING_RATE = 1e-4
DEFAULT_HELD_OUT = 0.1


def _number_type(parse, accept, expected):
    """An argparse type: `parse(text)` when `accept` takes it, else one line saying `expected`."""

    def convert(text):
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number; expected {expected}"
            ) from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"{text!r} is out of range; expected {expected}")
        return value

    return convert


_steps_type = _number_type(int, lambda value: value >= 0, "0 or more steps")
_learning_rate_type = _number_type(
    float, lambda value: math.isfinite(value) and value > 0, "a positive number, e.g. 1e-4"
)
_fraction_type = _number_type(
    float, lambda value: 0.0 < value < 1.0, "a fraction in (0, 1), e.g. 0.1"
)


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `convert` on the CLI's subparsers.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_parser(parser.add_subparsers())  # doctest: +SKIP
    """
    parser = subparsers.add_parser(
        "convert",
        help="pool the KV heads of a Hub checkpoint (MHA -> GQA/MQA), uptrain, write it",
        description=(
            "Convert every attention layer of a checkpoint to fewer key/value heads "
            "(Ainslie et al. 2023: mean-pool each group), optionally uptrain on a text with "
            "Keras fit, and write a Hub checkpoint that transformers loads, with a report of "
            "the KV cache, parameters and held-out quality before and after."
        ),
        epilog=BACKEND_EPILOG,
    )
    add_checkpoint_arguments(
        parser, data_help="plain UTF-8 text to measure on and uptrain with (its end held out)"
    )
    parser.add_argument(
        "--kv-heads",
        required=True,
        type=positive_int_type("--kv-heads"),
        metavar="N",
        help="KV heads per layer after conversion: a divisor of today's (1: multi-query)",
    )
    parser.add_argument(
        "--method",
        default="mean",
        choices=METHODS,
        help="mean: average each group's K/V heads (the paper's); first: keep the first; "
        "regroup: group the most alike heads, then average (default mean)",
    )
    parser.add_argument(
        "--steps",
        type=_steps_type,
        default=0,
        help="uptraining steps on --data after converting (default 0: none)",
    )
    parser.add_argument(
        "--lr",
        type=_learning_rate_type,
        default=DEFAULT_LEARNING_RATE,
        help=f"peak learning rate of AdamW for uptraining (default {DEFAULT_LEARNING_RATE:g})",
    )
    parser.add_argument(
        "--distill",
        action="store_true",
        help="uptrain by matching the frozen original model (KL divergence of next-token "
        "distributions; encoders: sentence-embedding cosine) instead of next-token loss; "
        "holds a second copy of the model",
    )
    parser.add_argument(
        "--held-out",
        type=_fraction_type,
        default=DEFAULT_HELD_OUT,
        metavar="FRACTION",
        help=f"fraction at the end of --data kept for measuring (default {DEFAULT_HELD_OUT:g})",
    )
    parser.add_argument("--seed", type=int, default=0, help="of the uptraining order (default 0)")
    parser.add_argument("--format", default="table", choices=FORMATS, help="output (default table)")
    parser.set_defaults(run=run)
    return parser


def _check_arguments(arguments):
    """Everything that can be refused without loading the model."""
    if arguments.steps and arguments.data is None:
        raise UsageError(
            f"--steps {arguments.steps} uptrains on text: pass --data FILE (plain text)",
            key="--data",
        )
    if arguments.distill and not arguments.steps:
        raise UsageError(
            "--distill is how uptraining learns: pass --steps S (and --data FILE) too",
            key="--distill",
        )
    check_checkpoint_arguments(arguments)


def _check_model(model, kind, arguments):
    """Refuse what the loaded model cannot take, before any measuring."""
    from keras_mha.conversion.convert import check_conversion

    try:
        layers = check_conversion(model, arguments.kv_heads, arguments.method)
    except PruningError as error:
        raise PruningError(
            f"--kv-heads {arguments.kv_heads}: {error}", key="--kv-heads", value=arguments.kv_heads
        ) from None
    if kind == "encoder" and arguments.steps and not arguments.distill:
        raise UsageError(
            f"--steps {arguments.steps}: {arguments.source} is an encoder, with no "
            "language-modelling head, so it has no next-token loss (or perplexity) to uptrain "
            "on; add --distill to match the original model's sentence embeddings",
            key="--distill",
        )
    return layers


def _quality(model, kind, held_out, batch_size, reference):
    """Perplexity (decoders) or mean embedding cosine to `reference` (encoders), and the
    embeddings (encoders)."""
    import numpy as np

    from keras_mha.commands.prune_report import encoder_embeddings, perplexity

    if kind == "decoder":
        return perplexity(model, held_out, batch_size), None
    embeddings = encoder_embeddings(model, held_out, batch_size)
    if reference is None:
        return 1.0, embeddings
    return float(np.mean(np.sum(embeddings * reference, axis=-1))), embeddings


def _uptrain(model, kind, train, arguments, progress_enabled):
    """`(uptraining entry, seconds)`."""
    from keras_mha.conversion.uptraining import uptrain
    from keras_mha.progress import ProgressBar

    teacher, teacher_bytes = None, 0
    if arguments.distill:
        teacher = load_checkpoint(arguments, arguments.source)
        teacher_bytes = _weight_bytes(teacher)
    started = time.perf_counter()
    batch_size = min(arguments.batch_size, train.num_examples)
    tokens_per_step = int(batch_size * train.num_tokens / train.num_examples)
    with ProgressBar(
        total=arguments.steps,
        unit="steps",
        total_tokens=arguments.steps * tokens_per_step,
        label="uptraining",
        enabled=progress_enabled,
    ) as bar:
        losses = uptrain(
            model,
            train,
            steps=arguments.steps,
            learning_rate=arguments.lr,
            batch_size=arguments.batch_size,
            teacher=teacher,
            seed=arguments.seed,
            progress=bar,
        )
    seconds = time.perf_counter() - started
    objective = "next_token"
    if arguments.distill:
        objective = "distill_kl" if kind == "decoder" else "distill_cosine"
    entry = {
        "steps": arguments.steps,
        "batch_size": batch_size,
        "learning_rate": arguments.lr,
        "objective": objective,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "teacher_bytes": teacher_bytes,
    }
    return entry, seconds


def _weight_bytes(model):
    import math

    from keras_mha.commands.prune_report import dtype_bytes

    return sum(math.prod(weight.shape) * dtype_bytes(weight.dtype) for weight in model.weights)


def _export(model, arguments):
    from keras_mha.models import export as exporting

    refusal = exporting.grouped_query_refusal(model)
    if refusal is not None:
        saved = exporting.save_keras(model, arguments.out, overwrite=arguments.overwrite)
        return {**saved, "reason": refusal}
    result = exporting.save_pretrained(
        model,
        arguments.out,
        max_shard_size=arguments.max_shard_size,
        overwrite=arguments.overwrite,
    )
    return {"format": "hub", **result.as_dict()}


def run(arguments) -> int:
    """Run `keras-mha convert`; returns the exit status (errors are raised, main() prints them).

    Example:
        >>> from keras_mha.cli import main
        >>> main(["convert", "./tiny-llama", "--kv-heads", "1", "--out", "./tiny-mqa"])
        ... # doctest: +SKIP
        0
    """
    started = time.perf_counter()
    _check_arguments(arguments)
    from keras_mha import backends
    from keras_mha.conversion.convert import convert_attention
    from keras_mha.conversion.report import kv_cache_figures, render_markdown, render_table
    from keras_mha.conversion.uptraining import held_out_split
    from keras_mha.data.text import load_examples
    from keras_mha.models import export as exporting

    model = load_checkpoint(arguments, arguments.source)
    kind = exporting.model_kind(model)
    fit_text_batching_to_model(model, arguments)
    layers = _check_model(model, kind, arguments)
    first_layer = next(iter(layers.values()))
    kv_before = first_layer.num_key_value_heads
    load_seconds = time.perf_counter() - started

    measure_started = time.perf_counter()
    train = held_out = data_entry = None
    if arguments.data is not None:
        examples = load_examples(
            exporting.source_directory(model),
            arguments.data,
            kind=kind,
            seq_len=arguments.seq_len,
            max_tokens=arguments.max_tokens,
        )
        train, held_out = held_out_split(examples, arguments.held_out)
        data_entry = {
            "file": arguments.data,
            "tokens": int(examples.num_tokens),
            "train_examples": int(train.num_examples),
            "held_out_examples": int(held_out.num_examples),
            "sequence_length": int(arguments.seq_len),
        }
    quality = reference = None
    if held_out is not None:
        original, reference = _quality(model, kind, held_out, arguments.batch_size, None)
        quality = {
            "metric": "perplexity" if kind == "decoder" else "embedding_cosine",
            "original": original,
            "converted": None,
            "uptrained": None,
        }
    parameters_before = int(model.count_params())
    measure_seconds = time.perf_counter() - measure_started

    convert_started = time.perf_counter()
    convert_attention(model, arguments.kv_heads, method=arguments.method)
    convert_seconds = time.perf_counter() - convert_started

    measure_started = time.perf_counter()
    if quality is not None:
        quality["converted"], _ = _quality(model, kind, held_out, arguments.batch_size, reference)
    measure_seconds += time.perf_counter() - measure_started

    uptraining, uptrain_seconds = None, None
    if arguments.steps:
        progress_enabled = None  # on stderr, when it is a terminal, whatever the format
        uptraining, uptrain_seconds = _uptrain(model, kind, train, arguments, progress_enabled)
        measure_started = time.perf_counter()
        quality["uptrained"], _ = _quality(model, kind, held_out, arguments.batch_size, reference)
        measure_seconds += time.perf_counter() - measure_started

    export_started = time.perf_counter()
    export = _export(model, arguments)
    export_seconds = time.perf_counter() - export_started
    report = {
        "source": arguments.source,
        "architecture": kind,
        "model_type": exporting.model_type(model),
        "backend": backends.name(),
        "dtype": exporting.compute_dtype(model),
        "method": arguments.method,
        "num_layers": len(layers),
        "num_attention_heads": first_layer.num_heads,
        "kv_heads": {"before": kv_before, "after": arguments.kv_heads},
        "kv_cache": kv_cache_figures(
            exporting.source_config(model),
            arguments.kv_heads,
            kv_dtype=exporting.compute_dtype(model),
        ),
        "parameters": {"before": parameters_before, "after": int(model.count_params())},
        "quality": quality,
        "data": data_entry,
        "uptraining": uptraining,
        "seconds": {
            "load": round(load_seconds, 3),
            "measure": round(measure_seconds, 3),
            "convert": round(convert_seconds, 3),
            "uptrain": None if uptrain_seconds is None else round(uptrain_seconds, 3),
            "export": round(export_seconds, 3),
            "total": round(time.perf_counter() - started, 3),
        },
        "export": export,
    }
    from keras_mha.commands.output import write_stdout

    if arguments.format == "json":
        write_stdout(json.dumps(report, indent=2, allow_nan=False))
    elif arguments.format == "markdown":
        write_stdout(render_markdown(report))
    else:
        write_stdout(render_table(report, report_width(wide=arguments.wide)))
    return 0
