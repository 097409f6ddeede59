"""Command-line options shared by `inspect` and `compare`: lengths, dtypes, memory sizes,
and the memory planner's flags. Pure Python (no keras, backend or numpy import).

The argparse `type=` functions turn `keras_mha.errors.UsageError` into argparse's own
error (exit 2) with the same one-line message; `memory_request` resolves `--gpu` /
`--memory` after parsing and raises `UsageError` itself.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_memory_arguments(parser)
    >>> arguments = parser.parse_args(["--gpu", "2xrtx4090", "--weights-dtype", "int4"])
    >>> request = memory_request(arguments)
    >>> request.devices.name, request.weights_dtype
    ('2x RTX 4090 24GB', 'int4')
"""

from __future__ import annotations

import argparse
import math

# Defaults of the commands that read text through a checkpoint (`prune --data`, `heads
# --text`) are the library's, which `head_roles` uses too.
from keras_mha.data import DEFAULT_BATCH_SIZE, DEFAULT_MAX_TOKENS, DEFAULT_SEQ_LEN
from keras_mha.errors import UsageError
from keras_mha.hub.settings import MAX_TIMEOUT_SECONDS  # the longest --timeout (a day)
from keras_mha.planning.planner import units
from keras_mha.planning.planner.devices import (
    DEFAULT_MEMORY_UTILIZATION,
    parse_device_count,
    parse_fraction,
)

OPTIMIZERS = ("adamw", "adam", "sgd-momentum", "sgd")
PRECISIONS = ("mixed", "bfloat16", "float32")
DEFAULT_PREFILL_CHUNK = 2048  # = keras_mha.planning.planner.memory.DEFAULT_PREFILL_CHUNK
#: `prune` / `convert`: dtypes a checkpoint is loaded and written in.
CHECKPOINT_DTYPES = ("float32", "bfloat16", "float16")


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
        digits = _argparse_type(units.bounded_text, flag)(text).strip().removeprefix("-")
        # ASCII digits only, as `keras_mha.plan` takes them: int() would also read "٢".
        if not (digits.isascii() and digits.isdigit()):
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer")
        value = int(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{value} must be a positive integer")
        return value

    convert.__name__ = flag
    return convert


#: The `--help` epilog of the commands that run a model (`heads`, `prune`, `convert`).
BACKEND_EPILOG = (
    "Models run on the Keras backend that KERAS_BACKEND names: jax, torch or tensorflow "
    "(e.g. KERAS_BACKEND=jax keras-mha ...). Unset, Keras's own choice (~/.keras/keras.json, "
    "else tensorflow), or the backend installed when that one is not."
)


def add_text_batching_arguments(
    parser: argparse.ArgumentParser, *, text_flag: str, seq_len_help: str, batch_help: str
) -> None:
    """Add `--max-tokens`, `--seq-len` and `--batch-size` (also spelled `--batch`, as
    `inspect` and `compare` spell it), positive integers, to a parser.

    `--seq-len` stays None unless given: `fit_text_batching_to_model` then makes it
    `DEFAULT_SEQ_LEN`, or the model's `max_position_embeddings` when that is smaller.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_text_batching_arguments(parser, text_flag="--data", seq_len_help="tokens per "
        ...     "example", batch_help="examples per batch")
        >>> arguments = parser.parse_args(["--seq-len", "64", "--batch", "4"])
        >>> arguments.seq_len, arguments.batch_size
        (64, 4)
    """
    for flags, default, shown_default, help_text in (
        (
            ("--max-tokens",),
            DEFAULT_MAX_TOKENS,
            DEFAULT_MAX_TOKENS,
            f"use at most this many tokens of {text_flag}",
        ),
        (
            ("--seq-len",),
            None,
            f"{DEFAULT_SEQ_LEN}, or the model's max_position_embeddings when smaller",
            f"{seq_len_help}, at most the model's max_position_embeddings",
        ),
        (("--batch-size", "--batch"), DEFAULT_BATCH_SIZE, DEFAULT_BATCH_SIZE, batch_help),
    ):
        alias = f"; also {flags[1]}" if len(flags) > 1 else ""
        parser.add_argument(
            *flags,
            dest=flags[0].removeprefix("--").replace("-", "_"),
            type=positive_int_type(flags[0]),
            default=default,
            help=f"{help_text} (default {shown_default}{alias})",
        )


def fit_text_batching_to_model(model, arguments) -> None:
    """Fit `--seq-len` to the model's positions (its default shrinks to them; a larger
    value is refused) and refuse a `--batch-size` of such sequences that the device's
    memory cannot hold, before any work.

    Raises:
        UsageError: naming the flag, the value and the limit.

    Example:
        >>> fit_text_batching_to_model(model, arguments)  # doctest: +SKIP
    """
    from keras_mha.errors import UsageError
    from keras_mha.models.limits import check_memory, max_positions, model_spec

    positions = max_positions(model)
    if arguments.seq_len is None:
        arguments.seq_len = min(DEFAULT_SEQ_LEN, positions or DEFAULT_SEQ_LEN)
    elif positions is not None and arguments.seq_len > positions:
        raise UsageError(
            f"--seq-len {arguments.seq_len}: this model has max_position_embeddings={positions}; "
            f"expected at most {positions}",
            key="--seq-len",
            value=arguments.seq_len,
        )
    spec = model_spec(model)
    if spec is not None:
        check_memory(
            spec,
            batch=arguments.batch_size,
            seq_len=arguments.seq_len,
            dtype=str(getattr(model, "compute_dtype", None) or "float32"),
            argument="--batch-size / --seq-len",
        )


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


def add_hub_arguments(parser: argparse.ArgumentParser, *, revision: bool = True) -> None:
    """How a command reaches the Hub, spelled alike everywhere: `--revision`, `--token`,
    `--offline`, `--endpoint`, `--timeout`.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_hub_arguments(parser)
        >>> parser.parse_args(["--offline", "--timeout", "3"]).timeout
        3.0
    """
    if revision:
        parser.add_argument("--revision", help="Hub branch, tag or commit (default: main)")
    parser.add_argument("--token", help="Hub token (default: HF_TOKEN or the stored login)")
    parser.add_argument(
        "--offline",
        action="store_true",
        help="never touch the network: the HF cache only (inspect and compare then fall "
        "back to the bundled card; also HF_HUB_OFFLINE=1)",
    )
    parser.add_argument("--endpoint", help="Hub endpoint URL (default: HF_ENDPOINT)")
    parser.add_argument(
        "--timeout",
        type=seconds_type,
        default=10.0,
        help="seconds each exchange with the Hub may take (default 10; HF_HUB_ETAG_TIMEOUT wins)",
    )


def hub_options(arguments: argparse.Namespace):
    """The `HubOptions` of `add_hub_arguments`' flags (`--offline` absent: the environment
    decides, as `load_config(offline=None)` does).

    Example:
        >>> hub_options(argparse.Namespace(token=None, offline=True, endpoint=None,
        ...                                timeout=3.0)).offline
        True
    """
    from keras_mha.planning.plan import HubOptions

    return HubOptions(
        revision=getattr(arguments, "revision", None),
        token=arguments.token,
        endpoint=arguments.endpoint,
        offline=True if arguments.offline else None,
        timeout=arguments.timeout,
    )


def add_memory_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the planner's flags to a subcommand's parser: `--gpu`/`--memory`, `--gpus`,
    `--pipeline-parallel`, `--memory-utilization`, `--weights-dtype`, `--optimizer`,
    `--precision`, `--prefill-chunk` and `--wide`.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_memory_arguments(parser)
        >>> parser.parse_args(["--memory", "2x24GiB"]).memory
        '2x24GiB'
    """
    target = parser.add_mutually_exclusive_group()
    target.add_argument(
        "--gpu",
        metavar="NAME",
        help="answer what fits on this accelerator, or several: H100, 2xH100, H100x2, "
        "A100-80GB, L4, RTX4090, TPU-v5e, ... (case-insensitive; `keras-mha gpus` lists them)",
    )
    target.add_argument(
        "--memory",
        metavar="SIZE",
        help="answer what fits in devices of this much memory: 24GiB, 80GB, 2x80GiB",
    )
    parser.add_argument(
        "--gpus",
        type=_argparse_type(parse_device_count, "--gpus"),
        metavar="N",
        help="number of devices of --gpu or --memory (same as 2xH100; default 1)",
    )
    parser.add_argument(
        "--pipeline-parallel",
        type=_argparse_type(parse_device_count, "--pipeline-parallel"),
        default=1,
        metavar="P",
        help="pipeline stages the devices form (default 1); each stage splits its layers "
        "tensor-parallel over devices / P",
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        "--memory-utilization",
        dest="memory_utilization",
        type=fraction_type,
        default=DEFAULT_MEMORY_UTILIZATION,
        metavar="F",
        help="share of each device's memory the plan fills, as vLLM's "
        f"--gpu-memory-utilization (default {DEFAULT_MEMORY_UTILIZATION}); the rest is left "
        "for the CUDA context, CUDA graphs and fragmentation",
    )
    parser.add_argument(
        "--weights-dtype",
        type=dtype_type("--weights-dtype"),
        default=None,
        metavar="DTYPE",
        help="weights for serving: float32, bfloat16, float16, float8, int8, int4 (aliases "
        "bf16, fp16, fp8, ...; default: the checkpoint's own format, from its "
        "quantization_config or torch_dtype)",
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
    add_wide_argument(parser)


def add_wide_argument(parser: argparse.ArgumentParser) -> None:
    """`--wide`: no line of the table is wrapped or abbreviated."""
    parser.add_argument(
        "--wide",
        action="store_true",
        help="table format: every column and whole lines, however wide (default: fit the "
        "terminal, or 80 columns when piped)",
    )


def add_kv_dtype_argument(parser: argparse.ArgumentParser) -> None:
    """`--kv-dtype`, with the usual aliases (bf16, fp8, ...)."""
    parser.add_argument(
        "--kv-dtype",
        default="bfloat16",
        type=dtype_type("--kv-dtype"),
        metavar="DTYPE",
        help=f"KV-cache element type: {', '.join(units.DTYPES)} (aliases bf16, fp16, fp8, "
        "fp32, ...; default bfloat16)",
    )


def add_batch_argument(parser: argparse.ArgumentParser, *, help_text: str, default: int) -> None:
    """`--batch` (also spelled `--batch-size`, as `prune` and most tools do)."""
    parser.add_argument(
        "--batch",
        "--batch-size",
        dest="batch",
        type=positive_int_type("--batch"),
        default=default,
        metavar="B",
        help=help_text,
    )


def memory_request(arguments: argparse.Namespace):
    """The `MemoryRequest` the parsed flags ask for (resolving `--gpu` / `--memory` and the
    device flags into a `DeviceSet`).

    Raises:
        UsageError: an unknown or ambiguous `--gpu` name, a bad `--memory` size, device
            flags without `--gpu` or `--memory`, or counts that contradict each other.

    Example:
        >>> namespace = argparse.Namespace(gpu=None, memory="2x1GiB", weights_dtype="int8",
        ...     optimizer="sgd", precision="float32", prefill_chunk=512)
        >>> request = memory_request(namespace)
        >>> request.devices.count, request.devices.memory_bytes
        (2, 1073741824)
    """
    from keras_mha.planning.planner.devices import parse_devices
    from keras_mha.planning.planner.request import MemoryRequest

    gpu, size = getattr(arguments, "gpu", None), getattr(arguments, "memory", None)
    count = getattr(arguments, "gpus", None)
    stages = getattr(arguments, "pipeline_parallel", 1)
    utilization = getattr(arguments, "memory_utilization", DEFAULT_MEMORY_UTILIZATION)
    devices = None
    # `is not None`: an empty `--gpu ""` (an unset shell variable) is refused, not ignored.
    if gpu is not None or size is not None:
        devices = parse_devices(gpu=gpu, memory=size, gpus=count, pipeline_parallel=stages,
                                memory_utilization=utilization)  # fmt: skip
    elif count is not None or stages != 1:
        flag = "--gpus" if count is not None else "--pipeline-parallel"
        raise UsageError(
            f"{flag} needs the devices named: add --gpu NAME (e.g. H100) or --memory SIZE",
            key=flag,
            value=count if count is not None else stages,
        )
    return MemoryRequest(
        weights_dtype=arguments.weights_dtype,
        prefill_chunk=arguments.prefill_chunk,
        optimizer=arguments.optimizer,
        precision=arguments.precision,
        devices=devices,
    )


def fraction_type(text: str) -> float:
    """`--memory-utilization`: a share in (0, 1].

    Example:
        >>> fraction_type("0.85")
        0.85
    """
    try:
        return parse_fraction(text)
    except UsageError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--memory-utilization ")) from None


def add_checkpoint_arguments(parser: argparse.ArgumentParser, *, data_help: str) -> None:
    """Add the flags of a command that reads a Hub checkpoint and writes one (`prune`,
    `convert`): SOURCE, `--out`, then, under their own heading, `--data` and how it is
    cut, `--dtype`, `--max-shard-size`, `--overwrite` and the Hub flags.
    `check_checkpoint_arguments` checks them; `load_checkpoint` loads SOURCE with them.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_checkpoint_arguments(parser, data_help="text to train on")
        >>> parser.parse_args(["./model", "--out", "new", "--batch", "4"]).batch_size
        4
    """
    parser.add_argument("source", metavar="SOURCE", help="checkpoint folder or Hub model id")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder to write")
    # Listed under their own heading, after the command's own options.
    shared = parser.add_argument_group("text, output and Hub options")
    shared.add_argument("--data", metavar="FILE", help=data_help)
    add_text_batching_arguments(
        shared,
        text_flag="--data",
        seq_len_help="tokens per sequence (each example)",
        batch_help="examples per batch",
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
    add_wide_argument(shared)
    add_hub_arguments(shared)


def check_checkpoint_arguments(arguments: argparse.Namespace) -> list:
    """Refuse, before any loading, a `--data` that is not a text file, a bad
    `--max-shard-size`, an `--out` that cannot be written or that is, holds or lies in
    SOURCE (see `keras_mha.models.export_files.check_output_folder`), or a SOURCE file
    the export would copy that leads out of SOURCE. Returns the protected source
    folders (`[SOURCE]` when it is a local folder, else `[]`).

    Raises:
        PathError, UsageError, CheckpointError: one line naming the flag.

    Example:
        >>> check_checkpoint_arguments(parser.parse_args(["./m", "--out", "/"]))  # doctest: +SKIP
        Traceback (most recent call last):
        PathError: --out: '/' exists and is not empty; pass --overwrite ...
    """
    from pathlib import Path

    from keras_mha.errors import ExportError
    from keras_mha.models.export_files import check_output_folder, parse_size

    if arguments.data is not None:
        from keras_mha.data.text import check_text_file

        check_text_file(arguments.data)
    try:
        parse_size(arguments.max_shard_size)
    except ExportError as error:
        raise UsageError(
            f"--max-shard-size {arguments.max_shard_size!r}: expected e.g. 5GB, 500MB or 2GiB",
            key="--max-shard-size",
            value=arguments.max_shard_size,
        ) from error
    source = Path(arguments.source).expanduser()
    sources = [source] if source.is_dir() else []
    check_output_folder(arguments.out, overwrite=arguments.overwrite, source=sources)
    if sources:
        from keras_mha.models.export import source_files

        source_files(source)  # the files the export copies stay inside SOURCE
    return sources


def load_checkpoint(arguments: argparse.Namespace, source: str):
    """`keras_mha.models.export.load_for_pruning(source)` with the parsed `--dtype` and
    Hub flags.

    Example:
        >>> model = load_checkpoint(arguments, arguments.source)  # doctest: +SKIP
    """
    from keras_mha.models.export import load_for_pruning

    return load_for_pruning(
        source, dtype=arguments.dtype, revision=arguments.revision,
        token=arguments.token, endpoint=arguments.endpoint,
        offline=True if arguments.offline else None, timeout=arguments.timeout,
    )  # fmt: skip


__all__ = [
    "CHECKPOINT_DTYPES",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_SEQ_LEN",
    "OPTIMIZERS",
    "PRECISIONS",
    "add_batch_argument",
    "add_checkpoint_arguments",
    "add_hub_arguments",
    "hub_options",
    "add_kv_dtype_argument",
    "add_memory_arguments",
    "add_text_batching_arguments",
    "add_wide_argument",
    "check_checkpoint_arguments",
    "load_checkpoint",
    "fraction_type",
    "dtype_type",
    "memory_request",
    "memory_size_type",
    "positive_int_type",
    "seconds_type",
    "seq_len_type",
    "seq_lens_type",
]
