"""Measurements of `keras-mha bench layers`: build, compile, warm up, then time or measure memory.

`keras_mha.benchmarks.layers` plans the measurements and runs them here,
usually in fresh processes (`python -m keras_mha.benchmarks.measure_layers
REQUEST_JSON`, which prints its answer as one JSON line): the measurements of
one comparison are timed together, their calls interleaved
(`time_interleaved`); the memory of each is measured in a process of its own
(`measure_memory`).

A measurement is one (case, implementation, mode):

- `mha`: `keras_mha.layers.MultiHeadAttention` (keras-mha) or
  `keras.layers.MultiHeadAttention` (keras); forward or forward+backward.
- `gqa`: `keras_mha.layers.GroupedQueryAttention` or
  `keras.layers.GroupQueryAttention`; forward or forward+backward.
- `decode`: `GroupedQueryAttention`'s cached decode step or its recompute of
  the whole sequence, and `keras.layers.GroupQueryAttention`'s recompute.

Both implementations get the same weights: a keras-mha layer is filled from a
fixed NumPy generator and, for the Keras side, copied over with
`keras_mha.layers.copy_weights_to_keras`.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

CASES = ("mha", "gqa", "decode")
FORWARD, FORWARD_BACKWARD = "forward", "forward+backward"
DECODE_STEP, RECOMPUTE = "decode step", "recompute"
OURS, KERAS = "keras-mha", "keras"
# Calls inside the peak-memory window (after the warm-up): the peak repeats each call.
MEMORY_CALLS = 3

WORKER_MARKER = "KERAS_MHA_BENCH_RESULT "


@dataclass
class BenchmarkConfig:
    """Shapes and settings of one benchmark run.

    Args:
        batch: batch size.
        seq_len: sequence length of the `mha` and `gqa` cases.
        heads: query heads.
        kv_heads: key/value heads of the `gqa` and `decode` cases (`mha` uses
            `heads`).
        head_dim: size of each head.
        hidden: input and output features; default `heads * head_dim`.
        decode_context: tokens already in the cache for the decode step.
        repeats: timed calls per forward / forward+backward / recompute.
        decode_repeats: timed calls of the decode step (each is short).
        warmup: untimed calls before timing, at least 1 (the first compiles).
        causal: causal self-attention in the `mha` and `gqa` cases (the
            decode case is always causal).
        cases: which of `mha`, `gqa`, `decode` to run.
        tf_jit_compile: XLA on TensorFlow.
        torch_compile: `torch.compile` on PyTorch.
        isolate: fresh processes: one per timing group (`timing_groups`) and
            one per measurement for its memory.
        cpus: pin each measurement process to this many CPUs (the backends
            size their thread pools to the CPUs a process may use); None
            leaves the process free to use every CPU.

    Example:
        >>> BenchmarkConfig(heads=8, head_dim=64).features
        512
    """

    batch: int = 1
    seq_len: int = 1024
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 64
    hidden: int | None = None
    decode_context: int = 2048
    repeats: int = 10
    decode_repeats: int = 100
    warmup: int = 2
    causal: bool = True
    cases: tuple[str, ...] = CASES
    tf_jit_compile: bool = True
    torch_compile: bool = False
    isolate: bool = True
    cpus: int | None = None

    @property
    def features(self) -> int:
        return self.hidden or self.heads * self.head_dim

    def validate(self) -> None:
        """Raise `ValueError` naming the first bad setting and its value.

        Example:
            >>> BenchmarkConfig(heads=8, kv_heads=3).validate()
            Traceback (most recent call last):
            ...
            ValueError: --kv-heads=3 must divide --heads=8
        """
        for name in ("batch", "seq_len", "heads", "kv_heads", "head_dim", "decode_context"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be a positive integer; got {value!r}"
                )
        for name in ("repeats", "decode_repeats", "warmup"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be an integer >= 1; got {value!r}"
                )
        for name in ("hidden", "cpus"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"--{name} must be a positive integer; got {value!r}")
        if self.cpus is not None:
            available = len(_schedulable_cpus())
            if self.cpus > available:
                raise ValueError(
                    f"--cpus={self.cpus} but this process may only use {available} CPU(s)"
                )
        if self.heads % self.kv_heads:
            raise ValueError(f"--kv-heads={self.kv_heads} must divide --heads={self.heads}")
        unknown = [case for case in self.cases if case not in CASES]
        if unknown or not self.cases:
            raise ValueError(
                f"--cases must be a comma-separated subset of {','.join(CASES)}; "
                f"got {','.join(self.cases)!r}"
            )

    def to_dict(self) -> dict:
        """A JSON-ready dict; `from_dict` reverses it.

        Example:
            >>> BenchmarkConfig.from_dict(BenchmarkConfig().to_dict()) == BenchmarkConfig()
            True
        """
        values = asdict(self)
        values["cases"] = list(self.cases)
        return values

    @classmethod
    def from_dict(cls, values: dict) -> BenchmarkConfig:
        values = dict(values)
        values["cases"] = tuple(values["cases"])
        return cls(**values)


def _schedulable_cpus() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def pin_to_cpus(count: int | None) -> None:
    """Restrict this process to its first `count` usable CPUs (Linux); None does nothing.

    Call it before the backend starts its thread pools: JAX, TensorFlow and
    PyTorch size them to the CPUs the process may use.

    Example:
        >>> pin_to_cpus(None)
    """
    if count is None:
        return
    if not hasattr(os, "sched_setaffinity"):
        raise ValueError(f"--cpus={count} needs os.sched_setaffinity, which this platform lacks")
    os.sched_setaffinity(0, set(_schedulable_cpus()[:count]))


def measurement_plan(config: BenchmarkConfig) -> list[dict]:
    """Every (case, implementation, mode) that `config` asks for, in run order.

    Example:
        >>> [m["mode"] for m in measurement_plan(BenchmarkConfig(cases=("decode",)))]
        ['decode step', 'recompute', 'recompute']
    """
    plan = []
    for case in config.cases:
        if case == "decode":
            plan += [
                {"case": case, "implementation": OURS, "mode": DECODE_STEP},
                {"case": case, "implementation": OURS, "mode": RECOMPUTE},
                {"case": case, "implementation": KERAS, "mode": RECOMPUTE},
            ]
        else:
            for mode in (FORWARD, FORWARD_BACKWARD):
                for implementation in (OURS, KERAS):
                    plan.append({"case": case, "implementation": implementation, "mode": mode})
    return plan


def _layer_pair(case: str, config: BenchmarkConfig):
    """(keras-mha layer, the matching Keras built-in, causal) for `case`."""
    import keras

    from keras_mha.layers import GroupedQueryAttention, MultiHeadAttention

    causal = config.causal or case == "decode"
    if case == "mha":
        ours = MultiHeadAttention(num_heads=config.heads, head_dim=config.head_dim, causal=causal)
        builtin = keras.layers.MultiHeadAttention(num_heads=config.heads, key_dim=config.head_dim)
    else:
        ours = GroupedQueryAttention(
            num_heads=config.heads,
            num_key_value_heads=config.kv_heads,
            head_dim=config.head_dim,
            causal=causal,
        )
        builtin = keras.layers.GroupQueryAttention(
            head_dim=config.head_dim,
            num_query_heads=config.heads,
            num_key_value_heads=config.kv_heads,
        )
    return ours, builtin, causal


def _set_deterministic_weights(layer, seed: int) -> None:
    """Fill the trainable weights from a fixed NumPy generator, scaled by fan-in."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for variable in layer.trainable_variables:
        shape = tuple(variable.shape)
        if len(shape) == 1 or len(shape) == 2 and not variable.path.endswith("kernel"):
            scale = 0.02  # biases
        elif variable.path.endswith("output_kernel"):
            scale = (shape[0] * shape[1]) ** -0.5  # (heads, head_dim, features)
        else:
            scale = shape[0] ** -0.5  # (features, heads, head_dim)
        variable.assign(rng.normal(scale=scale, size=shape).astype("float32"))


def environment() -> dict:
    """Backend, library versions and the device the backend computes on.

    Example:
        >>> environment()["backend"] in ("jax", "tensorflow", "torch")
        True
    """
    import keras

    backend = keras.backend.backend()
    versions = {"keras": keras.__version__}
    device = "cpu"
    if backend == "jax":
        import jax

        versions["jax"] = jax.__version__
        device = jax.devices()[0].platform
    elif backend == "tensorflow":
        import tensorflow as tf

        versions["tensorflow"] = tf.__version__
        device = "gpu" if tf.config.list_logical_devices("GPU") else "cpu"
    elif backend == "torch":
        import torch

        versions["torch"] = torch.__version__
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return {"backend": backend, "versions": versions, "device": device}


def _prepare(spec: dict, config: BenchmarkConfig):
    """Build the layer and inputs; compile the call. Returns (call, warm-up args, timed args)."""
    import keras
    import numpy as np
    from keras import ops

    from keras_mha.benchmarks import compiled
    from keras_mha.layers import copy_weights_to_keras

    options = compiled.CompileOptions(config.tf_jit_compile, config.torch_compile)
    ours, builtin, causal = _layer_pair(spec["case"], config)
    length = config.decode_context + 1 if spec["case"] == "decode" else config.seq_len
    rng = np.random.default_rng(1234)
    x = ops.convert_to_tensor(
        rng.normal(size=(config.batch, length, config.features)).astype("float32")
    )
    probe = x[:, :4]
    ours(probe)
    _set_deterministic_weights(ours, seed=42)
    if spec["implementation"] == OURS:
        layer, arguments, call_kwargs = ours, (lambda x: (x,)), {}
    else:
        builtin(probe, probe)
        copy_weights_to_keras(ours, builtin)
        layer, arguments, call_kwargs = builtin, (lambda x: (x, x)), {"use_causal_mask": causal}
        del ours

    if spec["mode"] == DECODE_STEP:
        context = config.decode_context
        cache = layer.init_cache(config.batch, max_length=context + 1)
        _, cache = layer(x[:, :context], cache=cache, cache_index=0)  # prefill, untimed
        # Eager torch would keep the prefill's autograd graph alive through the cache.
        cache = keras.tree.map_structure(ops.stop_gradient, cache)
        call = compiled.compile_decode_step(layer, cache, options)
        # The warm-up steps feed the last context positions their own tokens again
        # (the cache ends up holding the same keys and values), each at another
        # position, so `traces` shows whether the step recompiles per position.
        # The last warm-up step and every measured step are the token at `context`.
        warmup_calls = [
            (x[:, position : position + 1], ops.convert_to_tensor(position, dtype="int32"))
            for position in range(context - config.warmup + 2, context + 1)
        ]
        measured_call = (x[:, context:], ops.convert_to_tensor(context, dtype="int32"))
        return call, [*warmup_calls, measured_call], measured_call
    if spec["mode"] == FORWARD_BACKWARD:
        call = compiled.compile_forward_backward(layer, x, arguments, call_kwargs, options)
    else:
        call = compiled.compile_forward(layer, x, arguments, call_kwargs, options)
    return call, [()] * config.warmup, ()


def _warm_up(call, warmup_calls, spec, output_path):
    """Run the warm-up calls (the first compiles) and save the last result for the cross-check."""
    import numpy as np
    from keras import ops

    for arguments in warmup_calls:
        result = call.run(*arguments)
    if spec["mode"] == RECOMPUTE:
        result = result[:, -1:]  # the position that the decode step computes
    if output_path:
        np.save(output_path, np.asarray(ops.convert_to_numpy(result), dtype="float32"))


def _rounds_for(calls: int, rounds: int) -> set[int]:
    """`calls` round numbers spread evenly over `range(rounds)`."""
    return {(index * rounds) // calls for index in range(calls)}


def time_interleaved(specs: list[dict], config: BenchmarkConfig, output_paths=None) -> list[dict]:
    """Time several measurements in this process, their calls interleaved.

    Each spec is built, compiled and warmed up; then the timed calls take turns
    (A B, then B A, ...), so that whatever else the machine is doing slows
    every implementation alike instead of whichever ran at a bad moment.
    Specs with fewer calls (a recompute beside 10x as many decode steps) are
    spread evenly over the rounds.

    Args:
        specs: measurements from `measurement_plan`, usually one case and mode.
        config: the run's `BenchmarkConfig`.
        output_paths: optional `.npy` path per spec for the last warm-up result.

    Returns:
        One dict per spec: the spec, `times_ms`, `rounds` (the round of each
        timed call), `median_ms`, `min_ms`, `traces`, `calls_before_measuring`
        and `environment`.

    Example:
        >>> specs = measurement_plan(BenchmarkConfig(cases=("gqa",)))[:2]
        >>> [f["median_ms"] > 0 for f in time_interleaved(specs, BenchmarkConfig())]
        ... # doctest: +SKIP
        [True, True]
    """
    output_paths = output_paths or [None] * len(specs)
    prepared = []
    for spec, output_path in zip(specs, output_paths, strict=True):
        call, warmup_calls, measured_call = _prepare(spec, config)
        _warm_up(call, warmup_calls, spec, output_path)
        repeats = config.decode_repeats if spec["mode"] == DECODE_STEP else config.repeats
        prepared.append((spec, call, measured_call, repeats, len(warmup_calls), []))
    gc.collect()
    rounds = max(entry[3] for entry in prepared)
    schedule = [_rounds_for(entry[3], rounds) for entry in prepared]
    for round_number in range(rounds):
        order = list(zip(prepared, schedule, strict=True))
        if round_number % 2:
            order.reverse()
        for (_, call, measured_call, _, _, times), due in order:
            if round_number in due:
                start = time.perf_counter()
                call.run(*measured_call)
                times.append((time.perf_counter() - start) * 1000.0)
    described = environment()
    return [
        {
            **spec,
            "times_ms": times,
            # The round of each timed call: calls of one round ran back to back.
            "rounds": sorted(due),
            "median_ms": statistics.median(times),
            "min_ms": min(times),
            "traces": call.traces,
            "calls_before_measuring": warmups,
            "environment": described,
        }
        for (spec, call, _, _, warmups, times), due in zip(prepared, schedule, strict=True)
    ]


def measure_memory(spec: dict, config: BenchmarkConfig) -> dict:
    """Peak memory of one measurement's call, in this process.

    After the warm-up, freed memory is handed back to the operating system
    (`return_freed_memory_to_os`); then the peak RSS of `MEMORY_CALLS` calls
    above the RSS before them is recorded. Run it in a process started with
    `memory.ALLOCATOR_ENVIRONMENT` for clean figures.

    Returns:
        The spec with `peak_bytes`, `first_call_peak_bytes` (the first call,
        compilation included, above the RSS before it), `memory_method` and
        `environment`.

    Example:
        >>> spec = {"case": "gqa", "implementation": "keras", "mode": "forward"}
        >>> measure_memory(spec, BenchmarkConfig())["peak_bytes"] > 0  # doctest: +SKIP
        True
    """
    from keras_mha.benchmarks.memory import PeakMemory, return_freed_memory_to_os

    call, warmup_calls, measured_call = _prepare(spec, config)
    with PeakMemory() as first_call:
        call.run(*warmup_calls[0])
    _warm_up(call, warmup_calls[1:], spec, None)
    return_freed_memory_to_os()
    gc.collect()
    with PeakMemory() as peak:
        for _ in range(MEMORY_CALLS):
            call.run(*measured_call)
    return {
        **spec,
        "peak_bytes": peak.peak_bytes,
        "first_call_peak_bytes": first_call.peak_bytes,
        "memory_method": peak.method,
        "environment": environment(),
    }


def timing_groups(config: BenchmarkConfig) -> list[list[dict]]:
    """The plan split into groups timed together: per case and mode; decode as one group.

    Example:
        >>> [len(group) for group in timing_groups(BenchmarkConfig())]
        [2, 2, 2, 2, 3]
    """
    groups: dict[tuple, list[dict]] = {}
    for spec in measurement_plan(config):
        key = (spec["case"],) if spec["case"] == "decode" else (spec["case"], spec["mode"])
        groups.setdefault(key, []).append(spec)
    return list(groups.values())


def main(argv: list[str] | None = None) -> int:
    """Worker entry point: `REQUEST_JSON` in, one `WORKER_MARKER` + JSON line out.

    A request is `{"purpose": "time", "specs": [...], "config": {...},
    "output_paths": [...]}` (`time_interleaved`, answered with a list) or
    `{"purpose": "memory", "spec": {...}, "config": {...}}` (`measure_memory`).

    Example:
        >>> main([json.dumps({"purpose": "memory", "spec": spec, "config": config.to_dict()})])
        ... # doctest: +SKIP
        0
    """
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m keras_mha.benchmarks.measure_layers REQUEST_JSON\n")
        return 2
    request = json.loads(argv[0])
    config = BenchmarkConfig.from_dict(request["config"])
    pin_to_cpus(config.cpus)
    if request["purpose"] == "time":
        answer = time_interleaved(request["specs"], config, request.get("output_paths"))
    elif request["purpose"] == "memory":
        answer = measure_memory(request["spec"], config)
    else:
        raise ValueError(f"request purpose must be 'time' or 'memory'; got {request['purpose']!r}")
    sys.stdout.write(WORKER_MARKER + json.dumps(answer) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
