"""Command-line options shared by the subcommands: lengths, dtypes, memory sizes, the
memory planner's flags (`inspect`, `compare`), and the checkpoint-in, checkpoint-out
flags of `prune` and `convert`. Pure Python (no keras, backend or numpy import).

The argparse `type=` functions turn `keras_mha.errors.UsageError` into argparse's own
error (exit 2) with the same one-line message; `memory_request` resolves `--gpu` /
`--memory` after parsing and raises `UsageError` itself.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_memory_arguments(parser)
    >>> arguments = parser.parse_args(["--gpu", "rtx4090", "--weights-dtype", "int4"])
    >>> request = memory_request(arguments)
    >>> request.gpu.name, request.weights_dtype
    ('RTX 4090 24GB', 'int4')
"""

from __future__ import annotations

import argparse
import math

from keras_mha.cards import units
from keras_mha.cards.hub import MAX_TIMEOUT_SECONDS  # the longest --timeout (a day)
from keras_mha.errors import UsageError

OPTIMIZERS = ("adamw", "adam", "sgd-momentum", "sgd")
# `prune` / `convert`: dtypes a checkpoint is loaded and written in, and the text defaults.
CHECKPOINT_DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_MAX_TOKENS = 16384
DEFAULT_SEQ_LEN = 128
DEFAULT_BATCH_SIZE = 8
PRECISIONS = ("mixed", "bfloat16", "float32")
DEFAULT_PREFILL_CHUNK = 2048  # = keras_mha.cards.memory.DEFAULT_PREFILL_CHUNK


def _argparse_type(parse, flag: str):
    """`parse(text, flag=flag)` as an argparse type: the message without the flag's name,
    which argparse puts in front itself."""

    def convert(text: str):
        try:
            return parse(text, flag=flag)
        except UsageError as error:
            message = str(error)
            if message.startswith(f"{flag} "):
                message = message[len(flag) + 1 :]
            raise argparse.ArgumentTypeError(message) from None

    convert.__name__ = parse.__name__
    return convert


seq_lens_type = _argparse_type(units.parse_seq_lens, "--seq-len")
seq_len_type = _argparse_type(units.parse_seq_len, "--seq-len")
memory_size_type = _argparse_type(units.parse_memory_size, "--memory")


def dtype_type(flag: str):
    """An argparse type for a dtype flag accepting the usual aliases (bf16, fp8, ...).

    Example:
        >>> dtype_type("--kv-dtype")("FP16")
        'float16'
    """
    return _argparse_type(units.normalize_dtype, flag)


def positive_int_type(flag: str):
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{value} must be a positive integer")
        return value

    convert.__name__ = flag
    return convert


def seconds_type(text: str) -> float:
    """`--timeout`: a finite number of seconds in (0, `MAX_TIMEOUT_SECONDS`].

    Example:
        >>> seconds_type("2.5")
        2.5
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a number; expected seconds, e.g. 10 or 2.5"
        ) from None
    if not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is out of range; expected seconds in (0, {MAX_TIMEOUT_SECONDS:g}]"
        )
    return value


def add_memory_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `--gpu`/`--memory`, `--weights-dtype`, `--optimizer`, `--precision` and
    `--prefill-chunk` to a subcommand's parser.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_memory_arguments(parser)
        >>> parser.parse_args(["--memory", "24GiB"]).memory
        25769803776
    """
    target = parser.add_mutually_exclusive_group()
    target.add_argument(
        "--gpu",
        metavar="NAME",
        help="answer what fits on this accelerator (e.g. H100, A100-80GB, L4, RTX4090, T4; "
        "case-insensitive); an unknown name lists the known ones",
    )
    target.add_argument(
        "--memory",
        type=memory_size_type,
        metavar="SIZE",
        help="answer what fits in this much memory, e.g. 24GiB, 80GB, 512MiB",
    )
    parser.add_argument(
        "--weights-dtype",
        type=dtype_type("--weights-dtype"),
        default="bfloat16",
        metavar="DTYPE",
        help="weights for serving: float32, bfloat16, float16, float8, int8, int4 "
        "(aliases bf16, fp16, fp8, ...; default bfloat16)",
    )
    parser.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        default="adamw",
        help="optimizer for the training estimate (default adamw)",
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="mixed",
        help="training precision: mixed (16-bit with float32 master weights, the default), "
        "bfloat16 (no master weights) or float32",
    )
    parser.add_argument(
        "--prefill-chunk",
        type=positive_int_type("--prefill-chunk"),
        default=DEFAULT_PREFILL_CHUNK,
        metavar="TOKENS",
        help=f"tokens per prefill chunk in the serving estimate (default {DEFAULT_PREFILL_CHUNK})",
    )


def memory_request(arguments: argparse.Namespace):
    """The `MemoryRequest` the parsed flags ask for (resolving `--gpu`).

    Raises:
        UsageError: an unknown or ambiguous `--gpu` name.

    Example:
        >>> namespace = argparse.Namespace(gpu=None, memory=2**30, weights_dtype="int8",
        ...     optimizer="sgd", precision="float32", prefill_chunk=512)
        >>> memory_request(namespace).memory_bytes
        1073741824
    """
    from keras_mha.cards.gpus import find_gpu
    from keras_mha.cards.memory_report import MemoryRequest

    # `is not None`: an empty `--gpu ""` (an unset shell variable) is refused, not ignored.
    name = getattr(arguments, "gpu", None)
    gpu = find_gpu(name) if name is not None else None
    return MemoryRequest(
        weights_dtype=arguments.weights_dtype,
        prefill_chunk=arguments.prefill_chunk,
        optimizer=arguments.optimizer,
        precision=arguments.precision,
        memory_bytes=gpu.memory_bytes if gpu else getattr(arguments, "memory", None),
        gpu=gpu,
    )


def add_checkpoint_arguments(parser: argparse.ArgumentParser, *, data_help: str) -> None:
    """Add the flags of a command that reads a Hub checkpoint and writes one (`prune`,
    `convert`): SOURCE, `--out`, `--data` and how it is cut, `--dtype`, `--max-shard-size`,
    `--overwrite`, `--revision`, `--token`. `check_checkpoint_arguments` checks them.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_checkpoint_arguments(parser, data_help="text to train on")
        >>> parser.parse_args(["./model", "--out", "new"]).seq_len
        128
    """
    parser.add_argument("source", metavar="SOURCE", help="checkpoint folder or Hub model id")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder to write")
    # Listed under their own heading, after the command's own options.
    shared = parser.add_argument_group("text, output and Hub options")
    shared.add_argument("--data", metavar="FILE", help=data_help)
    for flag, default, meaning in (
        ("--max-tokens", DEFAULT_MAX_TOKENS, "use at most this many tokens of --data"),
        ("--seq-len", DEFAULT_SEQ_LEN, "tokens per example"),
        ("--batch-size", DEFAULT_BATCH_SIZE, "examples per batch"),
    ):
        shared.add_argument(
            flag,
            type=positive_int_type(flag),
            default=default,
            help=f"{meaning} (default {default})",
        )
    shared.add_argument(
        "--dtype",
        choices=CHECKPOINT_DTYPES,
        help="load and compute in this dtype (default: checkpoint's)",
    )
    shared.add_argument(
        "--max-shard-size",
        default="5GB",
        help="split the safetensors above this size (default 5GB)",
    )
    shared.add_argument(
        "--overwrite", action="store_true", help="replace --out when it holds a checkpoint"
    )
    shared.add_argument("--revision", help="Hub branch, tag or commit (Hub ids only)")
    shared.add_argument("--token", help="Hub token (default: HF_TOKEN or the stored login)")


def check_checkpoint_arguments(arguments: argparse.Namespace) -> None:
    """Refuse, before any loading, a `--data` that is not a text file, a bad
    `--max-shard-size`, or an `--out` that cannot be written (see
    `keras_mha.models.export_files.check_output_folder`).

    Raises:
        PathError, UsageError: one line naming the flag.

    Example:
        >>> check_checkpoint_arguments(parser.parse_args(["./m", "--out", "/"]))  # doctest: +SKIP
        Traceback (most recent call last):
        PathError: --out: '/' exists and is not empty; pass --overwrite ...
    """
    from pathlib import Path

    from keras_mha.errors import ExportError
    from keras_mha.models.export_files import check_output_folder, parse_size

    if arguments.data is not None:
        from keras_mha.commands.prune_data import check_text_file

        check_text_file(arguments.data)
    try:
        parse_size(arguments.max_shard_size)
    except ExportError as error:
        raise UsageError(
            f"--max-shard-size {arguments.max_shard_size!r}: expected e.g. 5GB, 500MB or 2GiB",
            key="--max-shard-size",
            value=arguments.max_shard_size,
        ) from error
    source = Path(arguments.source)
    check_output_folder(
        arguments.out,
        overwrite=arguments.overwrite,
        source=source if source.is_dir() else None,
    )


__all__ = [
    "CHECKPOINT_DTYPES",
    "OPTIMIZERS",
    "add_checkpoint_arguments",
    "check_checkpoint_arguments",
    "PRECISIONS",
    "add_memory_arguments",
    "dtype_type",
    "memory_request",
    "memory_size_type",
    "positive_int_type",
    "seconds_type",
    "seq_len_type",
    "seq_lens_type",
]
