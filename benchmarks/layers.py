"""`keras-mha bench layers`: the attention layers against Keras, keras-hub and the fused kernel.

On the current `KERAS_BACKEND` and its default device (a GPU when there is
one), with the same weights and inputs:

- `mha`, `gqa` (forward, forward+backward): keras-mha's `MultiHeadAttention` /
  `GroupedQueryAttention` against `keras.layers.MultiHeadAttention` /
  `GroupQueryAttention` and a hand-written `reference` (the projections as
  matmuls plus the backend's fused kernel, `benchmarks.backends`);
- `decode`: one cached decode step at `--decode-context` through the layer's
  public serving path (`init_cache`, then `layer.make_decode_function()`: a donated
  `jax.jit`, an XLA `tf.function` on a cache of variables, eager or `torch.compile`
  steps under `torch.no_grad()`) and through the plain layer call,
  `layer(token, cache=cache, cache_index=index)` in a step compiled as the reference's
  (the `call` rows), against the hand-written in-place reference step,
  at the GQA shapes and at MHA shapes (keras-mha's `MultiHeadAttention`, its
  reference, and keras-hub's `CachedMultiHeadAttention`), and recomputing all
  context + 1 tokens.

Each figure is the median of timed calls after warm-up (the first compiles).
The implementations of one comparison run in one fresh process, their calls
taking turns (A B C, B C A, C A B, ...); ratios are medians of those paired calls,
so load elsewhere on the machine slows every side alike. `% of roofline` is
achieved FLOP/s against the best FLOP/s of a large matmul in the same dtype
measured in the same run, and for decode steps the K/V bytes read per step
per second against a copy bandwidth measured in the same run. Peak memory is
measured in one fresh process per implementation: the device allocator's
peak on a GPU, the RSS high-water mark on a CPU (freed memory returned to the
operating system, so the figure is what the call allocates).

Example:
    >>> from benchmarks.layers import main
    >>> main(["--seq-len", "64", "--decode-context", "64", "--repeats", "3"])  # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import datetime
import gc
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from benchmarks import worker_environment
from benchmarks.reporting import caption, quartiles, table, turn_order
from keras_mha.errors import KerasMHAError, MissingDependencyError, UsageError

CASES = ("mha", "gqa", "decode")
DTYPES = ("float32", "bfloat16", "float16")
FORWARD, FORWARD_BACKWARD, STEP, RECOMPUTE = "forward", "forward+backward", "step", "recompute"
OURS, KERAS, REFERENCE, OURS_MHA, REFERENCE_MHA, KERAS_HUB = (
    "keras-mha",
    "keras",
    "reference",
    "keras-mha MHA",
    "reference MHA",
    "keras-hub MHA",
)
# The plain layer call, `layer(token, cache=cache, cache_index=index)`, beside the decode
# function: what a Keras user writes (the README's first quick start).
OURS_CALL, OURS_MHA_CALL = "keras-mha call", "keras-mha MHA call"
# The decode rows at MHA shapes (as many KV heads as query heads).
MHA_ROWS = (OURS_MHA, OURS_MHA_CALL, REFERENCE_MHA, KERAS_HUB)
# Each row's output and time are compared with this row of its group (same weights and
# input; the MHA rows with keras-mha's MHA), and its time with this reference.
BASELINE = {row: OURS_MHA for row in MHA_ROWS}
REFERENCE_OF = {row: REFERENCE_MHA for row in MHA_ROWS}
MEMORY_CALLS = 3
_WORKER_MARKER = "@@keras-mha-bench@@"
# glibc then unmaps every freed block over 64 KiB, TensorFlow skips its oneDNN pool:
# the RSS high-water mark sees what a call allocates, not what the warm-up left.
ALLOCATOR_ENVIRONMENT = {
    "MALLOC_MMAP_THRESHOLD_": "65536",
    "MALLOC_TRIM_THRESHOLD_": "131072",
    "TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "1",
}
_BACKEND_MODULES = {"jax": "jax", "tensorflow": "tensorflow", "torch": "torch"}


@dataclasses.dataclass(frozen=True)
class Config:
    """What to measure. `validate()` raises `UsageError` naming the flag.

    Example:
        >>> Config(heads=8, kv_heads=2).features
        512
    """

    batch: int = 1
    seq_len: int = 1024
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 64
    hidden: int | None = None
    decode_context: int = 2048
    dtype: str = "float32"
    causal: bool = True
    repeats: int = 10
    decode_repeats: int = 100
    warmup: int = 2
    cases: tuple = CASES
    tf_jit_compile: bool = True
    torch_compile: bool = False
    cpus: int | None = None
    isolate: bool = True
    memory: bool = True
    matmul_size: int | None = None  # None: 1024 on a CPU, 8192 on a GPU
    copy_mib: int | None = None  # None: 256 on a CPU, 1024 on a GPU

    @property
    def features(self) -> int:
        return self.hidden or self.heads * self.head_dim

    def validate(self) -> None:
        for name in ("batch", "seq_len", "heads", "kv_heads", "head_dim", "decode_context"):
            for_flag(name, getattr(self, name), minimum=1)
        for name in ("repeats", "decode_repeats", "warmup"):
            for_flag(name, getattr(self, name), minimum=1)
        for name in ("hidden", "cpus", "matmul_size", "copy_mib"):
            if getattr(self, name) is not None:
                for_flag(name, getattr(self, name), minimum=1)
        if self.heads % self.kv_heads:
            raise UsageError(
                f"--kv-heads: {self.kv_heads} does not divide --heads {self.heads}; "
                "expected a divisor"
            )
        if self.dtype not in DTYPES:
            raise UsageError(f"--dtype: {self.dtype!r}; expected one of {', '.join(DTYPES)}")
        if not self.cases or any(case not in CASES for case in self.cases):
            raise UsageError(
                f"--cases: {','.join(self.cases)!r}; expected a comma-separated subset of "
                f"{','.join(CASES)}"
            )
        if self.cpus is not None and self.cpus > len(_usable_cpus()):
            raise UsageError(
                f"--cpus: {self.cpus}; this process may use {len(_usable_cpus())} CPU(s)"
            )


def for_flag(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        flag = "--" + name.replace("_", "-")
        raise UsageError(f"{flag}: {value!r}; expected an integer >= {minimum}")


def _usable_cpus() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _pin(cpus: int | None) -> None:
    # Before the backend starts: its thread pools are sized to the CPUs it may use.
    if cpus is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(_usable_cpus()[:cpus]))


def plan(config: Config, keras_hub_installed: bool = True) -> list[list[dict]]:
    """The measurements, in groups timed together (one process per group).

    Example:
        >>> [[e["implementation"] for e in group] for group in plan(Config(cases=("gqa",)))]
        [['keras-mha', 'keras', 'reference'], ['keras-mha', 'keras', 'reference']]
    """
    groups = []
    for case in config.cases:
        if case == "decode":
            steps = [OURS, OURS_CALL, REFERENCE, OURS_MHA, OURS_MHA_CALL, REFERENCE_MHA]
            steps += [KERAS_HUB] if keras_hub_installed else []
            group = [{"case": case, "implementation": name, "mode": STEP} for name in steps]
            groups.append([*group, {"case": case, "implementation": OURS, "mode": RECOMPUTE}])
            continue
        for mode in (FORWARD, FORWARD_BACKWARD):
            groups.append(
                [{"case": case, "implementation": name, "mode": mode} for name in (OURS, KERAS)]
                + [{"case": case, "implementation": REFERENCE, "mode": mode}]
            )
    return groups


# ------------------------------------------------------------------- building a call
def _keras_mha_layer(config: Config, mha: bool, causal: bool, seed: int):
    """A built keras-mha layer with reproducible weights scaled by fan-in."""
    import numpy as np

    from keras_mha.layers import GroupedQueryAttention, MultiHeadAttention

    common = {"head_dim": config.head_dim, "causal": causal, "dtype": config.dtype}
    if mha:
        layer = MultiHeadAttention(num_heads=config.heads, **common)
    else:
        layer = GroupedQueryAttention(config.heads, config.kv_heads, **common)
    layer.build((config.batch, None, config.features))
    rng = np.random.default_rng(seed)
    for variable in layer.trainable_variables:
        shape = tuple(variable.shape)
        fan_in = shape[0] * shape[1] if variable.path.endswith("output_kernel") else shape[0]
        scale = 0.02 if len(shape) == 1 or "bias" in variable.path else fan_in**-0.5
        if "gate" in variable.path:
            continue
        variable.assign(rng.normal(scale=scale, size=shape).astype("float32"))
    return layer


def _keras_builtin(ours, config: Config, mha: bool):
    import keras

    from keras_mha.layers import copy_weights_to_keras

    if mha:
        builtin = keras.layers.MultiHeadAttention(
            num_heads=config.heads, key_dim=config.head_dim, dtype=config.dtype
        )
    else:
        builtin = keras.layers.GroupQueryAttention(
            head_dim=config.head_dim,
            num_query_heads=config.heads,
            num_key_value_heads=config.kv_heads,
            dtype=config.dtype,
        )
    probe = keras.ops.zeros((1, 2, config.features), config.dtype)
    builtin(probe, probe)
    copy_weights_to_keras(ours, builtin)
    return builtin


def _keras_hub_layer(ours, config: Config):
    import keras
    from keras_hub.layers import CachedMultiHeadAttention

    from keras_mha.layers import copy_weights_to_keras

    peer = CachedMultiHeadAttention(
        num_heads=config.heads, key_dim=config.head_dim, dtype=config.dtype
    )
    probe = keras.ops.zeros((1, 2, config.features), config.dtype)
    peer(probe, probe)
    copy_weights_to_keras(ours, peer)
    return peer


def _input(config: Config, length: int):
    import numpy as np
    from keras import ops

    rng = np.random.default_rng(1234)
    x = rng.normal(size=(config.batch, length, config.features)).astype("float32")
    return ops.cast(ops.convert_to_tensor(x), config.dtype)


@dataclasses.dataclass
class _Prepared:
    """A built measurement: `call(arguments)` runs it and waits for the result."""

    call: object
    warmup: list  # argument tuples; the last one is the position that is timed
    work: dict  # flops, kv_bytes

    @property
    def timed(self):
        return self.warmup[-1]


def _flops(config: Config, length: int, kv_heads: int, queries: int | None = None) -> float:
    """Multiply-adds x 2 of a forward pass: four projections and the attended pairs."""
    queries = length if queries is None else queries
    inner = config.heads * config.head_dim
    projections = (
        2
        * config.batch
        * config.features
        * (queries * (2 * inner) + length * 2 * kv_heads * config.head_dim)
    )
    if queries == length and config.causal:
        pairs = length * (length + 1) / 2
    else:
        pairs = queries * length
    return projections + 4 * config.batch * config.heads * config.head_dim * pairs


def prepare(entry: dict, config: Config) -> _Prepared:
    """Build, compile and describe one measurement (no call made yet)."""
    from benchmarks import backends

    options = {"tf_jit_compile": config.tf_jit_compile, "torch_compile": config.torch_compile}
    case, implementation, mode = entry["case"], entry["implementation"], entry["mode"]
    mha = case == "mha" or implementation in MHA_ROWS
    kv_heads = config.heads if mha else config.kv_heads
    causal = config.causal or case == "decode"
    ours = _keras_mha_layer(config, mha, causal, seed=43 if mha else 42)

    if mode in (FORWARD, FORWARD_BACKWARD, RECOMPUTE):
        length = config.decode_context + 1 if mode == RECOMPUTE else config.seq_len
        x = _input(config, length)
        if implementation == REFERENCE:
            weights, shape = backends.reference_weights(ours)
            apply, params = backends.reference_forward(weights, shape, config.causal, config.dtype)
            options["tf_jit_compile"] = True  # the reference is XLA-compiled by definition
        elif implementation == KERAS:
            builtin = _keras_builtin(ours, config, mha)
            kwargs = {"use_causal_mask": config.causal}
            apply, params = backends.layer_apply(builtin, kwargs, two_inputs=True)
        else:
            apply, params = backends.layer_apply(ours)
        run = backends.compile_call(apply, training=mode == FORWARD_BACKWARD, **options)
        flops = _flops(config, length, kv_heads) * (3 if mode == FORWARD_BACKWARD else 1)

        def call(_):
            result = backends.finish(run(params, x))
            return result[:, -1:] if mode == RECOMPUTE else result

        return _Prepared(call, [()] * config.warmup, {"flops": flops})

    # A decode step at position `context`, the cache prefilled with the tokens before it.
    context = config.decode_context
    x = _input(config, context + 1)
    prefill = x[:, :context]
    if implementation in (REFERENCE, REFERENCE_MHA):
        weights, shape = backends.reference_weights(ours)
        step, params, state = backends.reference_decode(weights, shape, prefill, context + 1)
        run = backends.compile_step(step, **{**options, "tf_jit_compile": True})
    elif implementation == KERAS_HUB:
        layer = _keras_hub_layer(ours, config)
        step, params = backends.layer_step(layer, backends.keras_hub_step)
        state = _prefilled_cache(layer, implementation, prefill, context + 1)
        run = backends.compile_step(step, **options)
    elif implementation in (OURS_CALL, OURS_MHA_CALL):
        # The plain layer call in a step compiled as the reference's is (eager or
        # torch.compile'd under no_grad on PyTorch, jax.jit, an XLA tf.function).
        state = _prefilled_cache(ours, implementation, prefill, context + 1)
        run, params = _layer_call_step(ours, options), []
    else:
        # keras-mha's own decode function: the backend's serving path, picked by the layer.
        decode = ours.make_decode_function(
            compile_torch=config.torch_compile, jit_compile=config.tf_jit_compile
        )
        state, params = _prefilled_cache(ours, implementation, prefill, context + 1), []

        def run(params, token, cache, index):
            return decode(token, cache, index)

    holder = {"state": state}

    def call(arguments):
        token, index = arguments
        output, holder["state"] = run(params, token, holder["state"], index)
        return backends.finish(output)

    # The warm-up feeds the last positions their own tokens again (the cache keeps the
    # same content) so that a step compiled per position would show; the timed calls
    # all repeat position `context`.
    positions = range(max(0, context - config.warmup + 1), context + 1)
    warmup = [(x[:, p : p + 1], backends.decode_index(p)) for p in positions]
    warmup = [warmup[0]] * (config.warmup - len(warmup)) + warmup
    itemsize = 4 if config.dtype == "float32" else 2
    kv_bytes = 2 * config.batch * (context + 1) * kv_heads * config.head_dim * itemsize
    flops = _flops(config, context + 1, kv_heads, queries=1)
    return _Prepared(call, warmup, {"flops": flops, "kv_bytes": kv_bytes})


def _layer_call_step(layer, options):
    """`run(params, token, cache, index)`: `layer(token, cache=cache, cache_index=index)`
    compiled as `backends.compile_step` compiles the reference; a cache of variables
    (TensorFlow) stays the state, written in place."""
    from benchmarks import backends
    from keras_mha.backends.common.kv_cache import all_in_place

    def step(params, token, cache, index):
        return layer(token, cache=cache, cache_index=index)

    compiled = backends.compile_step(step, **{**options, "tf_jit_compile": True})
    # Whether the cache is variables, asked once: flattening it costs tens of microseconds
    # a step on PyTorch, which would be charged to the layer's row.
    in_place = []

    def run(params, token, cache, index):
        output, written = compiled(params, token, cache, index)
        if not in_place:
            in_place.append(all_in_place(cache))
        return output, cache if in_place[0] else written

    return run


def _prefilled_cache(layer, implementation, prefill, max_length):
    """The layer's own cache after the untimed prefill (public API; layout opaque)."""
    import keras

    batch = prefill.shape[0]
    no_grad = _no_grad()
    with no_grad:
        if implementation == KERAS_HUB:
            shape = (batch, 2, max_length, layer.num_heads, layer.key_dim)
            cache = keras.ops.zeros(shape, layer.compute_dtype)
            _, cache = layer(prefill, prefill, cache=cache, cache_update_index=0)
        else:
            # TensorFlow serves from a cache of variables, updated in place.
            variables = keras.backend.backend() == "tensorflow"
            cache = layer.init_cache(batch, max_length, variables=variables)
            _, cache = layer(prefill, cache=cache, cache_index=0)
            if variables:
                return cache
    return keras.tree.map_structure(keras.ops.stop_gradient, cache)


def _no_grad():
    import contextlib

    import keras

    if keras.backend.backend() == "torch":
        import torch

        return torch.no_grad()
    return contextlib.nullcontext()


# ---------------------------------------------------------------------- measuring
def time_group(entries: list[dict], config: Config) -> dict:
    """Build every entry, warm each up, then time their calls taking turns.

    Returns `{"rows": [...], "environment": {...}}`; each row holds `times_ms`,
    `rounds` (the round of each timed call) and `max_abs_diff` against its
    `BASELINE` row.
    """
    import numpy as np
    from keras import ops

    from benchmarks import backends

    prepared, outputs = [], {}
    for entry in entries:
        measurement = prepare(entry, config)
        for arguments in measurement.warmup:
            result = measurement.call(arguments)
        outputs[entry["implementation"], entry["mode"]] = np.asarray(
            ops.convert_to_numpy(ops.cast(result, "float32"))
        )
        prepared.append(measurement)
    gc.collect()
    counts = [config.decode_repeats if e["mode"] == STEP else config.repeats for e in entries]
    rounds = max(counts)
    # Entries with fewer calls (a recompute beside 100 steps) are spread over the rounds.
    schedules = [sorted({(i * rounds) // count for i in range(count)}) for count in counts]
    times = [[] for _ in entries]
    for round_number in range(rounds):
        for index in turn_order(len(entries), round_number):
            if round_number in schedules[index]:
                start = time.perf_counter()
                prepared[index].call(prepared[index].timed)
                times[index].append((time.perf_counter() - start) * 1000.0)
    rows = []
    for entry, measurement, timed, schedule in zip(
        entries, prepared, times, schedules, strict=True
    ):
        mine = outputs[entry["implementation"], entry["mode"]]
        baseline = (BASELINE.get(entry["implementation"], OURS), _paired_mode(entry["mode"]))
        other = outputs.get(baseline)
        diff = None if other is None or other is mine else float(np.max(np.abs(mine - other)))
        rows.append(
            {
                **entry,
                **measurement.work,
                "times_ms": timed,
                "rounds": schedule,
                "max_abs_diff": diff,
            }
        )
    environment = {
        "backend": backends.backend(),
        "device": backends.device(),
        "versions": backends.versions(),
    }
    return {"rows": rows, "environment": environment}


def _rss_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def measure_memory(entry: dict, config: Config) -> dict:
    """Peak memory that `MEMORY_CALLS` calls allocate, after the warm-up, in this process.

    GPU: the allocator's peak above what was in use before (torch, JAX,
    TensorFlow statistics). CPU: the RSS high-water mark (reset through
    `/proc/self/clear_refs`) above the RSS before; run it in a process with
    `ALLOCATOR_ENVIRONMENT` so freed memory leaves the RSS.
    """
    from benchmarks import backends

    measurement = prepare(entry, config)
    for arguments in measurement.warmup:
        measurement.call(arguments)
    gc.collect()
    name, where = backends.backend(), backends.device()

    def calls():
        for _ in range(MEMORY_CALLS):
            measurement.call(measurement.timed)

    if where != "cpu":
        if name == "torch":
            import torch

            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            calls()
            return {"peak_bytes": torch.cuda.max_memory_allocated() - before, "method": "cuda"}
        if name == "jax":
            import jax

            stats = jax.devices()[0].memory_stats() or {}
            before = stats.get("bytes_in_use", 0)
            calls()
            peak = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
            return {"peak_bytes": None if peak is None else peak - before, "method": "xla"}
        import tensorflow as tf

        tf.config.experimental.reset_memory_stats("GPU:0")
        before = tf.config.experimental.get_memory_info("GPU:0")["current"]
        calls()
        peak = tf.config.experimental.get_memory_info("GPU:0")["peak"]
        return {"peak_bytes": peak - before, "method": "tensorflow"}
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # resets VmHWM to the current RSS
    except OSError:
        return {"peak_bytes": None, "method": "unavailable"}
    before = _rss_bytes("VmRSS")
    calls()
    peak = _rss_bytes("VmHWM")
    if before is None or peak is None:
        return {"peak_bytes": None, "method": "unavailable"}
    return {"peak_bytes": max(0, peak - before), "method": "rss high-water mark"}


def measure_roofline(config: Config) -> dict:
    from benchmarks import backends

    return {
        "matmul": backends.matmul_peak(config.dtype, config.matmul_size),
        "copy": backends.copy_bandwidth(config.copy_mib),
    }


_WORKERS = {"time": time_group, "memory": measure_memory, "roofline": measure_roofline}


def _in_fresh_process(purpose: str, argument, config: Config, environment: dict):
    request = json.dumps({"purpose": purpose, "argument": argument, "config": _to_dict(config)})
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.layers", "--worker", request],
        env={**worker_environment(), "TF_CPP_MIN_LOG_LEVEL": "2", **environment},
        capture_output=True,
        text=True,
        check=False,
    )
    for line in reversed(completed.stdout.splitlines()):
        if line.startswith(_WORKER_MARKER):
            return json.loads(line[len(_WORKER_MARKER) :])
    last = (completed.stderr.strip().splitlines() or ["no output"])[-1]
    raise KerasMHAError(
        f"bench layers: the {purpose} process failed (exit {completed.returncode}): {last}"
    )


def _measure(purpose: str, argument, config: Config):
    if not config.isolate:
        _pin(config.cpus)
        if purpose == "roofline":
            return measure_roofline(config)
        return _WORKERS[purpose](argument, config)
    environment = ALLOCATOR_ENVIRONMENT if purpose == "memory" else {}
    return _in_fresh_process(purpose, argument, config, environment)


def _to_dict(config: Config) -> dict:
    return {**dataclasses.asdict(config), "cases": list(config.cases)}


# ------------------------------------------------------------------- summarising
def paired_ratio(numerator: dict, denominator: dict) -> float:
    """Median over the rounds where both ran of numerator time / denominator time.

    Example:
        >>> paired_ratio({"times_ms": [2, 20], "rounds": [0, 1]},
        ...              {"times_ms": [1, 10], "rounds": [0, 1]})
        2.0
    """
    by_round = dict(zip(denominator["rounds"], denominator["times_ms"], strict=True))
    ratios = [
        time_ms / by_round[number]
        for number, time_ms in zip(numerator["rounds"], numerator["times_ms"], strict=True)
        if number in by_round
    ]
    if not ratios:
        return statistics.median(numerator["times_ms"]) / statistics.median(denominator["times_ms"])
    return statistics.median(ratios)


def _paired_mode(mode: str) -> str:
    # The recompute is compared with the decode step it replaces.
    return STEP if mode == RECOMPUTE else mode


def summarise(rows: list[dict], roofline: dict) -> None:
    """Add medians, quartiles, ratios and % of roofline to each row, in place."""
    peak_flops = roofline["matmul"]["flops_per_s"]
    bandwidth = roofline["copy"]["bytes_per_s"]
    groups: dict = {}
    for row in rows:
        key = (row["case"], _paired_mode(row["mode"]))
        groups.setdefault(key, {})[row["implementation"], row["mode"]] = row
    for row in rows:
        mode = _paired_mode(row["mode"])
        group = groups[row["case"], mode]
        low, median, high = quartiles(row["times_ms"])
        row.update(median_ms=median, quartiles_ms=[low, high])
        baseline = group.get((BASELINE.get(row["implementation"], OURS), mode))
        reference = group.get((REFERENCE_OF.get(row["implementation"], REFERENCE), mode))
        row["time_vs_keras_mha"] = paired_ratio(row, baseline) if baseline else None
        row["percent_of_reference"] = 100 / paired_ratio(row, reference) if reference else None
        seconds = median / 1000.0
        row["flops_per_s"] = row["flops"] / seconds
        row["percent_of_matmul_peak"] = 100 * row["flops_per_s"] / peak_flops
        if row["mode"] == STEP:
            row["kv_bytes_per_s"] = row["kv_bytes"] / seconds
            row["percent_of_copy_bandwidth"] = 100 * row["kv_bytes_per_s"] / bandwidth


def run_benchmark(config: Config, progress=None) -> dict:
    """Every measurement of `config`, summarised; JSON-ready.

    Example:
        >>> results = run_benchmark(Config(seq_len=32, decode_context=32, repeats=2,
        ...                                isolate=False))  # doctest: +SKIP
    """
    config.validate()
    _check_backend_installed()
    progress = progress or (lambda line: None)
    keras_hub_installed = importlib.util.find_spec("keras_hub") is not None
    progress("roofline: matmul peak and copy bandwidth")
    roofline = _measure("roofline", None, config)
    rows, environment = [], None
    for group in plan(config, keras_hub_installed):
        what = ", ".join(e["implementation"] for e in group)
        progress(f"timing {group[0]['case']} {group[0]['mode']}: {what}")
        timed = _measure("time", group, config)
        environment = timed["environment"]
        for row in timed["rows"]:
            row["peak_mb"], row["memory_method"] = None, None
            if config.memory:
                progress(f"memory of {row['case']} {row['implementation']} {row['mode']}")
                memory = _measure(
                    "memory", {k: row[k] for k in ("case", "implementation", "mode")}, config
                )
                if memory["peak_bytes"] is not None:
                    row["peak_mb"] = memory["peak_bytes"] / 2**20
                row["memory_method"] = memory["method"]
            rows.append(row)
    summarise(rows, roofline)
    return {
        "benchmark": "keras-mha bench layers",
        "date": datetime.date.today().isoformat(),
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        },
        "environment": environment,
        "settings": {**_to_dict(config), "features": config.features},
        "roofline": roofline,
        "keras_hub": keras_hub_installed,
        "rows": rows,
    }


def _check_backend_installed() -> None:
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    module = _BACKEND_MODULES.get(backend)
    if module is None:
        raise UsageError(
            f"KERAS_BACKEND: {backend!r}; expected one of {', '.join(_BACKEND_MODULES)}"
        )
    if importlib.util.find_spec(module) is None:
        raise MissingDependencyError(
            f"KERAS_BACKEND={backend}: {module} is not installed; pip install "
            f"'keras-mha[{backend}]' or pick another backend"
        )


# ---------------------------------------------------------------------- rendering
def _ms(value: float) -> str:
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _percent(value: float) -> str:
    return f"{value:.0f}%" if value >= 10 else f"{value:.2g}%"


def _label(row: dict) -> str:
    return "  " + row["implementation"] + (" recompute" if row["mode"] == RECOMPUTE else "")


def _speed_cells(row: dict) -> list[str]:
    low, high = row["quartiles_ms"]
    ratio = row["time_vs_keras_mha"]
    reference = row["percent_of_reference"]
    decode = row["case"] == "decode"
    if decode and row["mode"] == STEP:
        roofline = f"{_percent(row['percent_of_copy_bandwidth'])} bw"
    else:
        roofline = _percent(row["percent_of_matmul_peak"]) + (" flop" if decode else "")
    return [
        _label(row),
        f"{_ms(row['median_ms'])} ({_ms(low)}-{_ms(high)})",
        "-"
        if ratio is None
        else f"{ratio:.2f}x" + (" MHA" if row["implementation"] in MHA_ROWS[1:] else ""),
        "-" if reference is None else f"{reference:.0f}%",
        roofline,
    ]


def _detail_cells(row: dict) -> list[str]:
    diff = row["max_abs_diff"]
    return [
        _label(row),
        "n/a" if row["peak_mb"] is None else f"{row['peak_mb']:.1f}",
        "-" if diff is None else f"{diff:.1e}",
    ]


def _grouped(rows: list[dict], decode_context: int, cells) -> list[list[str]]:
    """`cells(row)` of every row under a heading row per case and mode, in run order."""
    body, heading = [], None
    for row in rows:
        case = row["case"]
        title = f"decode, context {decode_context}" if case == "decode" else f"{case} {row['mode']}"
        if title != heading:
            heading = title
            blank = [""] * (len(body[-1]) - 1 if body else 0)
            body.append([title, *blank])
        body.append(cells(row))
    width = max(len(cells) for cells in body)
    return [cells + [""] * (width - len(cells)) for cells in body]


def render(results: dict, markdown: bool = False) -> str:
    """The results as a plain-text (or Markdown) report; text lines keep to 80 columns.

    Example:
        >>> print(render(run_benchmark(Config(seq_len=32, isolate=False))))  # doctest: +SKIP
    """
    s, environment, roofline = results["settings"], results["environment"], results["roofline"]
    versions = ", ".join(f"{k} {v}" for k, v in environment["versions"].items())
    load = results["machine"].get("load_average")
    compiled = {
        "jax": "jax.jit",
        "tensorflow": f"tf.function(jit_compile={s['tf_jit_compile']})",
        "torch": "torch.compile" if s["torch_compile"] else "torch eager",
    }[environment["backend"]]
    # A markdown paragraph reflows by itself; a terminal's lines are wrapped here.
    wrap = (lambda text: [text]) if markdown else caption
    lines = [
        *wrap(
            f"keras-mha bench layers: {environment['backend']} ({versions}) on "
            f"{environment['device']}, {results['machine']['cpu_count']} CPU cores, "
            f"{results['date']}" + (f", load average {load[0]:.1f}" if load else "")
        ),
        *wrap(
            f"shapes: batch {s['batch']}, sequence {s['seq_len']}, {s['features']} features, "
            f"{s['heads']} query heads of {s['head_dim']}, GQA {s['kv_heads']} KV heads, "
            f"{'causal' if s['causal'] else 'not causal'}, {s['dtype']}; decode at context "
            f"{s['decode_context']}; {compiled}"
        ),
        *wrap(
            f"roofline: {roofline['matmul']['n']}^3 matmul "
            f"{roofline['matmul']['flops_per_s'] / 1e9:.1f} GFLOP/s ({s['dtype']}); copy "
            f"{roofline['copy']['bytes_per_s'] / 1e9:.1f} GB/s (read + written)"
        ),
        *wrap(
            f"medians of {s['repeats']} calls ({s['decode_repeats']} decode steps) after "
            f"{s['warmup']} warm-up, quartiles in parentheses; ratios from paired calls; "
            "vs keras-mha = this row's time / keras-mha's; % of ref = this row's speed in % "
            "of the reference's; % of roof = in % of the roofline"
        ),
        "",
    ]
    rows = [r for r in results["rows"] if r["case"] != "decode"]
    rows += [r for r in results["rows"] if r["case"] == "decode"]
    if not rows:
        return "\n".join(lines).rstrip() + "\n"
    speed = ["", "ms (quartiles)", "vs keras-mha", "% of ref", "% of roof"]
    lines += table(speed, _grouped(rows, s["decode_context"], _speed_cells), markdown)
    lines += [""]
    details = ["", "peak MB", "max abs diff"]
    lines += table(details, _grouped(rows, s["decode_context"], _detail_cells), markdown)
    if any(r["case"] == "decode" for r in rows):
        lines.append("")
        lines += wrap(
            "decode % of roof: steps = K/V bytes read per second / copy bandwidth (bw); "
            "the recompute = FLOP/s / matmul peak. The MHA rows compare with keras-mha MHA "
            "and reference MHA."
        )
        if not results["keras_hub"]:
            lines.append("keras-hub is not installed: no keras-hub row.")
    return "\n".join(lines).rstrip() + "\n"


# --------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    d = Config()
    parser = argparse.ArgumentParser(
        prog="keras-mha bench layers",
        description="Time keras-mha's attention layers against Keras's built-ins, keras-hub "
        "and a hand-written reference on the backend's fused kernel, with %% of a roofline "
        "measured in the same run.",
    )
    add = parser.add_argument
    for flag, default, help_text in (
        ("--batch", d.batch, "batch size"),
        ("--seq-len", d.seq_len, "sequence length of the mha and gqa cases"),
        ("--heads", d.heads, "query heads"),
        ("--kv-heads", d.kv_heads, "key/value heads of the gqa and decode cases"),
        ("--head-dim", d.head_dim, "head size"),
        ("--hidden", None, "input/output features (default heads * head-dim)"),
        ("--decode-context", d.decode_context, "tokens in the KV cache before the decode step"),
        ("--repeats", d.repeats, "timed calls per implementation"),
        ("--decode-repeats", d.decode_repeats, "timed decode steps per implementation"),
        ("--warmup", d.warmup, "untimed calls first (the first compiles)"),
        ("--cpus", None, "pin the measuring processes to this many CPUs"),
        ("--matmul-size", None, "n of the n x n matmul peak (default 1024 CPU, 8192 GPU)"),
        ("--copy-mib", None, "MiB of the copy-bandwidth buffer (default 256 CPU, 1024 GPU)"),
    ):
        add(flag, type=int, default=default, help=f"{help_text} (default {default})")
    add("--dtype", default=d.dtype, help="float32, bfloat16 or float16 (default float32)")
    add("--cases", default=",".join(CASES), help="subset of mha,gqa,decode (default all)")
    add("--no-causal", action="store_true", help="non-causal mha/gqa (decode is causal)")
    add("--no-tf-jit-compile", action="store_true", help="plain tf.function for the layers")
    add("--torch-compile", action="store_true", help="torch.compile every implementation")
    add("--in-process", action="store_true", help="no fresh processes (rough memory figures)")
    add("--no-memory", action="store_true", help="skip the peak-memory processes")
    add("--format", choices=("table", "json", "markdown"), default="table")
    add("--quiet", action="store_true", help="no progress lines on stderr")
    return parser


def config_from_arguments(arguments: argparse.Namespace) -> Config:
    return Config(
        batch=arguments.batch,
        seq_len=arguments.seq_len,
        heads=arguments.heads,
        kv_heads=arguments.kv_heads,
        head_dim=arguments.head_dim,
        hidden=arguments.hidden,
        decode_context=arguments.decode_context,
        dtype=arguments.dtype,
        causal=not arguments.no_causal,
        repeats=arguments.repeats,
        decode_repeats=arguments.decode_repeats,
        warmup=arguments.warmup,
        cases=tuple(c.strip() for c in arguments.cases.split(",") if c.strip()),
        tf_jit_compile=not arguments.no_tf_jit_compile,
        torch_compile=arguments.torch_compile,
        cpus=arguments.cpus,
        isolate=not arguments.in_process,
        memory=not arguments.no_memory,
        matmul_size=arguments.matmul_size,
        copy_mib=arguments.copy_mib,
    )


def main(argv: list[str] | None = None) -> int:
    """`keras-mha bench layers [flags]`; errors are one line with the error's exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--worker"]:
        return _worker(argv[1])
    arguments = _parser().parse_args(argv)
    try:
        config = config_from_arguments(arguments)
        quiet = arguments.quiet or arguments.format == "json"

        def progress(line):
            if not quiet:
                sys.stderr.write(f"  {line}\n")

        results = run_benchmark(config, progress)
    except KerasMHAError as error:
        sys.stderr.write(f"keras-mha: error: {' '.join(str(error).split())}\n")
        return error.exit_code
    if arguments.format == "json":
        sys.stdout.write(json.dumps(results, indent=1) + "\n")
    else:
        sys.stdout.write(render(results, markdown=arguments.format == "markdown"))
    return 0


def _worker(request_json: str) -> int:
    request = json.loads(request_json)
    values = request["config"]
    config = Config(**{**values, "cases": tuple(values["cases"])})
    _pin(config.cpus)
    if request["purpose"] == "roofline":
        answer = measure_roofline(config)
    else:
        answer = _WORKERS[request["purpose"]](request["argument"], config)
    sys.stdout.write(_WORKER_MARKER + json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
