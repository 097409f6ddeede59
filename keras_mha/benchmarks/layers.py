"""`keras-mha bench layers`: keras-mha's attention layers against Keras's built-ins.

On the current backend (`KERAS_BACKEND`) and with the same shapes in one run,
it measures

- `mha`: `keras_mha.layers.MultiHeadAttention` against
  `keras.layers.MultiHeadAttention`, forward and forward+backward;
- `gqa`: `keras_mha.layers.GroupedQueryAttention` against
  `keras.layers.GroupQueryAttention` (which repeats K/V), forward and
  forward+backward;
- `decode`: one cached decode step of `GroupedQueryAttention` at a context of
  `--decode-context` tokens (a fixed-shape KV cache from `init_cache`, the
  position passed as a tensor `cache_index`, a step compiled once) against
  recomputing the whole causal sequence of context + 1 tokens with our layer,
  and with `keras.layers.GroupQueryAttention` for reference.

How:

- Both sides get the same weights and inputs, and are compiled and
  differentiated the same way (`keras_mha.benchmarks.compiled`): `jax.jit` on
  JAX; `tf.function(jit_compile=True)` (XLA) on TensorFlow, or plain
  `tf.function` with `--no-tf-jit-compile`; eager on PyTorch, or
  `torch.compile` with `--torch-compile`. Forward+backward is
  `mean(output ** 2)` and its gradients with respect to the input and every
  trainable weight, by the backend's own autodiff. `max abs diff` checks that
  both sides computed the same thing.
- Time: the median of `--repeats` calls (`--decode-repeats` for the decode
  step) after `--warmup` calls, the first of which compiles. The
  implementations being compared are timed in one fresh process, their calls
  taking turns (A B, B A, ...), so that other work on the machine slows both
  alike; the process uses the backend's default allocator.
- Peak memory: in a fresh process per measurement, where freed memory goes
  back to the operating system (`keras_mha.benchmarks.memory`), after the
  same warm-up: the highest resident set size (kernel high-water mark) during
  3 calls minus the RSS just before them. That is the memory the call itself
  allocates - activations, attention logits, repeated K/V, gradients - not
  weights, inputs or compiled code, measured the same way on every backend.
- `--in-process` measures in this process instead (faster, used by the
  tests); memory figures are then rough (TensorFlow keeps freed memory in its
  pool, for one).

Example:
    >>> from keras_mha.benchmarks.layers import main
    >>> main(["--seq-len", "64", "--decode-context", "64", "--repeats", "3"])  # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from keras_mha.benchmarks.compiled import CompileOptions
from keras_mha.benchmarks.layers_report import evaluate_targets, format_markdown, format_table
from keras_mha.benchmarks.measure_layers import (
    CASES,
    DECODE_STEP,
    FORWARD,
    FORWARD_BACKWARD,
    KERAS,
    MEMORY_CALLS,
    OURS,
    RECOMPUTE,
    WORKER_MARKER,
    BenchmarkConfig,
    measure_memory,
    pin_to_cpus,
    time_interleaved,
    timing_groups,
)
from keras_mha.benchmarks.memory import ALLOCATOR_ENVIRONMENT

__all__ = ["BenchmarkConfig", "format_markdown", "format_table", "main", "run_benchmark"]

# A relative memory saving is only reported when the Keras side allocates this
# much; below it the RSS moves with allocator noise rather than the computation.
MEMORY_NOISE_FLOOR_MB = 1.0


def _run_in_fresh_process(request: dict, environment: dict):
    completed = subprocess.run(
        [sys.executable, "-m", "keras_mha.benchmarks.measure_layers", json.dumps(request)],
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    for line in reversed(completed.stdout.splitlines()):
        if line.startswith(WORKER_MARKER):
            return json.loads(line[len(WORKER_MARKER) :])
    what = request.get("specs") or request.get("spec")
    raise RuntimeError(
        f"the benchmark process for {what} ({request['purpose']}) failed with exit status "
        f"{completed.returncode}:\n{completed.stderr[-4000:]}"
    )


def _plain_environment() -> dict:
    environment = {**os.environ}
    environment.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return environment


def time_group(specs: list[dict], config: BenchmarkConfig, output_paths: list[str]) -> list[dict]:
    """Time `specs` together (calls interleaved), in a fresh process unless `--in-process`.

    Example:
        >>> group = timing_groups(BenchmarkConfig(seq_len=32))[0]
        >>> [f["median_ms"] > 0 for f in time_group(group, BenchmarkConfig(seq_len=32),
        ...                                          [None, None])]  # doctest: +SKIP
        [True, True]
    """
    if not config.isolate:
        pin_to_cpus(config.cpus)
        return time_interleaved(specs, config, output_paths)
    request = {
        "purpose": "time",
        "specs": specs,
        "config": config.to_dict(),
        "output_paths": output_paths,
    }
    return _run_in_fresh_process(request, _plain_environment())


def memory_of(spec: dict, config: BenchmarkConfig) -> dict:
    """Peak memory of one measurement, in a fresh process that returns freed memory.

    Example:
        >>> spec = {"case": "gqa", "implementation": "keras", "mode": "forward"}
        >>> memory_of(spec, BenchmarkConfig(seq_len=32))["peak_bytes"] >= 0  # doctest: +SKIP
        True
    """
    if not config.isolate:
        pin_to_cpus(config.cpus)
        return measure_memory(spec, config)
    request = {"purpose": "memory", "spec": spec, "config": config.to_dict()}
    return _run_in_fresh_process(request, {**_plain_environment(), **ALLOCATOR_ENVIRONMENT})


def _max_abs_diff(path_a: str, path_b: str) -> float | None:
    import numpy as np

    if not (os.path.exists(path_a) and os.path.exists(path_b)):
        return None
    return float(np.max(np.abs(np.load(path_a) - np.load(path_b))))


def _megabytes(value: int | None) -> float | None:
    return None if value is None else value / 2**20


def _paired_ratios(numerator: dict, denominator: dict) -> list[float]:
    """numerator time / denominator time for every round in which both ran.

    Calls of one round ran back to back in one process, so each ratio compares
    the two under the same conditions, however the machine's load changed.
    """
    denominator_by_round = dict(zip(denominator["rounds"], denominator["times_ms"], strict=True))
    return [
        time_ms / denominator_by_round[round_number]
        for round_number, time_ms in zip(numerator["rounds"], numerator["times_ms"], strict=True)
        if round_number in denominator_by_round
    ]


def _speedup(numerator: dict, denominator: dict) -> tuple[float, list[float] | None]:
    """Median of the paired ratios, and their quartiles when there are at least 4."""
    ratios = _paired_ratios(numerator, denominator)
    if not ratios:
        return numerator["median_ms"] / denominator["median_ms"], None
    if len(ratios) < 4:
        return statistics.median(ratios), None
    low, median, high = statistics.quantiles(ratios, n=4, method="inclusive")
    return statistics.median(ratios), [low, high]


def _comparisons(config, measurements, outputs) -> list[dict]:
    rows = []
    for case in ("mha", "gqa"):
        if case not in config.cases:
            continue
        for mode in (FORWARD, FORWARD_BACKWARD):
            ours, builtin = measurements[(case, OURS, mode)], measurements[(case, KERAS, mode)]
            speedup, quartiles = _speedup(builtin, ours)
            ours_mb, keras_mb = _megabytes(ours["peak_bytes"]), _megabytes(builtin["peak_bytes"])
            saving = None
            if ours_mb is not None and keras_mb is not None and keras_mb >= MEMORY_NOISE_FLOOR_MB:
                saving = 1.0 - ours_mb / keras_mb
            rows.append(
                {
                    "case": case,
                    "mode": mode,
                    "ours_ms": ours["median_ms"],
                    "keras_ms": builtin["median_ms"],
                    "speedup": speedup,
                    "speedup_quartiles": quartiles,
                    "ours_peak_mb": ours_mb,
                    "keras_peak_mb": keras_mb,
                    "memory_saving": saving,
                    "max_abs_diff": _max_abs_diff(
                        outputs[(case, OURS, mode)], outputs[(case, KERAS, mode)]
                    ),
                }
            )
    return rows


def _decode_summary(config, measurements, outputs) -> dict | None:
    if "decode" not in config.cases:
        return None
    step = measurements[("decode", OURS, DECODE_STEP)]
    rows = []
    for implementation, mode in ((OURS, DECODE_STEP), (OURS, RECOMPUTE), (KERAS, RECOMPUTE)):
        measured = measurements[("decode", implementation, mode)]
        rows.append(
            {
                "implementation": implementation,
                "mode": mode,
                "median_ms": measured["median_ms"],
                "peak_mb": _megabytes(measured["peak_bytes"]),
                "speedup_of_step": _speedup(measured, step)[0],
                "max_abs_diff_vs_step": _max_abs_diff(
                    outputs[("decode", implementation, mode)],
                    outputs[("decode", OURS, DECODE_STEP)],
                ),
            }
        )
    return {
        "context": config.decode_context,
        "rows": rows,
        "step_traces": step["traces"],
        "step_positions_before_timing": step["calls_before_measuring"],
    }


def run_benchmark(config: BenchmarkConfig, progress=None) -> dict:
    """Run every measurement of `config` and return the results as a dict.

    Args:
        config: a `BenchmarkConfig`.
        progress: optional callable receiving one line per measurement.

    Returns:
        A JSON-ready dict: `date`, `machine`, `environment` (backend, versions,
        device), `settings`, `measurements` (one per case/implementation/mode,
        with every timed call), `comparisons` (keras-mha against Keras per
        case and mode: median times; `speedup` = median over the timing rounds
        of Keras time / keras-mha time, the two calls of a round made back to
        back; `speedup_quartiles` = that ratio's quartiles; peak
        MB, `memory_saving` = 1 - ours / Keras, `max_abs_diff`), `decode`
        (step, recomputes, `speedup_of_step` = median of time / step time over
        the rounds with both) and
        `targets` (issue 2's targets, met or missed).

    Example:
        >>> results = run_benchmark(BenchmarkConfig(seq_len=32, decode_context=32,
        ...                                         repeats=2, isolate=False))
        >>> [row["case"] for row in results["comparisons"]]  # doctest: +SKIP
        ['mha', 'mha', 'gqa', 'gqa']
    """
    config.validate()
    measurements, outputs, environment = {}, {}, None
    with tempfile.TemporaryDirectory(prefix="keras-mha-bench-") as scratch:
        for group in timing_groups(config):
            keys = [(spec["case"], spec["implementation"], spec["mode"]) for spec in group]
            paths = [
                str(Path(scratch) / f"output_{len(outputs) + n}.npy") for n in range(len(keys))
            ]
            if progress:
                names = ", ".join(f"{implementation} {mode}" for _, implementation, mode in keys)
                progress(f"timing {keys[0][0]}: {names}")
            for key, path, figures in zip(
                keys, paths, time_group(group, config, paths), strict=True
            ):
                environment = figures.pop("environment")
                measurements[key], outputs[key] = figures, path
            for key, spec in zip(keys, group, strict=True):
                if progress:
                    progress(f"memory of {key[0]}: {key[1]} {key[2]}")
                memory = memory_of(spec, config)
                for name in ("peak_bytes", "first_call_peak_bytes", "memory_method"):
                    measurements[key][name] = memory[name]
        comparisons = _comparisons(config, measurements, outputs)
        decode = _decode_summary(config, measurements, outputs)

    measurement_rows = []
    for figures in measurements.values():
        row = {k: v for k, v in figures.items() if not k.endswith("_bytes")}
        row["peak_mb"] = _megabytes(figures["peak_bytes"])
        row["first_call_peak_mb"] = _megabytes(figures["first_call_peak_bytes"])
        measurement_rows.append(row)
    options = CompileOptions(config.tf_jit_compile, config.torch_compile)
    settings = {
        **config.to_dict(),
        "features": config.features,
        "compiled": options.describe(environment["backend"]),
        "memory_calls": MEMORY_CALLS,
        "memory_method": ", ".join(sorted({f["memory_method"] for f in measurements.values()})),
        "isolation": (
            "fresh processes: one per comparison for time, one per measurement for memory"
            if config.isolate
            else "in-process"
        ),
    }
    results = {
        "benchmark": "keras-mha bench layers",
        "date": datetime.date.today().isoformat(),
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
        },
        "environment": environment,
        "settings": settings,
        "measurements": measurement_rows,
        "comparisons": comparisons,
        "decode": decode,
    }
    results["targets"] = evaluate_targets(results)
    return results


def _parser() -> argparse.ArgumentParser:
    defaults = BenchmarkConfig()
    parser = argparse.ArgumentParser(
        prog="keras-mha bench layers",
        description=(
            "Time keras-mha attention layers against keras.layers.MultiHeadAttention and "
            "keras.layers.GroupQueryAttention on the current KERAS_BACKEND: forward, "
            "forward+backward and cached decode, with peak memory."
        ),
    )
    add = parser.add_argument
    add("--batch", type=int, default=defaults.batch, help="batch size (default %(default)s)")
    add(
        "--seq-len",
        type=int,
        default=defaults.seq_len,
        help="sequence length of the mha and gqa cases (default %(default)s)",
    )
    add("--heads", type=int, default=defaults.heads, help="query heads (default %(default)s)")
    add(
        "--kv-heads",
        type=int,
        default=defaults.kv_heads,
        help="key/value heads of the gqa and decode cases (default %(default)s)",
    )
    add("--head-dim", type=int, default=defaults.head_dim, help="head size (default %(default)s)")
    add("--hidden", type=int, default=None, help="input/output features (default heads*head-dim)")
    add(
        "--decode-context",
        type=int,
        default=defaults.decode_context,
        help="tokens in the KV cache before the decode step (default %(default)s)",
    )
    add(
        "--repeats",
        type=int,
        default=defaults.repeats,
        help="timed calls per measurement; the median is reported (default %(default)s)",
    )
    add(
        "--decode-repeats",
        type=int,
        default=defaults.decode_repeats,
        help="timed decode steps (default %(default)s)",
    )
    add(
        "--warmup",
        type=int,
        default=defaults.warmup,
        help="untimed calls first; the first compiles (default %(default)s)",
    )
    add("--cases", default=",".join(CASES), help="comma-separated subset of %(default)s")
    add(
        "--no-causal",
        dest="causal",
        action="store_false",
        help="non-causal attention in the mha and gqa cases (default: causal)",
    )
    add(
        "--no-tf-jit-compile",
        dest="tf_jit_compile",
        action="store_false",
        help="TensorFlow: plain tf.function instead of tf.function(jit_compile=True)",
    )
    add("--torch-compile", action="store_true", help="PyTorch: wrap the calls in torch.compile")
    add(
        "--in-process",
        dest="isolate",
        action="store_false",
        help="measure in this process instead of fresh processes (rough memory figures)",
    )
    add(
        "--cpus",
        type=int,
        default=None,
        help="pin each measurement process to this many CPUs (default: all it may use)",
    )
    add("--format", choices=("table", "json", "markdown"), default="table")
    add("--quiet", action="store_true", help="no progress lines on stderr")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark from command-line arguments, print the report, return 0 (2 on bad flags).

    Example:
        >>> main(["--cases", "decode", "--decode-context", "256", "--format", "json"])
        ... # doctest: +SKIP
        0
    """
    args = _parser().parse_args(argv)
    config = BenchmarkConfig(
        batch=args.batch,
        seq_len=args.seq_len,
        heads=args.heads,
        kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        hidden=args.hidden,
        decode_context=args.decode_context,
        repeats=args.repeats,
        decode_repeats=args.decode_repeats,
        warmup=args.warmup,
        causal=args.causal,
        cases=tuple(case.strip() for case in args.cases.split(",") if case.strip()),
        tf_jit_compile=args.tf_jit_compile,
        torch_compile=args.torch_compile,
        isolate=args.isolate,
        cpus=args.cpus,
    )
    try:
        config.validate()
    except ValueError as error:
        sys.stderr.write(f"keras-mha bench layers: error: {error}\n")
        return 2
    progress = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    results = run_benchmark(config, progress=progress)
    if args.format == "json":
        sys.stdout.write(json.dumps(results, indent=2) + "\n")
    elif args.format == "markdown":
        sys.stdout.write(format_markdown(results))
    else:
        sys.stdout.write(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
