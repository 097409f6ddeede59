"""How long `keras-mha inspect` takes, from a cold process, beside the transformers approach.

`python tools/bench_inspect_startup.py [--model ORG/NAME] [--repeat N] [--transformers-repeat N]`
runs, each as a fresh subprocess and timed by wall clock:

1. `python -c pass` - the floor: interpreter start-up alone;
2. `keras-mha inspect bundled:ORG/NAME --format json` - the whole CLI: start-up,
   imports, reading the bundled config, the cost model and the JSON output;
3. a script that imports torch and transformers and instantiates the same config's
   model on the meta device (no weights allocated) and counts its parameters - the
   usual way to learn a model's size without downloading it. Skipped, with a message,
   when torch or transformers is not installed.

It prints the median and minimum of each. Nothing is cached between runs other than
what the operating system caches (the files are warm after the first run, which is
not counted).

Example:
    >>> from bench_inspect_startup import main
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
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "meta-llama/Meta-Llama-3-8B"

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
    """Wall-clock seconds of repeated runs of one command."""

    name: str
    command: str
    seconds: list[float]

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
        }


def inspect_command(model: str) -> list[str]:
    """The `keras-mha inspect` command line, through the installed console script when present.

    Example:
        >>> inspect_command("openai-community/gpt2")[-3:]
        ['bundled:openai-community/gpt2', '--format', 'json']
    """
    script = Path(sys.executable).parent / "keras-mha"
    launcher = [str(script)] if script.is_file() else [sys.executable, "-m", "keras_mha.cli"]
    return [*launcher, "inspect", f"bundled:{model}", "--format", "json"]


def time_command(name: str, command: list[str], repeat: int, *, environment=None) -> Timing:
    """Run `command` once to warm up, then `repeat` times; raise if any run fails.

    Example:
        >>> time_command("python", [sys.executable, "-c", "pass"], 2).name
        'python'
    """
    seconds = []
    for run in range(repeat + 1):
        start = time.perf_counter()
        completed = subprocess.run(command, capture_output=True, text=True, env=environment)
        elapsed = time.perf_counter() - start
        if completed.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command)} exited with {completed.returncode}: "
                f"{completed.stderr.strip()[-500:]}"
            )
        if run:
            seconds.append(elapsed)
    return Timing(name, " ".join(command), seconds)


def measure_transformers(model: str, repeat: int) -> tuple[Timing | None, dict | str]:
    """Time the meta-device instantiation of the bundled config; (None, reason) if impossible."""
    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        return None, f"skipped: {' and '.join(missing)} not installed"
    from keras_mha.cards.bundled import bundled_config_path

    config_path = bundled_config_path(model)
    if config_path is None:
        return None, f"skipped: no bundled card for {model}"
    environment = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    with tempfile.TemporaryDirectory() as directory:
        # A directory with only config.json, as transformers expects from a checkpoint.
        shutil.copy(config_path, Path(directory) / "config.json")
        command = [sys.executable, "-c", _TRANSFORMERS_SCRIPT, directory]
        seconds, runs = [], []
        for run in range(repeat + 1):
            start = time.perf_counter()
            completed = subprocess.run(command, capture_output=True, text=True, env=environment)
            elapsed = time.perf_counter() - start
            if completed.returncode != 0:
                return None, f"failed: {completed.stderr.strip().splitlines()[-1:]}"
            if run:  # the first run warms the file cache, as for the other commands
                seconds.append(elapsed)
                runs.append(json.loads(completed.stdout.strip().splitlines()[-1]))
    # Medians of the in-process split, so it describes the same runs as the wall times.
    details = {
        "import_s": round(statistics.median(run["import_s"] for run in runs), 4),
        "instantiate_s": round(statistics.median(run["instantiate_s"] for run in runs), 4),
        "parameters": runs[-1]["parameters"],
    }
    shown = f"python -c <import torch, transformers; {Path(config_path).parent.name} on meta>"
    return Timing("transformers meta-device instantiation", shown, seconds), details


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python tools/bench_inspect_startup.py",
        description="Wall time of `keras-mha inspect` in a fresh process, beside python "
        "start-up and transformers' meta-device instantiation of the same config.",
    )
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"bundled card (default {DEFAULT_MODEL})"
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
    if arguments.repeat < 1 or arguments.transformers_repeat < 1:
        print("keras-mha: error: --repeat and --transformers-repeat must be >= 1", file=sys.stderr)
        return 2
    from keras_mha.cards.bundled import bundled_config_path

    if bundled_config_path(arguments.model) is None:
        print(f"keras-mha: error: no bundled card {arguments.model!r}", file=sys.stderr)
        return 3

    python = time_command("python startup", [sys.executable, "-c", "pass"], arguments.repeat)
    inspect = time_command("keras-mha inspect", inspect_command(arguments.model), arguments.repeat)
    timings = [python, inspect]
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
    }
    if arguments.format == "json":
        print(json.dumps(result, indent=2))
        return 0
    print(f"startup benchmark: {arguments.model}, {os.cpu_count()} CPUs, Python {result['python']}")
    width = max(len(timing.name) for timing in timings)
    print(f"  {'':<{width}}  {'median':>9}  {'min':>9}  runs")
    for timing in timings:
        print(
            f"  {timing.name:<{width}}  {timing.median:>8.3f}s  {timing.minimum:>8.3f}s  "
            f"{len(timing.seconds)}"
        )
    if isinstance(transformers_details, dict):
        print(
            f"  transformers split (medians): imports {transformers_details['import_s']:.2f}s, "
            f"instantiation {transformers_details['instantiate_s']:.2f}s, "
            f"{transformers_details['parameters']:,} parameters"
        )
    else:
        print(f"  transformers: {transformers_details}")
    print(f"  inspect command: {inspect.command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
