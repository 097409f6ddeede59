"""`keras-mha bench inspect`: how long `inspect` and `compare` take from a cold process.

`keras-mha bench inspect [--model ORG/NAME] [--compare-with ORG/NAME] [--gpu NAME]
[--repeat N] [--transformers-repeat N] [--skip-transformers] [--format table|json]`
runs, each as a fresh subprocess and timed by wall clock:

1. `python -c pass` - the floor: interpreter start-up alone;
2. `keras-mha inspect bundled:ORG/NAME --format json` - the whole CLI: start-up,
   imports, reading the bundled config, the cost model, the memory figures, the JSON;
3. the same with `--gpu NAME` - plus the fit search (largest context and batch per KV
   dtype, training);
4. `keras-mha compare bundled:ORG/NAME bundled:OTHER --gpu NAME --format json` - two
   models side by side (compare needs two);
5. a script that imports torch and transformers and instantiates the same config's
   model on the meta device (no weights allocated) and counts its parameters - the
   usual way to learn a model's size without downloading it. Skipped, with a message,
   when torch or transformers is not installed.

It prints the median and minimum of each. Nothing is cached between runs other than
what the operating system caches (the files are warm after the first run, which is
not counted). With `PYTHONDONTWRITEBYTECODE` set and no `__pycache__` beside the
sources, every run compiles keras-mha's modules again; the table says so.

Example:
    >>> from benchmarks.startup import main
    >>> main(["--repeat", "3", "--skip-transformers"])  # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_MODEL = "meta-llama/Meta-Llama-3-8B"
DEFAULT_OTHER_MODEL = "mistralai/Mistral-7B-v0.1"
DEFAULT_GPU = "H100"

# Run in a fresh interpreter: import torch + transformers, build the model on the meta
# device from the config alone, and report the split between imports and instantiation.
_TRANSFORMERS_SCRIPT = r"""
import json, sys, time
start = time.perf_counter()
import torch
import transformers
imported = time.perf_counter()
config = transformers.AutoConfig.from_pretrained(sys.argv[1])
model_class = getattr(transformers, config.architectures[0])
with torch.device("meta"):
    model = model_class(config)
built = time.perf_counter()
parameters = sum(parameter.numel() for parameter in model.parameters())
print(json.dumps({"import_s": imported - start, "instantiate_s": built - imported,
                  "parameters": parameters}))
"""


@dataclass
class Timing:
    """Wall-clock seconds of repeated runs of one command, and the CPU seconds (user +
    system) each run used: on a loaded machine the wall time includes waiting for a core,
    the CPU time does not."""

    name: str
    command: str
    seconds: list[float]
    cpu_seconds: list[float] = field(default_factory=list)

    @property
    def median_cpu(self) -> float | None:
        return statistics.median(self.cpu_seconds) if self.cpu_seconds else None

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def minimum(self) -> float:
        return min(self.seconds)

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "command": self.command,
            "runs": len(self.seconds),
            "median_s": round(self.median, 4),
            "min_s": round(self.minimum, 4),
            "median_cpu_s": None if self.median_cpu is None else round(self.median_cpu, 4),
        }


def cli_command(*arguments: str) -> list[str]:
    """A `keras-mha` command line, through the installed console script when present.

    Example:
        >>> cli_command("inspect", "bundled:openai-community/gpt2")[-2:]
        ['inspect', 'bundled:openai-community/gpt2']
    """
    script = Path(sys.executable).parent / "keras-mha"
    launcher = [str(script)] if script.is_file() else [sys.executable, "-m", "keras_mha.cli"]
    return [*launcher, *arguments]


def inspect_command(model: str, *flags: str) -> list[str]:
    """The timed `keras-mha inspect` command line for a bundled card.

    Example:
        >>> inspect_command("openai-community/gpt2")[-3:]
        ['bundled:openai-community/gpt2', '--format', 'json']
    """
    return cli_command("inspect", f"bundled:{model}", *flags, "--format", "json")


def compare_command(models: list[str], *flags: str) -> list[str]:
    """The timed `keras-mha compare` command line for bundled cards.

    Example:
        >>> compare_command(["a/b", "c/d"], "--gpu", "L4")[-6:]
        ['bundled:a/b', 'bundled:c/d', '--gpu', 'L4', '--format', 'json']
    """
    bundled = [f"bundled:{model}" for model in models]
    return cli_command("compare", *bundled, *flags, "--format", "json")


def bytecode_note() -> str | None:
    """Why the timings may include compiling keras-mha's sources, or None.

    Example:
        >>> bytecode_note() is None or "PYTHONDONTWRITEBYTECODE" in bytecode_note()
        True
    """
    import keras_mha

    cache = Path(keras_mha.__file__).parent / "cards" / "__pycache__"
    if os.environ.get("PYTHONDONTWRITEBYTECODE") and not cache.is_dir():
        return (
            "PYTHONDONTWRITEBYTECODE is set and keras-mha has no __pycache__: every run "
            "compiles its sources (run `python -m compileall` on the package, or unset it)"
        )
    return None


def time_command(name: str, command: list[str], repeat: int, *, environment=None) -> Timing:
    """Run `command` once to warm up, then `repeat` times; raise if any run fails.

    Example:
        >>> time_command("python", [sys.executable, "-c", "pass"], 2).name
        'python'
    """
    from keras_mha.errors import KerasMHAError

    seconds, cpu_seconds = [], []
    for run in range(repeat + 1):
        completed, elapsed, cpu = _run_timed(command, environment)
        if completed.returncode != 0:
            raise KerasMHAError(
                f"{' '.join(command)} exited with {completed.returncode}: "
                f"{completed.stderr.strip()[-500:]}"
            )
        if run:
            seconds.append(elapsed)
            cpu_seconds.append(cpu)
    return Timing(name, " ".join(command), seconds, cpu_seconds)


def _run_timed(command: list[str], environment) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run `command` once: (its result, wall seconds, CPU seconds of the child)."""
    cpu_before = _children_cpu_seconds()
    start = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, env=environment)
    elapsed = time.perf_counter() - start
    return completed, elapsed, _children_cpu_seconds() - cpu_before


def _children_cpu_seconds() -> float:
    """User + system CPU seconds of the finished child processes so far."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure_transformers(model: str, repeat: int) -> tuple[Timing | None, dict | str]:
    """Time the meta-device instantiation of the bundled config; (None, reason) if impossible."""
    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        return None, f"skipped: {' and '.join(missing)} not installed"
    from keras_mha.hub.bundled import bundled_config_path

    config_path = bundled_config_path(model)
    if config_path is None:
        return None, f"skipped: no bundled card for {model}"
    environment = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    with tempfile.TemporaryDirectory() as directory:
        # A directory with only config.json, as transformers expects from a checkpoint.
        shutil.copy(config_path, Path(directory) / "config.json")
        command = [sys.executable, "-c", _TRANSFORMERS_SCRIPT, directory]
        seconds, cpu_seconds, runs = [], [], []
        for run in range(repeat + 1):
            completed, elapsed, cpu = _run_timed(command, environment)
            if completed.returncode != 0:
                return None, f"failed: {completed.stderr.strip().splitlines()[-1:]}"
            if run:  # the first run warms the file cache, as for the other commands
                seconds.append(elapsed)
                cpu_seconds.append(cpu)
                runs.append(json.loads(completed.stdout.strip().splitlines()[-1]))
    # Medians of the in-process split, so it describes the same runs as the wall times.
    details = {
        "import_s": round(statistics.median(run["import_s"] for run in runs), 4),
        "instantiate_s": round(statistics.median(run["instantiate_s"] for run in runs), 4),
        "parameters": runs[-1]["parameters"],
    }
    shown = f"python -c <import torch, transformers; {Path(config_path).parent.name} on meta>"
    timing = Timing("transformers meta-device instantiation", shown, seconds, cpu_seconds)
    return timing, details


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keras-mha bench inspect",
        description="Wall time of `keras-mha inspect` and `compare` in a fresh process, "
        "beside python start-up and transformers' meta-device instantiation of the same "
        "config.",
    )
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"bundled card (default {DEFAULT_MODEL})"
    )
    parser.add_argument(
        "--compare-with",
        default=DEFAULT_OTHER_MODEL,
        help=f"the second bundled card of the timed compare (default {DEFAULT_OTHER_MODEL})",
    )
    parser.add_argument(
        "--gpu", default=DEFAULT_GPU, help=f"--gpu of the timed fit search (default {DEFAULT_GPU})"
    )
    parser.add_argument(
        "--repeat", type=int, default=20, help="runs of each fast command (default 20)"
    )
    parser.add_argument(
        "--transformers-repeat",
        type=int,
        default=3,
        help="runs of the transformers script (default 3)",
    )
    parser.add_argument("--skip-transformers", action="store_true", help="do not run transformers")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table (or JSON); returns the exit status.

    Example:
        >>> main(["--repeat", "2", "--skip-transformers", "--format", "json"])  # doctest: +SKIP
        0
    """
    arguments = build_parser().parse_args(argv)
    from keras_mha.errors import RepositoryNotFoundError, UsageError
    from keras_mha.hub.bundled import bundled_config_path
    from keras_mha.planning.planner.gpus import find_gpu

    if arguments.repeat < 1 or arguments.transformers_repeat < 1:
        raise UsageError("--repeat and --transformers-repeat must be >= 1", key="--repeat")
    for model in (arguments.model, arguments.compare_with):
        if bundled_config_path(model) is None:
            raise RepositoryNotFoundError(f"no bundled card {model!r}; see `keras-mha cards`")
    if arguments.compare_with == arguments.model:
        raise UsageError("--compare-with names --model again; expected another bundled card")
    gpu = find_gpu(arguments.gpu).name
    repeat = arguments.repeat
    models = [arguments.model, arguments.compare_with]
    timings = [
        time_command("python startup", [sys.executable, "-c", "pass"], repeat),
        time_command("keras-mha inspect", inspect_command(arguments.model), repeat),
        time_command(
            f"keras-mha inspect --gpu {gpu}",
            inspect_command(arguments.model, "--gpu", arguments.gpu),
            repeat,
        ),
        time_command(
            f"keras-mha compare (2 models) --gpu {gpu}",
            compare_command(models, "--gpu", arguments.gpu),
            repeat,
        ),
    ]
    if arguments.skip_transformers:
        transformers_timing, transformers_details = None, "skipped: --skip-transformers"
    else:
        transformers_timing, transformers_details = measure_transformers(
            arguments.model, arguments.transformers_repeat
        )
    if transformers_timing is not None:
        timings.append(transformers_timing)

    result = {
        "model": arguments.model,
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "timings": [timing.as_dict() for timing in timings],
        "transformers": transformers_details,
        "note": bytecode_note(),
    }
    if arguments.format == "json":
        print(json.dumps(result, indent=2))
        return 0
    print(f"startup benchmark: {arguments.model}, {os.cpu_count()} CPUs, Python {result['python']}")
    width = max(len(timing.name) for timing in timings)
    print(f"  {'':<{width}}  {'median':>9}  {'min':>9}  {'cpu':>9}  runs")
    for timing in timings:
        cpu = "-" if timing.median_cpu is None else f"{timing.median_cpu:.3f}s"
        print(
            f"  {timing.name:<{width}}  {timing.median:>8.3f}s  {timing.minimum:>8.3f}s  "
            f"{cpu:>9}  {len(timing.seconds)}"
        )
    print("  (median and min: wall time; cpu: median user + system CPU time of the process)")
    if isinstance(transformers_details, dict):
        print(
            f"  transformers split (medians): imports {transformers_details['import_s']:.2f}s, "
            f"instantiation {transformers_details['instantiate_s']:.2f}s, "
            f"{transformers_details['parameters']:,} parameters"
        )
    else:
        print(f"  transformers: {transformers_details}")
    print(f"  inspect command: {timings[1].command}")
    if result["note"]:
        print(f"  note: {result['note']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
