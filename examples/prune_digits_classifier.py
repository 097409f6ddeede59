"""Prune half of the attention heads of a small transformer while it trains.

The data is scikit-learn's handwritten digits (1,797 images of 8 x 8 pixels,
shipped with scikit-learn, no download): each image is read as a sequence of
8 tokens, one per pixel row. The script

1. trains an unpruned classifier (the baseline);
2. trains the same classifier from the same initial weights with the
   `HeadPruning` callback, which gates off 50% of the heads in steps during
   `fit` (scored with Taylor importance on a validation split);
3. removes the gated heads physically with `prune_heads`;
4. reports test accuracy, parameter count, attention FLOPs and measured
   forward latency (median of repeated timed calls) before and after.

Run (any backend):

    KERAS_BACKEND=jax python examples/prune_digits_classifier.py
    python examples/prune_digits_classifier.py --fast   # a few seconds, for smoke tests
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import keras
import numpy as np

from keras_mha.layers import GroupedQueryAttention
from keras_mha.pruning import (
    HeadPruning,
    find_attention_layers,
    model_attention_flops,
    prune_heads,
)

ROWS = 8  # tokens per image
NUM_CLASSES = 10


def load_data(seed):
    """Train / validation / test splits of the digits, pixels scaled to [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images / 16.0).astype("float32")  # (1797, 8, 8): 8 tokens of 8 pixels
    labels = digits.target.astype("int32")
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=0.2, stratify=labels, random_state=seed
    )
    x_train, x_val, y_train, y_val = train_test_split(
        x_train, y_train, test_size=0.125, stratify=y_train, random_state=seed
    )
    return (x_train, y_train), (x_val, y_val), (x_test, y_test)


class AddPositionEmbedding(keras.layers.Layer):
    """Adds a learned vector per token position."""

    def build(self, input_shape):
        self.position_embedding = self.add_weight(
            name="position_embedding",
            shape=tuple(input_shape[1:]),
            initializer=keras.initializers.RandomNormal(stddev=0.02),
        )

    def call(self, x):
        return x + self.position_embedding


def build_classifier(args):
    """Embedding of the pixel rows, post-norm transformer blocks, mean pooling, softmax."""
    inputs = keras.Input((ROWS, ROWS), name="pixel_rows")
    x = keras.layers.Dense(args.model_dim, name="row_embedding")(inputs)
    x = AddPositionEmbedding(name="positions")(x)
    for index in range(args.num_layers):
        attention = GroupedQueryAttention(
            num_heads=args.num_heads,
            num_key_value_heads=args.num_key_value_heads or args.num_heads,
            head_dim=args.head_dim,
            dropout=0.1,
            name=f"attention_{index}",
        )
        x = keras.layers.LayerNormalization(name=f"attention_norm_{index}")(x + attention(x))
        hidden = keras.layers.Dense(args.ffn_dim, activation="gelu", name=f"ffn_in_{index}")(x)
        hidden = keras.layers.Dense(args.model_dim, name=f"ffn_out_{index}")(hidden)
        hidden = keras.layers.Dropout(0.1)(hidden)
        x = keras.layers.LayerNormalization(name=f"ffn_norm_{index}")(x + hidden)
    x = keras.layers.GlobalAveragePooling1D()(x)
    outputs = keras.layers.Dense(NUM_CLASSES, name="classifier")(x)
    model = keras.Model(inputs, outputs, name="digits_transformer")
    model.compile(
        optimizer=keras.optimizers.Adam(args.learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def accuracy(model, x, y):
    logits = model.predict(x, batch_size=512, verbose=0)
    return float(np.mean(np.argmax(logits, axis=-1) == y))


def median_latencies_ms(models, x, repeats):
    """Median wall time (ms) of one compiled forward pass over `x`, for each model.

    Calls alternate between the models, so that both see the same machine
    load (on a shared CPU, other processes come and go).
    """
    for model in models:
        for _ in range(3):  # Warm-up: tracing / compilation.
            model.predict_on_batch(x)
    times = [[] for _ in models]
    for _ in range(repeats):
        for model, model_times in zip(models, times, strict=True):
            start = time.perf_counter()
            model.predict_on_batch(x)
            model_times.append(time.perf_counter() - start)
    return [1000.0 * statistics.median(model_times) for model_times in times]


def matmul_flops(model):
    """FLOPs per example of every matrix product: attention layers plus Dense layers."""
    dense = sum(
        2 * ROWS * int(np.prod(layer.kernel.shape))
        for layer in model._flatten_layers()
        if isinstance(layer, keras.layers.Dense)
    )
    return model_attention_flops(model, ROWS) + dense


def head_counts(model):
    return {
        path: (layer.num_heads, layer.num_key_value_heads)
        for path, layer in find_attention_layers(model).items()
    }


class EpochLine(keras.callbacks.Callback):
    """One line per epoch, so that a minute of training shows progress, not silence.

    Keras's own progress bar would also print `HeadPruning`'s array-valued logs; this
    prints the scalar ones and the number of heads gated off.
    """

    def __init__(self, label: str, epochs: int):
        super().__init__()
        self.label, self.epochs = label, epochs

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        parts = [
            f"{name} {float(value):.3f}"
            for name, value in logs.items()
            if name != "pruned_heads" and np.ndim(value) == 0
        ]
        if "pruned_heads" in logs:
            parts.append(f"heads gated off {int(logs['pruned_heads'])}")
        print(f"{self.label} epoch {epoch + 1}/{self.epochs}: {', '.join(parts)}", flush=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--num-heads", type=int, default=8)
    parser.add_argument(
        "--num-key-value-heads", type=int, default=None, help="default: num-heads (MHA)"
    )
    parser.add_argument("--head-dim", type=int, default=16)
    parser.add_argument("--model-dim", type=int, default=64)
    parser.add_argument("--ffn-dim", type=int, default=128)
    parser.add_argument("--prune-fraction", type=float, default=0.5)
    parser.add_argument("--method", default="taylor", choices=["taylor", "ablation", "magnitude"])
    parser.add_argument("--gqa-policy", default="group", choices=["group", "query"])
    parser.add_argument("--start-epoch", type=int, default=10, help="first pruning step")
    parser.add_argument("--end-epoch", type=int, default=25, help="last pruning step")
    parser.add_argument("--frequency", type=int, default=5, help="epochs between steps")
    parser.add_argument("--latency-batch", type=int, default=1024)
    parser.add_argument("--latency-repeats", type=int, default=30)
    parser.add_argument("--heatmap-dir", default=None, help="save importance heatmaps here")
    parser.add_argument("--json", default=None, help="write the figures to this file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--fast",
        action="store_true",
        help="tiny run for smoke tests: 256 training images, 3 epochs, pruning at epochs 1-2",
    )
    args = parser.parse_args(argv)
    if args.fast:
        args.epochs, args.start_epoch, args.end_epoch, args.frequency = 3, 1, 2, 1
        args.latency_repeats, args.latency_batch = 3, 64
    return args


def main(argv=None):
    args = parse_args(argv)
    train, validation, test = load_data(args.seed)
    if args.fast:
        # Whole batches only: a smaller last batch would compile a second train step.
        size = 256 - 256 % args.batch_size or 256
        train = (train[0][:size], train[1][:size])
        # Whole batches of 32 (the importance batch size) for the same reason.
        validation = (validation[0][:160], validation[1][:160])
    started = time.perf_counter()

    keras.utils.set_random_seed(args.seed)
    baseline = build_classifier(args)
    initial_weights = baseline.get_weights()
    baseline.fit(
        *train, epochs=args.epochs, batch_size=args.batch_size, verbose=0,
        callbacks=[EpochLine("baseline", args.epochs)],
    )  # fmt: skip

    keras.utils.set_random_seed(args.seed)  # Same dropout stream as the baseline.
    model = build_classifier(args)
    model.set_weights(initial_weights)
    pruning = HeadPruning(
        target=args.prune_fraction,
        data=validation,
        method=args.method,
        gqa_policy=args.gqa_policy,
        start_epoch=args.start_epoch,
        end_epoch=args.end_epoch,
        frequency=args.frequency,
        heatmap_dir=args.heatmap_dir,
    )
    history = model.fit(
        *train, epochs=args.epochs, batch_size=args.batch_size, verbose=0,
        callbacks=[pruning, EpochLine("pruned", args.epochs)],
    )  # fmt: skip
    gated_accuracy = accuracy(model, *test)
    removed = prune_heads(model)
    training_seconds = time.perf_counter() - started

    x_latency = np.resize(test[0], (args.latency_batch, ROWS, ROWS))
    latency_before, latency_after = median_latencies_ms(
        [baseline, model], x_latency, args.latency_repeats
    )
    results = {
        "backend": keras.backend.backend(),
        "epochs": args.epochs,
        "heads_before": head_counts(baseline),
        "heads_after": head_counts(model),
        "pruned_heads": {path: heads for path, heads in removed.items()},
        "pruned_per_epoch": history.history["pruned_heads"],
        "accuracy_before": accuracy(baseline, *test),
        "accuracy_after_gated": gated_accuracy,
        "accuracy_after": accuracy(model, *test),
        "params_before": baseline.count_params(),
        "params_after": model.count_params(),
        "attention_flops_before": model_attention_flops(baseline, ROWS),
        "attention_flops_after": model_attention_flops(model, ROWS),
        "matmul_flops_before": matmul_flops(baseline),
        "matmul_flops_after": matmul_flops(model),
        "latency_batch": args.latency_batch,
        "latency_ms_before": latency_before,
        "latency_ms_after": latency_after,
        "training_seconds": training_seconds,
    }
    total_before = sum(h for h, _ in results["heads_before"].values())
    total_after = sum(h for h, _ in results["heads_after"].values())
    print(f"backend: {results['backend']}, {args.epochs} epochs, method={args.method}")
    print(f"heads: {total_before} -> {total_after}  {results['pruned_heads']}")
    print(f"pruned heads at each epoch end: {results['pruned_per_epoch']}")
    print(
        f"test accuracy: {100 * results['accuracy_before']:.2f}% (unpruned) -> "
        f"{100 * results['accuracy_after']:.2f}% (pruned; gated before removal: "
        f"{100 * gated_accuracy:.2f}%)"
    )
    print(f"parameters: {results['params_before']:,} -> {results['params_after']:,}")
    print(
        f"attention FLOPs per example: {results['attention_flops_before']:,} -> "
        f"{results['attention_flops_after']:,}; all matrix products: "
        f"{results['matmul_flops_before']:,} -> {results['matmul_flops_after']:,}"
    )
    print(
        f"forward latency, batch of {args.latency_batch} (median of {args.latency_repeats}, "
        "interleaved): "
        f"{results['latency_ms_before']:.2f} ms -> {results['latency_ms_after']:.2f} ms"
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)
    return results


if __name__ == "__main__":
    main()
