"""`keras-mha bench roofline`: the planner's decode speed bound against a measured decode, on
this machine's CPU.

1. Measures the CPU's memory bandwidth as STREAM's copy does (`np.copyto` of a 256 MiB
   float32 array into another, bytes read plus bytes written over the time), its read
   bandwidth as a decode reads weights (a matrix-vector product over a 512 MiB float32
   matrix, NumPy's BLAS on all cores: bytes read over the time) and its float32 matmul
   peak (a 2048 x 2048 matmul).
2. Runs `keras-mha bench model` (a scaled Llama-3.2-1B in float32 by default, batch 1, no
   transformers) on the current Keras backend for its decode tokens/s.
3. Computes the planner's bound for the same config on a "device" with the measured
   bandwidth and peak (`keras_mha.planning.planner.speed`), at the mean context of the
   decode (prompt + half the new tokens), float32 weights and KV cache.

The copy and the read are timed in every round of the decode (between its calls, taking
turns), and each round's decode is set against the bounds at that round's bandwidths: on
a shared machine load slows them alike. It prints the figures and `measured / bound` (the
median over the rounds, quartiles in parentheses) against each bound: the share of the
bandwidth roofline the decode loop reaches.

The copy bound is the planner's figure (a card's bandwidth is quoted as a copy's). A
decode only reads, on every core, so it can pass the copy bound (a one-thread copy moves
fewer bytes a second than two threads reading); the read bound is the stricter limit. A
model smaller than the last-level cache can pass both, read partly from the cache.

Example:
    KERAS_BACKEND=jax keras-mha bench roofline --scale 4
"""

from __future__ import annotations

import argparse
import json

from benchmarks.models import median_seconds
from benchmarks.reporting import caption

COPY_BYTES = 256 * 2**20
#: Bytes of the matrix the read bandwidth streams: past any last-level cache here (105 MiB).
READ_BYTES = 512 * 2**20
READ_COLUMNS = 8192
MATMUL_SIZE = 2048


def copy_bandwidth(size_bytes: int = COPY_BYTES, repeats: int = 5) -> float:
    """Bytes per second of `np.copyto` (read + write), STREAM-copy style."""
    import numpy as np

    source = np.ones(size_bytes // 4, dtype="float32")
    target = np.empty_like(source)
    return 2 * size_bytes / median_seconds(lambda: np.copyto(target, source), repeats)


def read_stream(size_bytes: int = READ_BYTES):
    """`(run, bytes read by one run)`: a float32 matrix-vector product over a matrix of
    `size_bytes`, as a decode streams its weights (NumPy's BLAS, all cores).

    Example:
        >>> run, read = read_stream(4 * 2**20)
        >>> run().shape, read
        ((128,), 4194304)
    """
    import numpy as np

    matrix = np.ones((size_bytes // 4 // READ_COLUMNS, READ_COLUMNS), dtype="float32")
    vector = np.ones(READ_COLUMNS, dtype="float32")
    return (lambda: matrix @ vector), matrix.nbytes


def matmul_flops(size: int = MATMUL_SIZE, repeats: int = 5) -> float:
    """FLOP/s of a float32 `size x size` matmul (NumPy's BLAS, all cores)."""
    import numpy as np

    a = np.random.default_rng(0).standard_normal((size, size), dtype="float32")
    return 2 * size**3 / median_seconds(lambda: a @ a, repeats)


def bound(config: dict, *, bandwidth: float, flops: float, batch: int, seq_len: int):
    """The planner's `SpeedBounds` for `config` on a CPU of this bandwidth and peak."""
    from keras_mha.planning.planner.gpus import GPU
    from keras_mha.planning.planner.quantization import dtype_format
    from keras_mha.planning.planner.serving import ServingModel
    from keras_mha.planning.planner.speed import speed_bounds
    from keras_mha.planning.spec import from_config

    spec = from_config(config)
    cpu = GPU("this CPU", 2**40, "measured", (), round(bandwidth), flops, None, "float32",
              "measured by keras-mha bench roofline")  # fmt: skip
    serving = ServingModel(spec, weights_format=dtype_format("float32"), kv_dtype="float32",
                           compute_dtype="float32")  # fmt: skip
    return speed_bounds(serving, cpu, batch=batch, seq_len=seq_len)


def device_bound(config: dict, *, dtype: str, batch: int, seq_len: int, device: str):
    """`(SpeedBounds, where the device's figures came from)` for a decode on `device`
    (`backends.device_name()`): on a GPU the planner's card row (None when the table has
    no row of that name), on the CPU this machine's measured copy bandwidth and matmul peak.
    """
    if device != "cpu":
        from keras_mha.planning.planner.gpus import lookup_gpu
        from keras_mha.planning.planner.quantization import dtype_format
        from keras_mha.planning.planner.serving import ServingModel
        from keras_mha.planning.planner.speed import speed_bounds
        from keras_mha.planning.spec import from_config

        gpu = lookup_gpu(device)
        if gpu is None:
            return None, f"no planner row for {device!r}"
        serving = ServingModel(from_config(config), weights_format=dtype_format(dtype),
                               kv_dtype=dtype, compute_dtype=dtype)  # fmt: skip
        return speed_bounds(serving, gpu, batch=batch, seq_len=seq_len), f"planner: {gpu.name}"
    bandwidth = copy_bandwidth()
    limits = bound(config, bandwidth=bandwidth, flops=matmul_flops(), batch=batch,
                   seq_len=seq_len)  # fmt: skip
    return limits, f"measured copy bandwidth {bandwidth / 1e9:.1f} GB/s"


def paired_fractions(
    stream_times: dict, decode_rates: list, bound_at, bytes_moved: int = 2 * COPY_BYTES
) -> dict:
    """Per round: this CPU's bandwidth (`bytes_moved` by a stream, the copy's
    `COPY_BYTES` read + written by default, over the mean of the round's two runs), the
    bound at that bandwidth (`bound_at(bandwidth)`, tokens/s) and the decode's fraction of
    it; medians and quartiles over the rounds. Load that slows a round slows its stream
    too, so the fractions hold better than one bandwidth measured before all the rounds.

    Example:
        >>> copies = {"prefill_seconds": [0.1, 0.2], "total_seconds": [0.1, 0.2]}
        >>> found = paired_fractions(copies, [10.0, 4.0], lambda bandwidth: bandwidth / 2**29)
        >>> [round(x, 2) for x in found["fractions"]]
        [1.0, 0.8]
    """
    from benchmarks.reporting import quartiles

    seconds = zip(stream_times["prefill_seconds"], stream_times["total_seconds"], strict=True)
    bandwidths = [bytes_moved / ((first + second) / 2) for first, second in seconds]
    bounds = [bound_at(bandwidth) for bandwidth in bandwidths]
    fractions = [rate / limit for rate, limit in zip(decode_rates, bounds, strict=True)]
    return {
        "bandwidths": bandwidths,
        "bounds": bounds,
        "fractions": fractions,
        "bandwidth": quartiles(bandwidths),
        "bound": quartiles(bounds),
        "fraction": quartiles(fractions),
    }


def main(argv=None) -> int:
    """Entry point of `keras-mha bench roofline`; returns the exit code."""
    import numpy as np

    from benchmarks import models

    parser = argparse.ArgumentParser(
        prog="keras-mha bench roofline",
        description="Measured decode tokens/s of `bench model` against the planner's "
        "bandwidth bound with this CPU's copy bandwidth, measured in the same rounds.",
    )
    parser.add_argument("--card", default=models.DEFAULT_CARD)
    parser.add_argument("--scale", type=int, default=4)
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="rounds (decode and copy)")
    parser.add_argument("--decode-path", default="auto", help="generate(decode_path=...)")
    parser.add_argument("--json", action="store_true")
    arguments = parser.parse_args(argv)
    model_arguments = models.parse_args(
        ["--card", arguments.card, "--scale", str(arguments.scale), "--prompt-length",
         str(arguments.prompt_length), "--new-tokens", str(arguments.new_tokens),
         "--repeats", str(arguments.repeats), "--no-transformers", "--no-keras-hub",
         "--no-roofline", "--decode-path", arguments.decode_path]
    )  # fmt: skip
    flops = matmul_flops()
    source = np.ones(COPY_BYTES // 4, dtype="float32")
    target = np.empty_like(source)

    def copy():
        np.copyto(target, source)

    read, read_bytes = read_stream()
    # The streams take their turns among the decode's rounds (`time_rounds`), so each
    # round's decode is set against the bandwidths of the same moment.
    streams = {"copy": (copy, copy), "read": (read, read)}
    results = models.model_results(model_arguments, extra_contenders=streams)
    context = arguments.prompt_length + arguments.new_tokens // 2

    def limits_at(bandwidth):
        return bound(results["config"], bandwidth=bandwidth, flops=flops, batch=1,
                     seq_len=context)  # fmt: skip

    rates = results["keras_mha"]["rounds"]["decode_tokens_per_second"]

    def tokens_at(bandwidth):
        return limits_at(bandwidth).decode_tokens_per_s

    paired = paired_fractions(results["extra_times"]["copy"], rates, tokens_at)
    read_paired = paired_fractions(results["extra_times"]["read"], rates, tokens_at, read_bytes)
    bandwidth = paired["bandwidth"][1]
    limits = limits_at(bandwidth)
    measured = results["keras_mha"]["decode_tokens_per_second"]
    low, fraction, high = paired["fraction"]
    report = {
        "card": arguments.card,
        "scale": arguments.scale,
        "parameters": results["parameters"],
        "backend": results["keras_mha"]["backend"],
        "decode_path": results["keras_mha"]["generation"]["path"],
        "rounds": arguments.repeats,
        "copy_bandwidth_bytes_per_s": bandwidth,
        "matmul_flops": flops,
        "decode_context": context,
        "decode_bytes_per_step": limits.decode_bytes_per_step,
        "bound_tokens_per_s": limits.decode_tokens_per_s,
        "bound_limited_by": limits.decode_limited_by,
        "measured_tokens_per_s": measured,
        "measured_over_bound": fraction,
        "measured_over_bound_quartiles": [low, high],
        "read_bandwidth_bytes_per_s": read_paired["bandwidth"][1],
        "read_bound_tokens_per_s": read_paired["bound"][1],
        "measured_over_read_bound": read_paired["fraction"][1],
        "measured_over_read_bound_quartiles": [read_paired["fraction"][0],
                                               read_paired["fraction"][2]],
        "per_round": {key: paired[key] for key in ("bandwidths", "bounds", "fractions")},
        "per_round_read": {key: read_paired[key] for key in ("bandwidths", "bounds", "fractions")},
    }  # fmt: skip
    if arguments.json:
        print(json.dumps(report, indent=2))
        return 0
    heading = (
        f"{arguments.card} / {arguments.scale}: {results['parameters'] / 1e6:.1f}M parameters "
        f"in float32, decode at {context} tokens of context, {report['backend']} backend, "
        f"decode path {report['decode_path']}; medians of {arguments.repeats} rounds, the "
        f"copy and the read timed in each round"
    )
    print("\n".join(caption(heading)))
    print(f"  copy bandwidth (read + write)  {bandwidth / 1e9:8.2f} GB/s")
    print(f"  float32 matmul peak            {flops / 1e9:8.1f} GFLOPS")
    print(f"  bytes read per decode step     {limits.decode_bytes_per_step / 1e6:8.2f} MB")
    print(f"  bound (planner)                {limits.decode_tokens_per_s:8.1f} tokens/s "
          f"({limits.decode_limited_by})")  # fmt: skip
    print(f"  measured (bench model)         {measured:8.1f} tokens/s")
    print(f"  measured / bound, per round    {fraction:8.2f} ({low:.2f}-{high:.2f})")
    read_low, read_fraction, read_high = read_paired["fraction"]
    print(f"  read bandwidth (mat-vec)       {read_paired['bandwidth'][1] / 1e9:8.2f} GB/s")
    print(f"  bound at the read bandwidth    {read_paired['bound'][1]:8.1f} tokens/s")
    print(f"  measured / read bound          {read_fraction:8.2f} "
          f"({read_low:.2f}-{read_high:.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
