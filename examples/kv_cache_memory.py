"""Plot how much memory the KV cache of popular models needs as the context grows.

Six bundled model cards, one per way of spending (or saving) KV-cache memory:

- Llama-2-7B: multi-head attention, every head caches its own keys and values;
- Llama-3-8B: grouped-query attention, 32 query heads share 8 KV heads;
- Mistral-7B: GQA plus a 4096-token sliding window, so the cache stops growing;
- Falcon-7B: multi-query attention, one KV head for 71 query heads;
- DeepSeek-V2-Lite: multi-head latent attention, caching a 512+64 latent per token;
- Gemma-3-4B: GQA with 5 of every 6 layers on a 1024-token sliding window.

(Llama-3-8B and Mistral-7B cost the same per token, so their lines overlap until
Mistral's window fills at 4k tokens; the markers tell them apart.)

The costs come from each model's config.json alone (`keras_mha.cards`), without
weights, keras or a backend. Lines are solid up to the model's own context length
and dashed beyond it.

    python examples/kv_cache_memory.py --out kv_cache_memory.png

Example:
    >>> import subprocess, sys
    >>> subprocess.run([sys.executable, "examples/kv_cache_memory.py", "--out", "/tmp/kv.png"])
    ... # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import sys

from keras_mha.cards.costs import kv_cache_cost
from keras_mha.cards.hub import load_config
from keras_mha.cards.report import context_length
from keras_mha.cards.spec import from_config

MODELS = {
    "Llama-2-7B": "meta-llama/Llama-2-7b-hf",
    "Llama-3-8B": "meta-llama/Meta-Llama-3-8B",
    "Mistral-7B": "mistralai/Mistral-7B-v0.1",
    "Falcon-7B": "tiiuae/falcon-7b",
    "DeepSeek-V2-Lite": "deepseek-ai/DeepSeek-V2-Lite",
    "Gemma-3-4B": "google/gemma-3-4b-it",
}
GIB = 1024**3


def sequence_lengths(maximum: int) -> list[int]:
    """Powers of two from 1024 up to `maximum` (inclusive when it is one).

    Example:
        >>> sequence_lengths(8192)
        [1024, 2048, 4096, 8192]
    """
    lengths, length = [], 1024
    while length <= maximum:
        lengths.append(length)
        length *= 2
    return lengths


def kv_cache_curves(seq_lens: list[int], *, batch: int, kv_dtype: str) -> list[dict]:
    """For each model: label, attention kind, context length and KV-cache bytes per length.

    Example:
        >>> curves = kv_cache_curves([1024], batch=1, kv_dtype="bfloat16")
        >>> curves[1]["label"], curves[1]["bytes"][0]
        ('Llama-3-8B', 134217728)
    """
    curves = []
    for label, repo_id in MODELS.items():
        loaded = load_config(f"bundled:{repo_id}")
        spec = from_config(loaded.config, model_id=repo_id)
        curves.append(
            {
                "label": label,
                "repo_id": repo_id,
                "kind": spec.attention_kind,
                "context_length": context_length(spec),
                "bytes": [
                    kv_cache_cost(spec, seq_len=seq_len, batch=batch, kv_dtype=kv_dtype).total_bytes
                    for seq_len in seq_lens
                ],
            }
        )
    return curves


def plot(curves: list[dict], seq_lens: list[int], out: str, *, batch: int, kv_dtype: str) -> None:
    """Draw the curves on log-log axes and save a PNG to `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter

    figure, axes = plt.subplots(figsize=(9, 5.5), dpi=120)
    for index, curve in enumerate(curves):
        color, marker = f"C{index}", "osD^vP"[index % 6]
        gib = [size / GIB for size in curve["bytes"]]
        limit = curve["context_length"] or seq_lens[-1]
        inside = [i for i, seq_len in enumerate(seq_lens) if seq_len <= limit]
        outside = [i for i, seq_len in enumerate(seq_lens) if seq_len >= limit] or []
        label = f"{curve['label']} ({curve['kind']})"
        if inside:
            axes.plot(
                [seq_lens[i] for i in inside], [gib[i] for i in inside],
                color=color, marker=marker, markersize=4.5, linewidth=2, label=label,
            )  # fmt: skip
        if len(outside) > 1 or not inside:
            axes.plot(
                [seq_lens[i] for i in outside], [gib[i] for i in outside],
                color=color, linestyle="--", linewidth=1.2, alpha=0.7,
                label=None if inside else label,
            )  # fmt: skip
        axes.annotate(
            f"{gib[-1]:.1f} GiB" if gib[-1] >= 1 else f"{gib[-1] * 1024:.0f} MiB",
            (seq_lens[-1], gib[-1]), xytext=(6, 0), textcoords="offset points",
            va="center", fontsize=8, color=color,
        )  # fmt: skip

    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.xaxis.set_major_locator(FixedLocator(seq_lens))
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{int(value) // 1024}k"))
    axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axes.set_xlim(seq_lens[0] / 1.2, seq_lens[-1] * 1.9)
    axes.set_xlabel("context length (tokens)")
    axes.set_ylabel("KV cache (GiB, log scale)")
    axes.set_title(f"KV-cache memory per sequence ({kv_dtype}, batch {batch})")
    axes.grid(True, which="major", alpha=0.3)
    axes.legend(loc="upper left", fontsize=9, title="dashed: beyond the model's context")
    figure.tight_layout()
    figure.savefig(out)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="kv_cache_memory.png", help="PNG file to write")
    parser.add_argument("--max-seq-len", type=int, default=131072, help="longest context plotted")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--kv-dtype", default="bfloat16")
    arguments = parser.parse_args(argv)

    seq_lens = sequence_lengths(arguments.max_seq_len)
    if not seq_lens:
        parser.error(f"--max-seq-len={arguments.max_seq_len} must be at least 1024")
    curves = kv_cache_curves(seq_lens, batch=arguments.batch, kv_dtype=arguments.kv_dtype)

    name_width = max(len(curve["label"]) + len(curve["kind"]) + 3 for curve in curves)
    print(f"{'model':<{name_width}}" + "".join(f"{n // 1024:>9}k" for n in seq_lens) + "  (GiB)")
    for curve in curves:
        name = f"{curve['label']} ({curve['kind']})"
        print(f"{name:<{name_width}}" + "".join(f"{b / GIB:>10.2f}" for b in curve["bytes"]))

    plot(curves, seq_lens, arguments.out, batch=arguments.batch, kv_dtype=arguments.kv_dtype)
    print(f"saved {arguments.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
