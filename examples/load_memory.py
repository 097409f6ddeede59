"""Peak memory of `from_pretrained` on TensorFlow, JAX and PyTorch: is the checkpoint held twice?

1. A subprocess has transformers write a random Llama-shaped checkpoint (156 MB of
   float32 safetensors: 8 layers of width 512, a 16000-token vocabulary, untied LM head)
   into a temporary folder, then exits, so its memory is counted nowhere.
2. For each backend, a fresh Python process imports keras (`KERAS_BACKEND` set) and
   `keras_mha.models.from_pretrained`, runs one tiny op so the backend has started, and
   notes its resident memory (VmRSS): the baseline. Nothing has touched the checkpoint
   yet. It then resets the kernel's peak-RSS mark to the current RSS
   (`/proc/self/clear_refs`), loads the checkpoint with `from_pretrained`, and reads the
   peak (VmHWM). Where the mark cannot be reset, the lifetime peak (`ru_maxrss`) is
   used instead, which can only make the figure larger; the `peak_from` field says
   which one was read.

The peak over the baseline, divided by the checkpoint's bytes, is what loading costs:
the model's own variables are 1x, anything above is transient (the import of the
model code, one tensor's transposing copy, the backend's work while creating the
variables). The target is < 1.5x. `held_after_load` is the RSS once loading returned.

With `--quantize int8` (or `int4`, `float8`), each backend runs two processes instead:
`from_pretrained(folder, quantize=mode)`, which builds the quantized layers directly and
quantizes each tensor as it is read, and `from_pretrained(folder)` followed by
`model.quantize(mode)`; both peaks are read the same way (docs/guides/quantization.md).

Run (all three backends, one process each; about a minute on 2 cores):

    python examples/load_memory.py
    python examples/load_memory.py --backends jax --json
    python examples/load_memory.py --backends torch --quantize int8
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BACKENDS = ("tensorflow", "jax", "torch")
TARGET = 1.5

WRITE_CHECKPOINT = """
import sys, torch, transformers
config = transformers.LlamaConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
    num_attention_heads=8, num_key_value_heads=2, vocab_size=16000, tie_word_embeddings=False)
torch.manual_seed(0)
transformers.LlamaForCausalLM(config).save_pretrained(sys.argv[1])
"""


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> bool:
    """Set the kernel's peak-RSS mark (VmHWM) to the current RSS; False where not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return _status_bytes("VmHWM") <= _status_bytes("VmRSS") + (1 << 20)


def _load(folder: str, quantize: str | None, how: str):
    from keras_mha.models import from_pretrained

    if how == "while loading":
        return from_pretrained(folder, quantize=quantize)
    model = from_pretrained(folder)
    if quantize is not None:
        model.quantize(quantize)
    return model


def measure(folder: str, quantize: str | None = None, how: str = "after") -> dict:
    """Load `folder` on the current backend and return the memory figures (this process):
    in float, or quantized `how` = "while loading" or "after" (module docstring)."""
    import keras

    size = sum(path.stat().st_size for path in Path(folder).glob("*.safetensors"))
    keras.ops.convert_to_numpy(keras.ops.zeros((1,)) + 1)  # the backend has started
    baseline = _status_bytes("VmRSS")
    reset = _reset_peak()
    start = time.perf_counter()
    model = _load(folder, quantize, how)
    seconds = time.perf_counter() - start
    if reset:
        peak = _status_bytes("VmHWM")
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    after = _status_bytes("VmRSS")
    return {
        "backend": keras.backend.backend(),
        "quantize": quantize and f"{quantize}, {how}",
        "checkpoint_bytes": size,
        "parameters": model.count_params(),
        "baseline_rss_bytes": baseline,
        "peak_rss_bytes": peak,
        "peak_from": "VmHWM after clear_refs" if reset else "ru_maxrss (lifetime)",
        "rss_after_load_bytes": after,
        "peak_increase_over_checkpoint": (peak - baseline) / size,
        "held_after_load_over_checkpoint": (after - baseline) / size,
        "load_seconds": seconds,
    }


def run_backend(backend: str, folder: str, quantize=None, how="after") -> dict:
    """`measure` in a fresh process for `backend` (each backend's memory on its own)."""
    environment = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    root = str(Path(__file__).resolve().parent.parent)
    environment["PYTHONPATH"] = os.pathsep.join(
        p for p in (root, environment.get("PYTHONPATH")) if p
    )
    completed = subprocess.run(
        [sys.executable, __file__, "--measure", folder]
        + (["--quantize", quantize, "--how", how] if quantize else []),
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        tail = completed.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"KERAS_BACKEND={backend}: the measurement failed: {tail[0]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def _label(result: dict) -> str:
    return result["backend"] + (f" ({result['quantize']})" if result["quantize"] else "")


def table(results: list[dict]) -> str:
    mb = 1 / 1e6
    lines = [
        f"checkpoint: {results[0]['checkpoint_bytes'] * mb:.0f} MB float32 safetensors, "
        f"{results[0]['parameters']:,} parameters; target peak < {TARGET}x",
        f"{'backend':<22} {'baseline':>9} {'peak above':>11} {'peak/ckpt':>10} "
        f"{'held/ckpt':>10} {'load':>7}  peak read from",
    ]
    for r in results:
        lines.append(
            f"{_label(r):<22} {r['baseline_rss_bytes'] * mb:>6.0f} MB "
            f"{(r['peak_rss_bytes'] - r['baseline_rss_bytes']) * mb:>8.0f} MB "
            f"{r['peak_increase_over_checkpoint']:>9.2f}x "
            f"{r['held_after_load_over_checkpoint']:>9.2f}x {r['load_seconds']:>6.1f}s  "
            f"{r['peak_from']}"
        )
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--quantize", choices=("int8", "int4", "float8"), help="quantized, two ways (above)"
    )
    parser.add_argument("--measure", metavar="FOLDER", help=argparse.SUPPRESS)
    parser.add_argument("--how", default="after", help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.measure:
        print(json.dumps(measure(arguments.measure, arguments.quantize, arguments.how)))
        return []
    ways = ("while loading", "after") if arguments.quantize else ("after",)
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run([sys.executable, "-c", WRITE_CHECKPOINT, folder], check=True)
        results = [
            run_backend(backend, folder, arguments.quantize, how)
            for backend in arguments.backends
            for how in ways
        ]
    print(json.dumps(results, indent=2) if arguments.json else table(results))
    return results


if __name__ == "__main__":
    main()
