"""Paired CPU time per decode step, keras-mha against the hand-written step, on one pinned core.

On a shared machine the wall-clock medians of `keras-mha bench layers --cases decode`
swing with the other jobs' load; the CPU time a process spends on a step swings much
less. This script builds the same prepared steps as the bench (`layers.prepare`: the
layer's `make_decode_function()` and `backends.reference_decode`), pins the process to
one CPU (one intra-op thread on PyTorch), and times `steps` calls of each in turns, per
round, with `time.process_time` (every thread of the process). It prints one JSON line
per round and a summary: the median ratio keras-mha / reference and its spread. With
`--plain-call`, the plain layer call is timed beside the decode function in the same
rounds (three-way; `median_ratios` holds each against the reference).

Usage:
    KERAS_BACKEND=jax python -m benchmarks.decode_cpu_time --heads 16 --kv-heads 2
    KERAS_BACKEND=torch python -m benchmarks.decode_cpu_time --torch-compile --mha
    KERAS_BACKEND=torch python -m benchmarks.decode_cpu_time --plain-call --heads 16 --kv-heads 2

Example:
    >>> main(["--decode-context", "64", "--rounds", "1", "--steps", "5"])  # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.decode_cpu_time")
    add = parser.add_argument
    add("--heads", type=int, default=8, help="query heads (default 8)")
    add("--kv-heads", type=int, default=2, help="key/value heads (default 2)")
    add("--mha", action="store_true", help="the MHA rows (as many KV heads as query heads)")
    add("--decode-context", type=int, default=2048, help="cached tokens (default 2048)")
    add("--rounds", type=int, default=5, help="paired rounds (default 5)")
    add("--steps", type=int, default=200, help="steps per implementation a round (default 200)")
    add("--torch-compile", action="store_true", help="torch.compile both steps")
    add(
        "--plain-call",
        action="store_true",
        help="also keras-mha's plain layer call, layer(x, cache=..., cache_index=...), beside "
        "its decode function",
    )
    add("--cpu", type=int, default=None, help="the CPU to pin to (default the last usable)")
    return parser


def _pin(cpu: int | None) -> int:
    usable = sorted(os.sched_getaffinity(0))
    cpu = usable[-1] if cpu is None else cpu
    os.sched_setaffinity(0, {cpu})
    if os.environ.get("KERAS_BACKEND") == "torch":
        import torch

        torch.set_num_threads(1)
    return cpu


def _cpu_seconds_per_step(prepared, steps: int) -> float:
    arguments = prepared.timed
    start = time.process_time()
    for _ in range(steps):
        prepared.call(arguments)
    return (time.process_time() - start) / steps


def main(argv: list[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    cpu = _pin(arguments.cpu)
    from benchmarks import layers

    config = layers.Config(
        heads=arguments.heads,
        kv_heads=arguments.kv_heads,
        decode_context=arguments.decode_context,
        torch_compile=arguments.torch_compile,
        cases=("decode",),
        isolate=False,
        memory=False,
    )
    config.validate()
    mha = arguments.mha
    names = [layers.OURS_MHA if mha else layers.OURS]
    if arguments.plain_call:
        names.append(layers.OURS_MHA_CALL if mha else layers.OURS_CALL)
    names.append(layers.REFERENCE_MHA if mha else layers.REFERENCE)
    prepared = []
    for name in names:
        entry = {"case": "decode", "implementation": name, "mode": layers.STEP}
        built = layers.prepare(entry, config)
        for warm in built.warmup:
            built.call(warm)
        prepared.append(built)
    ratios = {name: [] for name in names[:-1]}
    for round_number in range(arguments.rounds):
        # Rotate which goes first, as the bench does.
        shift = round_number % len(names)
        order = [*range(len(names))][shift:] + [*range(len(names))][:shift]
        seconds = [0.0] * len(names)
        for index in order:
            seconds[index] = _cpu_seconds_per_step(prepared[index], arguments.steps)
        row = {"round": round_number, "reference_us": seconds[-1] * 1e6}
        for name, spent in zip(names[:-1], seconds, strict=False):
            ratios[name].append(spent / seconds[-1])
            row[f"{name}_us"] = spent * 1e6
            row[f"{name}_ratio"] = ratios[name][-1]
        print(json.dumps({k: round(v, 3) for k, v in row.items()}))
    summary = {
        "backend": os.environ.get("KERAS_BACKEND"),
        "implementations": names,
        "heads": config.heads,
        "kv_heads": config.heads if mha else config.kv_heads,
        "decode_context": config.decode_context,
        "torch_compile": config.torch_compile,
        "cpu": cpu,
        "load_average": os.getloadavg(),
        # The decode function's (first) ratio, as before the plain call joined.
        "median_ratio": statistics.median(ratios[names[0]]),
        "ratio_range": (min(ratios[names[0]]), max(ratios[names[0]])),
        "median_ratios": {name: round(statistics.median(r), 3) for name, r in ratios.items()},
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
