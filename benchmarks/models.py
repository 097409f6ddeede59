"""Benchmark of whole-model generation: prefill and decode tokens/s, beside transformers.

A decoder shaped like a bundled card (default Llama-3.2-1B), scaled down to fit a small
CPU unless `--full-size`, gets random weights from transformers (`save_pretrained` into a
temporary folder), is loaded with `from_pretrained` on the current Keras backend and
timed with `generate`; transformers' own `generate` on torch runs the same checkpoint.

- prefill tokens/s: `batch * prompt_length` / time of `generate(..., max_new_tokens=1)`;
- decode tokens/s: `batch * (new_tokens - 1)` / (time of `generate(..., new_tokens)` minus
  that prefill time).

Each figure is the median of `--repeats` runs after one warm-up run (which compiles).

Example:
    KERAS_BACKEND=jax python -m benchmarks model --scale 8
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

DEFAULT_CARD = "meta-llama/Llama-3.2-1B"


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="keras-mha bench model",
        description="Prefill and decode tokens/s of a decoder on the current Keras backend, "
        "beside transformers on torch.",
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
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-transformers", action="store_true", help="skip the torch reference")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    arguments = parser.parse_args(argv)
    for name in ("scale", "batch", "prompt_length", "new_tokens", "repeats"):
        if getattr(arguments, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if arguments.new_tokens < 2:
        parser.error("--new-tokens must be at least 2 (one prefill token and one decode step)")
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
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        config.pop(key, None)
    return config


def check_sizes(config: dict, arguments, dtype: str) -> None:
    """Refuse a prompt and new tokens past the card's positions, or a batch whose memory
    exceeds the device's (and, with transformers beside, this machine's RAM)."""
    from keras_mha.cards.spec import from_config
    from keras_mha.errors import UsageError
    from keras_mha.models.limits import check_memory, device_memory, host_memory

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


def _rates(prefill_seconds, total_seconds, arguments):
    tokens = arguments.batch * arguments.prompt_length
    decoded = arguments.batch * (arguments.new_tokens - 1)
    return {
        "prefill_seconds": prefill_seconds,
        "total_seconds": total_seconds,
        "prefill_tokens_per_second": tokens / prefill_seconds,
        "decode_tokens_per_second": decoded / max(total_seconds - prefill_seconds, 1e-9),
    }


def run_model_benchmark(argv=None) -> int:
    """Entry point of `keras-mha bench model`; returns the exit code."""
    arguments = parse_args(argv)
    results = model_results(arguments)
    if arguments.json:
        print(json.dumps(results, indent=2))
        return 0
    print_results(results, arguments)
    return 0


def model_results(arguments) -> dict:
    """Prefill and decode rates of keras-mha (and transformers) for parsed `arguments`;
    `results["config"]` is the config the model was built from."""
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
    }
    with tempfile.TemporaryDirectory() as folder:
        reference.save_pretrained(folder)
        model = from_pretrained(folder, dtype=dtype)

    def ours(new):
        return lambda: generate(model, ids, new)

    results["keras_mha"] = {
        "backend": keras.backend.backend(),
        **_rates(
            median_seconds(ours(1), arguments.repeats),
            median_seconds(ours(arguments.new_tokens), arguments.repeats),
            arguments,
        ),
        "generation": generation_stats(model),
    }
    if not arguments.no_transformers:
        torch_ids = torch.from_numpy(ids.astype("int64"))

        def theirs(new):
            def run():
                with torch.no_grad():
                    reference.generate(
                        torch_ids,
                        max_new_tokens=new,
                        min_new_tokens=new,
                        do_sample=False,
                        pad_token_id=0,
                    )

            return run

        results["transformers"] = {
            "backend": f"torch {torch.__version__}",
            **_rates(
                median_seconds(theirs(1), arguments.repeats),
                median_seconds(theirs(arguments.new_tokens), arguments.repeats),
                arguments,
            ),
        }
    results["config"] = config
    return results


def print_results(results: dict, arguments) -> None:
    """The table `keras-mha bench model` prints."""
    dtype = results["dtype"]
    shape = results["shape"]
    print(
        f"{arguments.card} {'(full size)' if arguments.full_size else f'/ {arguments.scale}'}: "
        f"hidden {shape['hidden_size']}, {shape['num_attention_heads']} heads "
        f"({shape['num_key_value_heads']} KV), {shape['num_hidden_layers']} layers, vocab "
        f"{shape['vocab_size']}, {results['parameters'] / 1e6:.1f}M parameters, {dtype}; "
        f"batch {arguments.batch}, prompt {arguments.prompt_length}, "
        f"{arguments.new_tokens} new tokens"
    )
    print(f"{'implementation':<34} {'prefill tok/s':>14} {'decode tok/s':>13}")
    for name in ("keras_mha", "transformers"):
        if name in results:
            row = results[name]
            label = f"{'keras-mha' if name == 'keras_mha' else 'transformers'} ({row['backend']})"
            print(
                f"{label:<34} {row['prefill_tokens_per_second']:>14.0f} "
                f"{row['decode_tokens_per_second']:>13.1f}"
            )
    stats = results["keras_mha"]["generation"]
    print(
        f"decode step: {'compiled' if stats.get('compiled') else 'eager'}, traced "
        f"{stats.get('step_traces')} time(s) over {stats.get('step_calls')} calls"
    )


if __name__ == "__main__":
    sys.exit(run_model_benchmark(sys.argv[1:]))
