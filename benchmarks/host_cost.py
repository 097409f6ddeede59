"""`keras-mha bench host-cost`: the host's time per decode token, on a model too small to compute.

A Llama of 2 layers, hidden 64 (random weights written by transformers) spends almost
nothing on arithmetic per token, so what a token costs is the host's work: dispatch,
Python, compiled-program calls, reading tokens back. For each Keras backend (each in a
fresh process) and each decode path of `generate` (`DECODE_PATHS`) the per-token time is
`(time of 64 greedy tokens - time of 1) / 63`; beside them, transformers' `generate` on
torch with its dynamic cache, its static cache, and its static cache compiled
(`CompileConfig`, what transformers does by itself on a GPU: `torch.compile` in
"reduce-overhead" mode). The entries of a process take turns over `--rounds` rounds;
the table gives medians (quartiles in parentheses) and each row against transformers'
static compiled path (below 1: less host time per token).

Example:
    keras-mha bench host-cost                       # all three backends, one table
    keras-mha bench host-cost --backends jax --rounds 3 --format json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from benchmarks.models import BACKENDS, machine
from benchmarks.reporting import caption, quartiles, table, turn_order

TINY_LLAMA = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}
PROMPT_LENGTH = 8
#: The decode paths timed per backend (`generate(decode_path=...)`), the default first.
PATHS = {
    "jax": ("loop", "per_token"),
    "tensorflow": ("loop", "per_token"),
    "torch": ("device_loop", "per_token"),  # the CPU's default with the whole-model step
}
REFERENCE = "transformers static + compile"
#: The ratio column's name (the caption says what it is: 80 columns).
RATIO_LABEL = "compiled"


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="keras-mha bench host-cost",
        description="Per-token decode time of a 2-layer, hidden-64 Llama (host cost only) "
        "on each backend and decode path, beside transformers' dynamic, static and "
        "compiled static caches.",
    )
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compile-torch", action="store_true",
                        help="also time generate(compile_torch=True) on torch")  # fmt: skip
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--transformers-threads", type=int, default=None,
                        help="torch's intra-op threads for transformers (default: torch's "
                             "own; keras-mha times its own count and one)")  # fmt: skip
    parser.add_argument("--format", choices=("table", "json", "markdown"), default="table")
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)  # a worker's model folder
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.new_tokens < 2 or arguments.rounds < 1:
        parser.error("--new-tokens must be at least 2 and --rounds positive")
    if arguments.transformers_threads is not None and arguments.transformers_threads < 1:
        parser.error(f"--transformers-threads {arguments.transformers_threads}: expected >= 1")
    names = [name.strip() for name in arguments.backends.split(",") if name.strip()]
    if not names or any(name not in BACKENDS for name in names):
        parser.error(f"--backends {arguments.backends!r}: expected a subset of {BACKENDS}")
    arguments.backends = names
    return arguments


def per_token_seconds(entries: dict, new_tokens: int, rounds: int, clock=None) -> dict:
    """`{name: [seconds per token, one per round]}` for `entries` `{name: generate(count)}`,
    taking turns; each entry runs once untimed first (it compiles).

    Example:
        >>> ticks = iter(range(0, 100, 2))
        >>> per_token_seconds({"a": lambda count: None}, 3, 2, clock=lambda: next(ticks))
        {'a': [0.0, 0.0]}
    """
    import time

    clock = clock or time.perf_counter
    for run in entries.values():
        run(1)
        run(new_tokens)
    names = list(entries)
    seconds = {name: [] for name in names}
    for round_number in range(rounds):
        for index in turn_order(len(names), round_number):
            name = names[index]
            start = clock()
            entries[name](1)
            first = clock() - start
            start = clock()
            entries[name](new_tokens)
            total = clock() - start
            seconds[name].append(max(total - first, 0.0) / (new_tokens - 1))
    return seconds


def keras_mha_rows(arguments) -> dict:
    """This process's backend: `{"keras-mha <backend> <path>": [seconds per token]}`."""
    import keras
    import numpy as np

    from keras_mha.models import from_pretrained, generate, generation_stats

    backend = keras.backend.backend()
    model = from_pretrained(arguments.checkpoint)
    ids = np.arange(PROMPT_LENGTH, dtype="int32")[None] % TINY_LLAMA["vocab_size"]
    entries = {}
    paths = list(PATHS[backend])
    for path in paths:
        entries[f"keras-mha {backend} {path}"] = lambda count, path=path: generate(
            model, ids, count, decode_path=path
        )
    if backend == "torch" and arguments.compile_torch:
        entries[f"keras-mha {backend} per_token compile_torch"] = lambda count: generate(
            model, ids, count, compile_torch=True
        )
    generate(model, ids, 2)
    default = generation_stats(model)["path"]
    rows = per_token_seconds(entries, arguments.new_tokens, arguments.rounds)
    return {"rows": rows, "default_path": {backend: default}}


def transformers_rows(arguments) -> dict:
    """transformers' `generate` on torch (CPU or CUDA) with its three caches."""
    import warnings

    import torch
    import transformers

    if arguments.transformers_threads is not None:
        torch.set_num_threads(arguments.transformers_threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(arguments.checkpoint).eval()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    ids = (torch.arange(PROMPT_LENGTH) % TINY_LLAMA["vocab_size"])[None].to(device)
    compiled = transformers.CompileConfig()
    compiled._compile_all_devices = True  # transformers compiles by itself on GPUs only

    def run(**options):
        def call(count):
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.generate(ids, max_new_tokens=count, min_new_tokens=count,
                               do_sample=False, pad_token_id=0, **options)  # fmt: skip
            if device == "cuda":
                torch.cuda.synchronize()

        return call

    entries = {
        "transformers dynamic cache": run(),
        "transformers static cache": run(cache_implementation="static"),
        REFERENCE: run(cache_implementation="static", compile_config=compiled),
    }
    return {"rows": per_token_seconds(entries, arguments.new_tokens, arguments.rounds)}


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def write_checkpoint(folder: str) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**TINY_LLAMA)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)


def worker(backend: str, arguments) -> dict:
    from benchmarks import run_worker

    argv = ["--worker", "--checkpoint", arguments.checkpoint, "--rounds", str(arguments.rounds),
            "--new-tokens", str(arguments.new_tokens)]  # fmt: skip
    argv += ["--compile-torch"] * arguments.compile_torch
    output = run_worker("host-cost", backend, argv)
    return json.loads(output.strip().splitlines()[-1])


def render(report: dict, markdown: bool) -> str:
    rows = report["rows"]
    reference = rows.get(REFERENCE)
    reference_median = quartiles(reference)[1] if reference else None
    lines = caption(
        f"Llama, {TINY_LLAMA['num_hidden_layers']} layers, hidden {TINY_LLAMA['hidden_size']}: "
        f"per-token decode time of {report['new_tokens']} greedy tokens after a "
        f"{PROMPT_LENGTH}-token prompt, medians of {report['rounds']} rounds (quartiles); "
        f"{report['machine']['processor']}, {report['machine']['cpus']} CPUs, "
        f"load {report['load_average']}, {report['machine']['date']}"
    )
    lines += caption(f"default decode paths: {report['default_path']}")
    lines += caption(
        f"vs {RATIO_LABEL}: the ratio to {REFERENCE} (transformers on "
        f"{report['transformers_threads']} torch thread(s))"
    )
    lines.append("")
    body = []
    for name, seconds in rows.items():
        low, middle, high = quartiles(seconds)
        ratio = "-" if reference_median is None else f"{middle / reference_median:.2f}x"
        body.append([name, f"{middle * 1e3:.3f} ({low * 1e3:.3f}-{high * 1e3:.3f})", ratio])
    lines += table(["implementation and path", "ms per token", f"vs {RATIO_LABEL}"], body, markdown)
    return "\n".join(lines)


def main(argv=None) -> int:
    """Entry point of `keras-mha bench host-cost`; returns the exit code."""
    arguments = parse_args(argv)
    if arguments.worker:
        print(json.dumps(keras_mha_rows(arguments)))
        return 0
    report = {"rows": {}, "default_path": {}, "new_tokens": arguments.new_tokens,
              "rounds": arguments.rounds}  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        write_checkpoint(folder)
        arguments.checkpoint = folder
        for backend in arguments.backends:
            found = worker(backend, arguments)
            report["rows"].update(found["rows"])
            report["default_path"].update(found["default_path"])
        if not arguments.no_transformers:
            report["rows"].update(transformers_rows(arguments)["rows"])
    report["machine"] = machine()
    report["transformers_threads"] = arguments.transformers_threads or _torch_threads()
    report["load_average"] = [round(x, 1) for x in os.getloadavg()]
    if arguments.format == "json":
        print(json.dumps(report, indent=2))
    else:
        print(render(report, markdown=arguments.format == "markdown"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
