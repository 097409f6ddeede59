"""Quantized weights and KV caches against float, on a small decoder trained here.

The task makes the next token depend on what attention reads from the cache: each row is
a random 5-token pattern repeated (token t equals token t - 5), so after the first period
a model that attends one period back predicts every token. The script

1. trains a tiny Llama-style decoder (2 layers, 4 query heads sharing 2 KV heads of size
   16, hidden size 32, 24 tokens) on 512 such rows with `fit`;
2. measures, for each KV dtype (the model's float32, `int8`, `float8_e4m3fn`): the
   perplexity of 256 held-out rows run through a KV cache of that dtype (positions after
   the first period), the share of 24 greedy `generate` tokens that equal the float
   cache's, and the cache's bytes against what the planner states for that KV dtype;
3. measures the same for each weight mode (`int8`, `int4` per column, `int4` in blocks of
   128 inputs, `float8`: a copy of the model through `model.quantize`), with the float
   cache and with an int8 one, against the float model, and the weights' bytes;
4. prints markdown tables (docs/guides/quantization.md shows one run), and with
   `--save-weights` keeps the trained weights (tests/models/pattern_decoder.npz is this
   file, which the test of `generate(..., kv_cache_dtype=...)` loads).

    KERAS_BACKEND=jax python examples/quantized_kv_cache.py
    KERAS_BACKEND=jax python examples/quantized_kv_cache.py --save-weights weights.npz
"""

from __future__ import annotations

import argparse

import keras
import numpy as np

from keras_mha.layers.kv_quantization import cache_bytes
from keras_mha.models import build_model, generate
from keras_mha.planning.costs import kv_cache_cost
from keras_mha.planning.kv_formats import kv_format
from keras_mha.planning.spec import from_config

PERIOD, LENGTH, VOCAB = 5, 40, 24
CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 2,
    "vocab_size": VOCAB,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
}
KV_DTYPES = (None, "int8", "float8_e4m3fn")
# (label, `quantize` mode, int4 block size): Keras's modes as keras-mha runs them.
WEIGHT_MODES = (
    ("int8", "int8", None),
    ("int4 per column", "int4", -1),
    ("int4, block 128", "int4", 128),
    ("float8 (Keras's)", "float8", None),
)


def patterns(count, seed):
    """Rows of a random `PERIOD`-token pattern repeated: token t equals token t - PERIOD."""
    rng = np.random.default_rng(seed)
    return np.tile(rng.integers(0, VOCAB, (count, PERIOD)), LENGTH // PERIOD).astype("int32")


def pattern_decoder(weights=None, epochs=6, seed=0):
    """The tiny decoder: trained on `patterns` rows, or with `weights` (a `.npz`) loaded."""
    keras.utils.set_random_seed(seed)
    model = build_model(from_config(CONFIG))
    if weights is not None:
        with np.load(weights) as stored:
            model.set_weights([stored[f"w{i}"] for i in range(len(stored.files))])
        return model
    ids = patterns(512, seed=seed)
    x = {"token_ids": ids[:, :-1], "padding_mask": np.ones_like(ids[:, :-1])}
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss)
    model.fit(x, ids[:, 1:], epochs=epochs, batch_size=32, verbose=0)
    return model


def cached_perplexity(model, ids, kv_dtype):
    """exp(mean cross-entropy) of positions after the first period, the rows run as one
    prefill into caches of `kv_dtype` (the prefill attends to the keys and values as the
    cache holds them)."""
    caches = model.init_caches(ids.shape[0], ids.shape[1], dtype=kv_dtype)
    logits, _ = model.call_with_cache(keras.ops.convert_to_tensor(ids), None, caches, 0)
    logits = np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(logits, "float32")))
    logits = logits[:, PERIOD - 1 : -1]
    targets = ids[:, PERIOD:]
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    chosen = np.take_along_axis(log_probabilities, targets[..., None], axis=-1)
    return float(np.exp(-chosen.mean()))


def measure(model):
    """One row per KV dtype: perplexity, greedy agreement with the float cache, bytes."""
    held_out = patterns(256, seed=1)
    prompts = held_out[:32, : 2 * PERIOD]
    float_tokens = generate(model, prompts, 24)[:, 2 * PERIOD :]
    spec = from_config(CONFIG)
    rows = []
    for kv_dtype in KV_DTYPES:
        tokens = generate(model, prompts, 24, kv_cache_dtype=kv_dtype)[:, 2 * PERIOD :]
        runtime = sum(cache_bytes(c) for c in model.init_caches(1, 1024, dtype=kv_dtype))
        planned = kv_format(kv_dtype or "float32").name
        plan = kv_cache_cost(spec, seq_len=1024, kv_dtype=planned, compute_dtype="float32")
        rows.append(
            {
                "kv_dtype": kv_dtype or "float32",
                "perplexity": cached_perplexity(model, held_out, kv_dtype),
                "greedy_agreement": float((tokens == float_tokens).mean()),
                "cache_bytes": runtime,
                "plan_bytes": plan.total_bytes,
            }
        )
    return rows


def quantized_copy(model, mode, block_size):
    """A copy of `model` quantized by `model.quantize(mode)` (int4 with `block_size`)."""
    copy = build_model(from_config(CONFIG))
    copy.set_weights(model.get_weights())
    config = None
    if block_size is not None:
        config = keras.quantizers.Int4QuantizationConfig(block_size=block_size)
    copy.quantize(mode, config=config)
    return copy


def variable_bytes(model):
    return sum(int(np.prod(v.shape)) * np.dtype(str(v.dtype)).itemsize for v in model.variables)


def measure_weights(model):
    """One row per weight mode and KV cache (float, int8): perplexity and greedy agreement
    with the float model on its float cache, and the weights' bytes."""
    held_out = patterns(256, seed=1)
    prompts = held_out[:32, : 2 * PERIOD]
    float_tokens = generate(model, prompts, 24)[:, 2 * PERIOD :]
    rows = []
    copies = [("float32", model)]
    copies += [(label, quantized_copy(model, mode, size)) for label, mode, size in WEIGHT_MODES]
    for label, copy in copies:
        for kv_dtype in (None, "int8"):
            tokens = generate(copy, prompts, 24, kv_cache_dtype=kv_dtype)[:, 2 * PERIOD :]
            rows.append(
                {
                    "weights": label,
                    "kv_dtype": kv_dtype or "float32",
                    "perplexity": cached_perplexity(copy, held_out, kv_dtype),
                    "greedy_agreement": float((tokens == float_tokens).mean()),
                    "weights_bytes": variable_bytes(copy),
                }
            )
    return rows


def weights_markdown(rows):
    lines = [
        "| weights | KV cache | perplexity | greedy tokens = float's | weights bytes |",
        "|---|---|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['weights']} | {row['kv_dtype']} | {row['perplexity']:.4f} | "
            f"{row['greedy_agreement']:.1%} | {row['weights_bytes']:,} |"
        )
    return "\n".join(lines)


def markdown(rows):
    lines = [
        "| KV cache | perplexity | greedy tokens = float's | cache bytes (1,024 tokens) "
        "| planner |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['kv_dtype']} | {row['perplexity']:.4f} | {row['greedy_agreement']:.1%} | "
            f"{row['cache_bytes']:,} | {row['plan_bytes']:,} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--load-weights", help="a .npz from --save-weights: skip training")
    parser.add_argument("--save-weights", help="write the trained weights to this .npz")
    arguments = parser.parse_args(argv)
    model = pattern_decoder(arguments.load_weights, epochs=arguments.epochs)
    if arguments.save_weights:
        weights = {f"w{i}": w for i, w in enumerate(model.get_weights())}
        np.savez_compressed(arguments.save_weights, **weights)
    print(f"backend {keras.backend.backend()}")
    print(markdown(measure(model)))
    print()
    print(weights_markdown(measure_weights(model)))


if __name__ == "__main__":
    main()
