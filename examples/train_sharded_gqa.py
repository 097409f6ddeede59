"""Train a small GQA language model split across 8 devices by heads and by batch.

No accelerator needed: XLA is asked for 8 virtual CPU devices, which must
happen before JAX is imported, so this script sets `XLA_FLAGS` and
`KERAS_BACKEND=jax` itself. The 8 devices form a 2-D mesh
`("batch", "model")` of shape (2, 4): the batch is split in two (data
parallelism) and every attention layer's heads in four (head parallelism),
each device holding whole KV groups (1 of the 4 KV heads and the 2 query heads
that read it). The MLPs are split Megatron-style in the same map, to show how
the head-parallel keys combine with your own.

The task: sequences that count up modulo the vocabulary with a step drawn
per sequence, so predicting the next token means reading the step off the
earlier tokens, through attention. Only the first prediction of a sequence
cannot know the step, so accuracy tops out near 15/16 + 1/256, about 94%.

Run:
    python examples/train_sharded_gqa.py             # about 30 s on a laptop CPU
    python examples/train_sharded_gqa.py --epochs 2  # quicker
"""

from __future__ import annotations

import argparse
import os

NUM_DEVICES = 8
_XLA_FLAG = f"--xla_force_host_platform_device_count={NUM_DEVICES}"
# Read once, when JAX starts: set before keras (which imports jax) is imported.
if _XLA_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _XLA_FLAG).strip()
os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_mha.distribution import head_parallel_layout_map  # noqa: E402
from keras_mha.layers import GroupedQueryAttention  # noqa: E402

VOCABULARY, SEQUENCE_LENGTH, WIDTH, NUM_BLOCKS = 16, 16, 64, 2
NUM_HEADS, NUM_KEY_VALUE_HEADS, HEAD_DIM = 8, 4, 16


def counting_sequences(num_sequences, seed):
    """Token t+1 = token t + step (mod vocabulary), step and start random per sequence."""
    rng = np.random.default_rng(seed)
    start = rng.integers(0, VOCABULARY, size=(num_sequences, 1))
    step = rng.integers(1, VOCABULARY, size=(num_sequences, 1))
    tokens = (start + step * np.arange(SEQUENCE_LENGTH + 1)) % VOCABULARY
    return tokens[:, :-1].astype("int32"), tokens[:, 1:].astype("int32")


def make_attention_layers():
    """The attention layers, created before the model so the layout map can read them."""
    return [
        GroupedQueryAttention(
            num_heads=NUM_HEADS,
            num_key_value_heads=NUM_KEY_VALUE_HEADS,
            head_dim=HEAD_DIM,
            causal=True,
            use_rope=True,
            name=f"block_{index}_attention",
        )
        for index in range(NUM_BLOCKS)
    ]


def build_model(attention_layers):
    tokens = keras.Input((SEQUENCE_LENGTH,), dtype="int32")
    x = keras.layers.Embedding(VOCABULARY, WIDTH, name="embedding")(tokens)
    for index, attention in enumerate(attention_layers):
        normed = keras.layers.LayerNormalization(name=f"block_{index}_attention_norm")(x)
        x = x + attention(normed)
        normed = keras.layers.LayerNormalization(name=f"block_{index}_mlp_norm")(x)
        hidden = keras.layers.Dense(4 * WIDTH, activation="gelu", name=f"block_{index}_mlp_up")(
            normed
        )
        x = x + keras.layers.Dense(WIDTH, name=f"block_{index}_mlp_down")(hidden)
    logits = keras.layers.Dense(VOCABULARY, name="logits")(x)
    return keras.Model(tokens, logits, name="counting_gqa")


def print_shardings(model, layer_name):
    print(f"\nVariables of {layer_name!r} (mesh axes per dimension; shape held by each device):")
    for variable in model.get_layer(layer_name).weights:
        value = variable.value
        spec = tuple(value.sharding.spec) + (None,) * (value.ndim - len(value.sharding.spec))
        shard_shape = value.addressable_shards[0].data.shape
        print(f"  {variable.path:<40} {tuple(variable.shape)!s:<14} {spec!s:<28} {shard_shape}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32, help="global batch (all devices)")
    args = parser.parse_args()
    keras.utils.set_random_seed(0)

    devices = keras.distribution.list_devices("cpu")
    mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), devices)
    print(f"{len(devices)} devices; mesh {dict(zip(mesh.axis_names, mesh.shape, strict=True))}")

    attention_layers = make_attention_layers()
    # Megatron-style MLP: first projection split by output units, second by input units,
    # so the MLP, like attention, needs one reduction.
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map[r"block_\d+_mlp_up/kernel"] = (None, "model")
    layout_map[r"block_\d+_mlp_up/bias"] = ("model",)
    layout_map[r"block_\d+_mlp_down/kernel"] = ("model", None)
    head_parallel_layout_map(mesh, "model", model=attention_layers, layout_map=layout_map)

    distribution = keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
    # Model, optimizer and training all inside the scope: variables take their
    # layout when created (the optimizer's too, at compile / first step).
    with distribution.scope():
        model = build_model(attention_layers)
        model.compile(
            optimizer=keras.optimizers.Adam(3e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        print_shardings(model, "block_0_attention")
        print_shardings(model, "block_0_mlp_up")

        x_train, y_train = counting_sequences(2048, seed=0)
        x_test, y_test = counting_sequences(256, seed=1)
        print(f"\nTraining; chance level loss is ln({VOCABULARY}) = {np.log(VOCABULARY):.3f}")
        history = model.fit(
            x_train, y_train, batch_size=args.batch_size, epochs=args.epochs, verbose=2
        )
        test_loss, test_accuracy = model.evaluate(
            x_test, y_test, batch_size=args.batch_size, verbose=0
        )

    losses = history.history["loss"]
    print("\nloss per epoch: " + " -> ".join(f"{loss:.3f}" for loss in losses))
    print(f"held-out loss {test_loss:.3f}, next-token accuracy {test_accuracy:.1%}")
    if not losses[-1] < losses[0]:
        raise SystemExit("The loss did not go down.")


if __name__ == "__main__":
    main()
