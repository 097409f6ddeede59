"""The measurement harness of keras-mha: run from a source checkout, not shipped in the wheel.

    keras-mha bench [layers|model|inspect|roofline|host-cost] [ARGS...]   # or: python -m benchmarks

- `layers` (`layers.py`, with `backends.py` for what differs per backend): the attention
  layers against Keras, keras-hub and the backend's fused kernel (the default);
- `model` (`models.py`, with `keras_hub_peer.py` for keras-hub's side): whole-model
  prefill and decode tokens/s, beside transformers and keras-hub;
- `inspect` (`startup.py`): `keras-mha inspect` and `compare` from a cold process;
- `roofline` (`roofline.py`): measured decode tokens/s against the planner's speed bound
  on this CPU (its measured copy bandwidth);
- `host-cost` (`host_cost.py`): the per-token time of a tiny Llama, where only host work
  is left, per backend and decode path, beside transformers' three caches.

`BENCHMARKS` names each benchmark's module and entry point (a function taking the
argument list and returning the exit status); `keras_mha.commands.bench` dispatches on it.

Example:
    >>> from benchmarks import BENCHMARKS
    >>> sorted(BENCHMARKS)
    ['host-cost', 'inspect', 'layers', 'model', 'roofline']
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: The repository root: put on a worker's PYTHONPATH, so `python -m benchmarks.layers`
#: finds the harness from any working directory.
CHECKOUT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: `module.function(argv) -> exit status`, and a line of help."""

    module: str
    function: str
    help: str


BENCHMARKS = {
    "layers": Benchmark(
        "benchmarks.layers",
        "main",
        "attention layers against Keras, keras-hub and the backend's fused kernel (the default)",
    ),
    "model": Benchmark("benchmarks.models", "run_model_benchmark", "whole models (generate)"),
    "inspect": Benchmark(
        "benchmarks.startup", "main", "`inspect` and `compare` from a cold process (no backend)"
    ),
    "roofline": Benchmark(
        "benchmarks.roofline",
        "main",
        "measured decode tokens/s against the planner's bound with this CPU's bandwidth",
    ),
    "host-cost": Benchmark(
        "benchmarks.host_cost",
        "main",
        "per-token host time of a tiny Llama per backend and decode path, beside transformers",
    ),
}
DEFAULT_BENCHMARK = "layers"


def worker_environment() -> dict[str, str]:
    """`os.environ` with the checkout first on PYTHONPATH, for a benchmark's worker process.

    Example:
        >>> worker_environment()["PYTHONPATH"].split(os.pathsep)[0] == str(CHECKOUT)
        True
    """
    python_path = [str(CHECKOUT), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(python_path)}


def run_worker(benchmark: str, backend: str, argv: list[str]) -> str:
    """`python -m benchmarks BENCHMARK ARGV...` on `backend` in a fresh process (a Keras
    backend is fixed at import); its standard output. A failure raises `KerasMHAError`
    with the worker's last line of errors."""
    import subprocess
    import sys

    from keras_mha.errors import KerasMHAError

    sys.stderr.write(f"  bench {benchmark}: {backend}...\n")
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks", benchmark, *argv],
        env={**worker_environment(), "KERAS_BACKEND": backend},
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        lines = completed.stderr.strip().splitlines() or ["(no output)"]
        raise KerasMHAError(f"bench {benchmark} on {backend} failed: {lines[-1]}")
    return completed.stdout
