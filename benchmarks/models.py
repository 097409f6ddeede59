"""Benchmark of whole-model generation: prefill and decode tokens/s, beside its peers.

A decoder shaped like a bundled card (default Llama-3.2-1B), scaled down to fit a small
CPU unless `--full-size`, gets random weights from transformers (`save_pretrained` into a
temporary folder), is loaded with `from_pretrained` on the current Keras backend and
timed with `generate`. The peers run the same checkpoint: transformers' own `generate`
on torch (eager, and its static cache + `torch.compile`), and keras-hub's `generate` on
the current Keras backend where `keras_hub_peer.PEERS` has a row for the card's family.

- prefill tokens/s: `batch * prompt_length` / time of `generate(..., max_new_tokens=1)`;
- decode tokens/s: `batch * (new_tokens - 1)` / (time of `generate(..., new_tokens)` minus
  the prefill time of the same round).

After one warm-up call of each (which compiles), `--rounds` rounds time both sides in
turn, the side that goes first alternating; each round gives a ratio keras-mha /
peer of tokens/s (above 1: keras-mha is faster), reported as the median and the
quartiles over the rounds. Load elsewhere on the machine slows both sides of a round
alike, so the ratios hold on a busy machine while the tokens/s do not. `--backends`
runs the bench once per Keras backend, each in a fresh process, into one table.

Example:
    KERAS_BACKEND=jax python -m benchmarks model --scale 8
    python -m benchmarks model --backends tensorflow,jax,torch --format markdown
    KERAS_BACKEND=jax python -m benchmarks model --full-size   # GPU: bfloat16, real size
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings

from benchmarks import backends, keras_hub_peer
from benchmarks.keras_hub_peer import KERAS_HUB
from benchmarks.reporting import caption, quartiles, table, turn_order

DEFAULT_CARD = "meta-llama/Llama-3.2-1B"


BACKENDS = ("tensorflow", "jax", "torch")
OURS, THEIRS = "keras_mha", "transformers"
#: transformers' fastest documented path: its static cache with `torch.compile`
#: (`CompileConfig`, "reduce-overhead": CUDA graphs on a GPU).
THEIRS_COMPILED = "transformers_static_compile"
QUANTIZED_KV = "quantized_kv"  # keras-mha with `--kv-cache-dtype`
KV_CACHE_DTYPES = ("int8", "float8_e4m3fn")


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="keras-mha bench model",
        description="Prefill and decode tokens/s of a decoder on the current Keras backend, "
        "beside transformers on torch, with paired ratios.",
    )
    parser.add_argument("--card", default=DEFAULT_CARD, help="bundled card giving the shape")
    parser.add_argument(
        "--scale",
        type=int,
        default=8,
        help="divide width, heads, MLP width by this and layers by half of it (default 8)",
    )
    parser.add_argument(
        "--full-size",
        action="store_true",
        help="the card's real size in bfloat16 (for GPU machines)",
    )
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument(
        "--rounds",
        "--repeats",
        dest="rounds",
        type=int,
        default=10,
        help="timed rounds, each running both sides in turn (default 10)",
    )
    parser.add_argument(
        "--backends",
        help="comma-separated Keras backends, each run in a fresh process, into one table "
        "(default: the current KERAS_BACKEND only)",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        help="also time keras-mha with this quantized KV cache, paired against its float cache",
    )
    parser.add_argument(
        "--quantize",
        choices=("int8", "int4", "float8"),
        help="load keras-mha's model with from_pretrained(quantize=...) (transformers stays float)",
    )
    parser.add_argument("--no-transformers", action="store_true", help="skip the torch reference")
    parser.add_argument(
        "--no-compiled-transformers",
        action="store_true",
        help="skip transformers' static cache + torch.compile (its compile takes minutes)",
    )
    parser.add_argument(
        "--no-keras-hub",
        action="store_true",
        help="skip keras-hub's generate (loaded from the same checkpoint)",
    )
    parser.add_argument(
        "--decode-path",
        default="auto",
        help="generate(decode_path=...) of keras-mha (default auto: the backend's fastest)",
    )
    parser.add_argument(
        "--no-roofline", action="store_true", help="skip the decode bound (bandwidth roofline)"
    )
    parser.add_argument("--format", choices=("table", "json", "markdown"), default="table")
    parser.add_argument("--json", action="store_true", help="the same as --format json")
    arguments = parser.parse_args(argv)
    for name in ("scale", "batch", "prompt_length", "new_tokens", "rounds"):
        if getattr(arguments, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if arguments.new_tokens < 2:
        parser.error("--new-tokens must be at least 2 (one prefill token and one decode step)")
    if arguments.json:
        arguments.format = "json"
    if arguments.backends is not None:
        names = [name.strip() for name in arguments.backends.split(",") if name.strip()]
        unknown = [name for name in names if name not in BACKENDS]
        if unknown or not names:
            parser.error(
                f"--backends {arguments.backends!r}: expected a comma-separated subset of "
                f"{','.join(BACKENDS)}"
            )
        arguments.backends = names
    return arguments


def scaled_config(config: dict, scale: int) -> dict:
    """The card's config with width, heads and layers divided, vocabulary capped at 32000.

    Example:
        >>> c = scaled_config({"hidden_size": 2048, "num_attention_heads": 32,
        ...     "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192,
        ...     "num_hidden_layers": 16, "vocab_size": 128256}, 8)
        >>> [c[k] for k in ("hidden_size", "num_attention_heads", "num_hidden_layers")]
        [256, 4, 4]
    """
    config = dict(config)
    heads = max(config["num_attention_heads"] // scale, 1)
    kv_heads = max(config.get("num_key_value_heads", heads) // scale, 1)
    while heads % kv_heads:
        kv_heads -= 1
    config.update(
        hidden_size=max(config["hidden_size"] // scale, 8),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=max(config["intermediate_size"] // scale, 8),
        num_hidden_layers=max(config["num_hidden_layers"] // max(scale // 2, 1), 1),
        vocab_size=min(config["vocab_size"], 32000),
    )
    if config.get("head_dim"):
        config["head_dim"] = config["hidden_size"] // heads
    # None, not absent: a family's default id may lie outside the capped vocabulary
    # (Phi-3's pad id is 32000).
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        config[key] = None
    return config


def check_sizes(config: dict, arguments, dtype: str) -> None:
    """Refuse a prompt and new tokens past the card's positions, or a batch whose memory
    exceeds the device's (and, with transformers beside, this machine's RAM)."""
    from keras_mha.errors import UsageError
    from keras_mha.models.limits import check_memory, device_memory, host_memory
    from keras_mha.planning.spec import from_config

    length = arguments.prompt_length + arguments.new_tokens
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and length > positions:
        raise UsageError(
            f"--prompt-length {arguments.prompt_length} + --new-tokens {arguments.new_tokens} "
            f"= {length} positions, past the card's max_position_embeddings={positions}",
            key="--prompt-length",
        )
    spec = from_config(config)
    flags = "--batch / --prompt-length / --new-tokens"
    for memory in (device_memory(), None if arguments.no_transformers else host_memory()):
        if memory is not None:
            check_memory(
                spec,
                batch=arguments.batch,
                seq_len=length,
                dtype=dtype,
                argument=flags,
                memory=memory,
            )


def median_seconds(function, repeats):
    function()  # warm-up: compiles
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_rounds(contenders: dict, rounds: int, clock=time.perf_counter) -> dict:
    """Time each contender's `(prefill, full)` calls over `rounds` rounds, taking turns.

    Each contender's calls run once untimed first (they compile). In a round every
    prefill runs, then every full generation, in `turn_order` (the side that goes first
    alternates). Returns `{name: {"prefill_seconds": [...], "total_seconds": [...]}}`, one
    entry per round.

    Example:
        >>> ticks = iter(range(100))
        >>> times = time_rounds({"a": (print, print)}, 2, clock=lambda: next(ticks))
        <BLANKLINE>
        <BLANKLINE>
        <BLANKLINE>
        <BLANKLINE>
        <BLANKLINE>
        <BLANKLINE>
        >>> times["a"]["total_seconds"]
        [1, 1]
    """
    for prefill, full in contenders.values():
        prefill()
        full()
    names = list(contenders)
    times = {name: {"prefill_seconds": [], "total_seconds": []} for name in names}
    for round_number in range(rounds):
        order = [names[index] for index in turn_order(len(names), round_number)]
        for key, call in (("prefill_seconds", 0), ("total_seconds", 1)):
            for name in order:
                start = clock()
                contenders[name][call]()
                times[name][key].append(clock() - start)
    return times


def round_rates(times: dict, batch: int, prompt_length: int, new_tokens: int) -> dict:
    """Per-round prefill and decode tokens/s from `time_rounds`' times of one contender,
    and their medians.

    Example:
        >>> rates = round_rates({"prefill_seconds": [0.5], "total_seconds": [1.5]}, 1, 64, 11)
        >>> rates["prefill_tokens_per_second"], rates["decode_tokens_per_second"]
        (128.0, 10.0)
    """
    prefill = [batch * prompt_length / seconds for seconds in times["prefill_seconds"]]
    # A round whose full run came out faster than its prefill (noise) counts as very fast:
    # the median, not the mean, summarises the rounds.
    decode = [
        batch * (new_tokens - 1) / max(total - first, 1e-9)
        for first, total in zip(times["prefill_seconds"], times["total_seconds"], strict=True)
    ]
    return {
        "prefill_tokens_per_second": statistics.median(prefill),
        "decode_tokens_per_second": statistics.median(decode),
        "rounds": {
            **times,
            "prefill_tokens_per_second": prefill,
            "decode_tokens_per_second": decode,
        },
    }


def paired_ratios(ours: dict, theirs: dict) -> dict:
    """keras-mha / transformers tokens/s, round by round: median, quartiles, min and max
    for prefill and decode (above 1: keras-mha is faster).

    Example:
        >>> ours = {"rounds": {"prefill_tokens_per_second": [2, 3, 8],
        ...                    "decode_tokens_per_second": [1, 1, 1]}}
        >>> theirs = {"rounds": {"prefill_tokens_per_second": [1, 1, 4],
        ...                      "decode_tokens_per_second": [2, 2, 2]}}
        >>> paired_ratios(ours, theirs)["prefill"]["median"]
        2.0
    """
    paired = {}
    for phase in ("prefill", "decode"):
        key = f"{phase}_tokens_per_second"
        ratios = [
            mine / other
            for mine, other in zip(ours["rounds"][key], theirs["rounds"][key], strict=True)
        ]
        low, median, high = quartiles(ratios)
        paired[phase] = {
            "median": median,
            "quartiles": [low, high],
            "min": min(ratios),
            "max": max(ratios),
            "ratios": ratios,
        }
    return paired


def run_model_benchmark(argv=None) -> int:
    """Entry point of `keras-mha bench model`; returns the exit code."""
    arguments = parse_args(argv)
    if arguments.backends:
        reports = [backend_results(backend, arguments) for backend in arguments.backends]
    else:
        reports = [model_results(arguments)]
    if arguments.format == "json":
        print(json.dumps(reports if arguments.backends else reports[0], indent=2))
        return 0
    print(render(reports, arguments, markdown=arguments.format == "markdown"))
    return 0


def worker_argv(arguments) -> list[str]:
    """The flags of one backend's fresh process: the same shape, JSON out.

    Example:
        >>> worker_argv(parse_args(["--backends", "jax", "--rounds", "3"]))[-4:]
        ['--new-tokens', '32', '--rounds', '3']
    """
    argv = ["--format", "json", "--card", arguments.card, "--scale", str(arguments.scale)]
    argv += ["--full-size"] * arguments.full_size + [
        "--no-transformers"
    ] * arguments.no_transformers
    argv += ["--no-compiled-transformers"] * arguments.no_compiled_transformers
    argv += ["--no-keras-hub"] * arguments.no_keras_hub
    argv += ["--no-roofline"] * arguments.no_roofline + ["--decode-path", arguments.decode_path]
    for flag in ("batch", "prompt_length", "new_tokens", "rounds"):
        argv += [f"--{flag.replace('_', '-')}", str(getattr(arguments, flag))]
    if arguments.kv_cache_dtype:
        argv += ["--kv-cache-dtype", arguments.kv_cache_dtype]
    if arguments.quantize:
        argv += ["--quantize", arguments.quantize]
    return argv


def backend_results(backend: str, arguments) -> dict:
    """`model_results` on `backend`, in a fresh process (a Keras backend is fixed at import)."""
    from benchmarks import run_worker

    return json.loads(run_worker("model", backend, worker_argv(arguments)))


def model_results(arguments, extra_contenders=None) -> dict:
    """Prefill and decode rates of keras-mha (and transformers) for parsed `arguments`;
    `results["config"]` is the config the model was built from. `extra_contenders`
    (`{name: (first, second)}`) take their turns in the same rounds (`bench roofline`
    times a memory copy there); their times are `results["extra_times"][name]`."""
    import keras
    import numpy as np
    import torch
    import transformers

    from keras_mha.hub import load_config
    from keras_mha.models import from_pretrained, generate, generation_stats

    config = dict(load_config(f"bundled:{arguments.card}").config)
    dtype = "bfloat16" if arguments.full_size else "float32"
    if not arguments.full_size:
        config = scaled_config(config, arguments.scale)
    config["torch_dtype"] = dtype
    check_sizes(config, arguments, dtype)
    hf_config = transformers.AutoConfig.for_model(**config)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = transformers.AutoModelForCausalLM.from_config(
            hf_config, dtype=getattr(torch, dtype)
        ).eval()
    # transformers runs where torch's fast device is, as keras-mha runs on Keras's.
    torch_device = "cuda" if torch.cuda.is_available() else "cpu"
    rng = np.random.default_rng(0)
    ids = rng.integers(0, config["vocab_size"], (arguments.batch, arguments.prompt_length))
    ids = ids.astype("int32")
    results = {
        "card": arguments.card,
        "full_size": arguments.full_size,
        "dtype": dtype,
        "shape": {
            key: config[key]
            for key in (
                "hidden_size",
                "num_attention_heads",
                "num_key_value_heads",
                "num_hidden_layers",
                "intermediate_size",
                "vocab_size",
            )
        },
        "parameters": sum(p.numel() for p in reference.parameters()),
        "batch": arguments.batch,
        "prompt_length": arguments.prompt_length,
        "new_tokens": arguments.new_tokens,
        "quantize": arguments.quantize,
    }
    # Asked away (--no-keras-hub): no row, as --no-transformers; no peer: a row and why.
    skipped = None if arguments.no_keras_hub else keras_hub_peer.unavailable(config["model_type"])
    with tempfile.TemporaryDirectory() as folder:
        reference.save_pretrained(folder)
        model = from_pretrained(folder, dtype=dtype, quantize=arguments.quantize)
        hub = None
        if not (arguments.no_keras_hub or skipped):
            hub = keras_hub_peer.load(folder, dtype)
    reference.to(torch_device)
    new = arguments.new_tokens
    path = arguments.decode_path

    def ours(count, **options):
        return lambda: generate(model, ids, count, decode_path=path, **options)

    contenders = {OURS: (ours(1), ours(new))}
    kv_dtype = arguments.kv_cache_dtype
    if kv_dtype:
        contenders[QUANTIZED_KV] = (
            ours(1, kv_cache_dtype=kv_dtype),
            ours(new, kv_cache_dtype=kv_dtype),
        )
    if not arguments.no_transformers:
        torch_ids = torch.from_numpy(ids.astype("int64")).to(torch_device)
        compiled = transformers.CompileConfig()
        compiled._compile_all_devices = True  # transformers compiles by itself on GPUs only

        def theirs(count, **options):
            def run():
                with torch.no_grad(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    reference.generate(
                        torch_ids,
                        max_new_tokens=count,
                        min_new_tokens=count,
                        do_sample=False,
                        pad_token_id=0,
                        **options,
                    )
                if torch_device == "cuda":
                    torch.cuda.synchronize()  # keras-mha's generate returns NumPy: finished

            return run

        contenders[THEIRS] = (theirs(1), theirs(new))
        if not arguments.no_compiled_transformers:
            options = {"cache_implementation": "static", "compile_config": compiled}
            contenders[THEIRS_COMPILED] = (theirs(1, **options), theirs(new, **options))
    if hub is not None:
        contenders[KERAS_HUB] = tuple(keras_hub_peer.generator(hub, ids, n) for n in (1, new))
    contenders.update(extra_contenders or {})
    times = time_rounds(contenders, arguments.rounds)
    results["extra_times"] = {name: times[name] for name in extra_contenders or ()}
    shape = (arguments.batch, arguments.prompt_length, new)
    results[OURS] = {
        "backend": keras.backend.backend(),
        **round_rates(times[OURS], *shape),
        "generation": generation_stats(model),
    }
    if kv_dtype:
        results[QUANTIZED_KV] = quantized_kv_results(model, kv_dtype, times, shape, results)
    for name in (THEIRS, THEIRS_COMPILED):
        if name in times:
            results[name] = {
                "backend": f"torch {torch.__version__}",
                **round_rates(times[name], *shape),
            }
    if THEIRS in results:
        results["paired"] = paired_ratios(results[OURS], results[THEIRS])
    if THEIRS_COMPILED in results:
        results["paired_compiled"] = paired_ratios(results[OURS], results[THEIRS_COMPILED])
    results["keras_hub_skipped"] = skipped
    if hub is not None:
        import keras_hub

        results[KERAS_HUB] = {
            "backend": f"{keras.backend.backend()}, keras-hub {keras_hub.__version__}",
            "generate": keras_hub_peer.compiled_as(hub),
            **round_rates(times[KERAS_HUB], *shape),
        }
        results["paired_keras_hub"] = paired_ratios(results[OURS], results[KERAS_HUB])
    results["rounds"] = arguments.rounds
    results["machine"] = machine()
    results["machine"]["device"] = backends.device_name()
    results["config"] = config
    if not arguments.no_roofline:
        results["roofline"] = roofline(results, arguments, dtype)
    return results


def roofline(results: dict, arguments, dtype: str) -> dict:
    """Each decode's tokens/s as a fraction of the bandwidth bound on this device (the
    planner's card figures on a GPU, the measured copy bandwidth on the CPU), at the
    decode's mean context (prompt + half the new tokens)."""
    from benchmarks.roofline import device_bound

    context = arguments.prompt_length + arguments.new_tokens // 2
    limits, source = device_bound(results["config"], dtype=dtype, batch=arguments.batch,
                                  seq_len=context, device=results["machine"]["device"])  # fmt: skip
    report = {"source": source, "decode_context": context, "bound_tokens_per_second": None}
    if limits is None:
        return report
    bound = limits.decode_tokens_per_s  # over the whole batch, as the decode tok/s here
    report.update(bound_tokens_per_second=bound, limited_by=limits.decode_limited_by)
    for name in (OURS, THEIRS, THEIRS_COMPILED, KERAS_HUB):
        if name in results:
            report[name] = results[name]["decode_tokens_per_second"] / bound
    return report


def quantized_kv_results(model, kv_dtype, times, shape, results) -> dict:
    """The quantized-cache contender's rates, paired against keras-mha's float cache (above
    1: the quantized cache is faster), and both caches' bytes at this batch and length."""
    from keras_mha.layers.kv_quantization import cache_bytes

    batch, prompt_length, new = shape
    rates = round_rates(times[QUANTIZED_KV], *shape)
    length = prompt_length + new

    def total(dtype):
        return sum(cache_bytes(cache) for cache in model.init_caches(batch, length, dtype=dtype))

    return {
        "kv_cache_dtype": kv_dtype,
        **rates,
        "paired_with_float_cache": paired_ratios(rates, results[OURS]),
        "cache_bytes": {"float": total(None), kv_dtype: total(kv_dtype), "length": length},
    }


def machine() -> dict:
    """Where the bench ran: the date (UTC), the processor and its logical CPUs."""
    import datetime
    import os
    import platform

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
    }


def _ratio_cell(paired: dict | None) -> str:
    if paired is None:
        return "-"
    low, high = paired["quartiles"]
    return f"{paired['median']:.2f}x ({low:.2f}-{high:.2f})"


def _rate_cell(row: dict | None, phase: str) -> str:
    if row is None:
        return "-"
    low, _, high = quartiles(row["rounds"][f"{phase}_tokens_per_second"])
    # A tenth of a token/s is signal below 100 tok/s, noise above (and widens the column).
    digits = 1 if phase == "decode" and row[f"{phase}_tokens_per_second"] < 100 else 0
    return f"{row[f'{phase}_tokens_per_second']:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def _quantized_clause(arguments) -> str:
    mode = getattr(arguments, "quantize", None)
    return "" if mode is None else f" (keras-mha's blocks {mode}, peers float)"


def _device_clause(machine: dict) -> str:
    device = machine.get("device", "cpu")
    return "" if device == "cpu" else f", {device}"


#: The peers of keras-mha in the report, in order, with their row labels.
PEERS = {THEIRS: "transformers", THEIRS_COMPILED: "transformers compiled", KERAS_HUB: "keras-hub"}
#: The key of keras-mha's paired ratios against each peer in `model_results`' results.
PAIRED = {THEIRS: "paired", THEIRS_COMPILED: "paired_compiled", KERAS_HUB: "paired_keras_hub"}


def _rows(report: dict) -> list[list[str]]:
    """One backend's rows: its name, keras-mha, then each peer that ran and keras-mha's
    paired ratio to it (keras-hub as dashes when it was skipped)."""
    ours = report[OURS]
    stats = ours["generation"]
    mode = stats.get("path") or ("compiled" if stats.get("compiled") else "eager")
    bounds = report.get("roofline", {})

    def fraction(name):
        value = bounds.get(name)
        return "-" if value is None else f"{value:.2f}"

    def rates(label, name):
        row = report.get(name)
        return [label, _rate_cell(row, "prefill"), _rate_cell(row, "decode"), fraction(name)]

    rows = [[ours["backend"], "", "", ""], rates(f"  keras-mha ({mode})", OURS)]
    for name, label in PEERS.items():
        paired = report.get(PAIRED[name])
        if paired is not None:
            rows.append(rates(f"  {label}", name))
            rows.append(
                ["    ratio", _ratio_cell(paired["prefill"]), _ratio_cell(paired["decode"]), ""]
            )
        elif name == KERAS_HUB and report.get("keras_hub_skipped"):
            rows.append([f"  {label}", "-", "-", "-"])
    return rows


def _notes(report: dict) -> list[str]:
    """The lines under the table about one backend's keras-hub and quantized-cache runs."""
    backend = report[OURS]["backend"]
    notes = []
    hub, skipped = report.get(KERAS_HUB), report.get("keras_hub_skipped")
    if hub is not None:
        notes.append(
            f"keras-hub on {backend}: generate runs as {hub['generate']} ({hub['backend']})"
        )
    elif skipped:
        notes.append(f"keras-hub on {backend}: not run: {skipped}")
    quantized = report.get(QUANTIZED_KV)
    if quantized:
        paired, sizes = quantized["paired_with_float_cache"], quantized["cache_bytes"]
        dtype = quantized["kv_cache_dtype"]
        notes.append(
            f"KV cache {dtype} / float ({backend}), tok/s in the same round: prefill "
            f"{_ratio_cell(paired['prefill'])}, decode {_ratio_cell(paired['decode'])}; cache "
            f"{sizes[dtype]:,} bytes vs {sizes['float']:,} at {sizes['length']} tokens"
        )
    return notes


def render(reports: list[dict], arguments, markdown: bool = False) -> str:
    """One block of rows per backend: keras-mha's and each peer's tokens/s, each as the
    median over the rounds with the quartiles in parentheses, keras-mha's paired ratio to
    each peer, and each decode over the bound; text lines keep to 80 columns."""
    first = reports[0]
    shape = first["shape"]
    size = "(full size)" if arguments.full_size else f"/ {arguments.scale}"
    heading = (
        f"{arguments.card} {size}: hidden {shape['hidden_size']}, "
        f"{shape['num_attention_heads']} heads ({shape['num_key_value_heads']} KV), "
        f"{shape['num_hidden_layers']} layers, vocab {shape['vocab_size']}, "
        f"{first['parameters'] / 1e6:.1f}M parameters, {first['dtype']}"
        f"{_quantized_clause(arguments)}; batch "
        f"{arguments.batch}, prompt {arguments.prompt_length}, {arguments.new_tokens} new "
        f"tokens; {first['machine']['processor']}, {first['machine']['cpus']} CPUs"
        f"{_device_clause(first['machine'])}, "
        f"{first['machine']['date']}"
    )
    legend = (
        f"medians of {arguments.rounds} rounds, quartiles in parentheses; ratio = keras-mha "
        f"/ the row above, tok/s in the same round (above 1: keras-mha faster)"
    )
    if any(THEIRS_COMPILED in report for report in reports):
        legend += "; transformers compiled = its static cache + torch.compile"
    bounds = first.get("roofline")
    if bounds and bounds.get("bound_tokens_per_second"):
        legend += (
            f"; / bound = decode tok/s over the bound, {bounds['bound_tokens_per_second']:.1f} "
            f"tok/s at {bounds['decode_context']} tokens of context ({bounds['limited_by']}; "
            f"{bounds['source']})"
        )
    # A markdown paragraph reflows by itself; a terminal's lines are wrapped here.
    wrap = (lambda text: [text]) if markdown else caption
    lines = wrap(heading) + wrap(legend) + [""]
    header = ["backend", "prefill tok/s", "decode tok/s", "/ bound"]
    lines += table(header, [row for report in reports for row in _rows(report)], markdown)
    notes = [note for report in reports for note in _notes(report)]
    if notes:
        lines.append("")
    for note in notes:
        lines += wrap(note)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(run_model_benchmark(sys.argv[1:]))
