"""Command-line options shared by `inspect` and `compare`: lengths, dtypes, memory sizes,
and the memory planner's flags. Pure Python (no keras, backend or numpy import).

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


#: Defaults of the commands that read text through a checkpoint (`prune --data`, `heads --text`).
DEFAULT_MAX_TOKENS = 16384
DEFAULT_SEQ_LEN = 128
DEFAULT_BATCH_SIZE = 8


def add_text_batching_arguments(
    parser: argparse.ArgumentParser, *, text_flag: str, seq_len_help: str, batch_help: str
) -> None:
    """Add `--max-tokens`, `--seq-len` and `--batch-size` (positive integers) to a parser.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_text_batching_arguments(parser, text_flag="--data", seq_len_help="tokens per "
        ...     "example", batch_help="examples per batch")
        >>> parser.parse_args(["--seq-len", "64"]).seq_len
        64
    """
    for flag, default, help_text in (
        ("--max-tokens", DEFAULT_MAX_TOKENS, f"use at most this many tokens of {text_flag}"),
        ("--seq-len", DEFAULT_SEQ_LEN, seq_len_help),
        ("--batch-size", DEFAULT_BATCH_SIZE, batch_help),
    ):
        parser.add_argument(
            flag,
            type=positive_int_type(flag),
            default=default,
            help=f"{help_text} (default {default})",
        )


def add_hub_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `--revision` and `--token`, for a MODEL that may be a Hub model id.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_hub_checkpoint_arguments(parser)
        >>> parser.parse_args(["--revision", "main"]).revision
        'main'
    """
    parser.add_argument("--revision", help="Hub branch, tag or commit (Hub ids only)")
    parser.add_argument("--token", help="Hub token (default: HF_TOKEN or the stored login)")


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


__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_SEQ_LEN",
    "OPTIMIZERS",
    "PRECISIONS",
    "add_hub_checkpoint_arguments",
    "add_memory_arguments",
    "add_text_batching_arguments",
    "dtype_type",
    "memory_request",
    "memory_size_type",
    "positive_int_type",
    "seconds_type",
    "seq_len_type",
    "seq_lens_type",
]
