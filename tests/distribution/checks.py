"""Head-parallel checks on 8 virtual CPU devices, in a process of their own.

JAX fixes its device count when it is imported, so the 8 virtual CPU devices
(`XLA_FLAGS=--xla_force_host_platform_device_count=8`) need a fresh process:
`tests/distribution/test_distribution.py` runs this file with `sys.executable` and asserts
on the one JSON object it prints as its last line of stdout. Nothing is
asserted here; every check reports what it measured, or its traceback.

What is measured, for MHA, GQA and MQA layers on a 1-D `("model",)` mesh and a
2-D `("batch", "model")` mesh (data and head parallelism together):

- the mesh axes and per-device shard shape of every variable, and of the
  optimizer's moments;
- the sharded model's outputs and one SGD training step (loss and weights)
  against the same model on one device, from the same initial weights;
- the collectives XLA compiles into one attention layer's forward pass;
- a KV-cache prefill and decode step with the cache split along KV heads.

Run by hand:
    KERAS_BACKEND=jax python tests/distribution/checks.py
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback

NUM_DEVICES = 8
_XLA_FLAG = f"--xla_force_host_platform_device_count={NUM_DEVICES}"

# Before jax is imported (keras imports it): the flag is read once, at start-up.
if _XLA_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _XLA_FLAG).strip()
os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_mha.distribution import distribute_kv_cache, head_parallel_layout_map  # noqa: E402
from keras_mha.layers import GroupedQueryAttention  # noqa: E402

SEQUENCE_LENGTH, FEATURES, HEAD_DIM = 6, 16, 4
COLLECTIVES = ("all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter")
# An HLO instruction, e.g. "%x = f32[2,6,16] all-reduce(%y), ..." (also the async "-start").
_COLLECTIVE_OP = re.compile(r"\s(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")

# name -> mesh shape, axis names, attention layers (name, num_heads, num_kv_heads), batch,
# whether the model is subclassed (the layout map is then written from the unbuilt
# model) or functional (written from the attention layers before they are called).
CASES = {
    # Head parallelism alone: MHA, one head per device.
    "mha_1d_functional": ((8,), ("model",), [("attention", 8, 8)], 8, False),
    # Data and head parallelism: a GQA block split by KV groups and an MQA block
    # whose single KV head is replicated, nested in a subclassed model.
    "gqa_mqa_2d_subclassed": (
        (2, 4),
        ("batch", "model"),
        [("block_gqa", 8, 4), ("block_mqa", 4, 1)],
        4,
        True,
    ),
}


def _attention(name, num_heads, num_kv_heads, use_rope=False):
    # RoPE has no variables; it is left to the KV-cache check, because its
    # sublayer never reports `built`, which makes `Model.predict` and `fit` run
    # one eager forward pass first (dozens of op-by-op compilations on JAX).
    return GroupedQueryAttention(
        num_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=HEAD_DIM,
        causal=True,
        use_rope=use_rope,
        use_qk_norm=True,
        name=name,
    )


class _StackedAttention(keras.Model):
    """Residual attention blocks and a dense head; sublayers exist before `build`."""

    def __init__(self, specs, **kwargs):
        super().__init__(**kwargs)
        self.blocks = [_attention(*spec) for spec in specs]
        self.head = keras.layers.Dense(FEATURES, name="head")

    def build(self, input_shape):
        for block in self.blocks:
            block.build(input_shape)
        self.head.build(input_shape)

    def call(self, inputs):
        x = inputs
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def _functional(attention_layers):
    inputs = keras.Input((SEQUENCE_LENGTH, FEATURES))
    x = inputs
    for layer in attention_layers:
        x = x + layer(x)
    return keras.Model(inputs, keras.layers.Dense(FEATURES, name="head")(x))


def _make_model(specs, subclassed):
    if subclassed:
        model = _StackedAttention(specs, name="stacked")
        model.build((None, SEQUENCE_LENGTH, FEATURES))
        return model
    return _functional([_attention(*spec) for spec in specs])


def _set_random_weights(model, seed):
    """Seeded weights (`keras.utils.set_random_seed` would import TensorFlow: seconds).

    Gates and norm scales get values around one rather than exactly one, so a
    gate or scale applied to the wrong head would show in the outputs.
    """
    rng = np.random.default_rng(seed)
    weights = []
    for variable in model.weights:
        around_one = variable.path.endswith(("head_gates", "norm_scale"))
        low, high = (0.5, 1.5) if around_one else (-0.5, 0.5)
        weights.append(rng.uniform(low, high, size=variable.shape).astype("float32"))
    model.set_weights(weights)
    return weights


def _array_axes(array):
    """Mesh axis (or None) of every dimension of a sharded jax array."""
    spec = list(array.sharding.spec)
    return spec + [None] * (array.ndim - len(spec))


def _spec(variable):
    return _array_axes(variable.value)


def _variable_report(variable):
    return {
        "axes": _spec(variable),
        "shard_shape": list(variable.value.addressable_shards[0].data.shape),
        "devices": len(variable.value.sharding.device_set),
    }


def _count_collectives(hlo_text):
    counts = dict.fromkeys(COLLECTIVES, 0)
    for match in _COLLECTIVE_OP.finditer(hlo_text):
        counts[match.group(1)] += 1
    return counts


def _forward_collectives(layer, mesh, batch_axis, inputs):
    """Collectives in the compiled forward pass of one attention layer."""
    data_sharding = jax.sharding.NamedSharding(
        mesh.backend_mesh, jax.sharding.PartitionSpec(batch_axis)
    )
    trainable = [v.value for v in layer.trainable_variables]
    non_trainable = [v.value for v in layer.non_trainable_variables]

    def forward(trainable, non_trainable, x):
        return layer.stateless_call(trainable, non_trainable, x)[0]

    compiled = (
        jax.jit(forward)
        .lower(trainable, non_trainable, jax.device_put(inputs, data_sharding))
        .compile()
    )
    return _count_collectives(compiled.as_text())


def check_case(name):
    mesh_shape, axis_names, specs, batch, subclassed = CASES[name]
    devices = keras.distribution.list_devices("cpu")[: int(np.prod(mesh_shape))]
    mesh = keras.distribution.DeviceMesh(mesh_shape, axis_names, devices)
    batch_axis = axis_names[0]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, SEQUENCE_LENGTH, FEATURES)).astype("float32")
    y = rng.normal(size=(batch, SEQUENCE_LENGTH, FEATURES)).astype("float32")

    reference = _make_model(specs, subclassed)
    initial_weights = _set_random_weights(reference, seed=1)
    reference.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    reference_output = reference.predict(x, verbose=0)

    if subclassed:
        # The distribution holds the map; filling it before the model is built is enough.
        layout_map = keras.distribution.LayoutMap(mesh)
        distribution = keras.distribution.ModelParallel(
            layout_map=layout_map, batch_dim_name=batch_axis
        )
        with distribution.scope():
            sharded = _StackedAttention(specs, name="stacked")
            head_parallel_layout_map(mesh, "model", model=sharded, layout_map=layout_map)
            sharded.build((None, SEQUENCE_LENGTH, FEATURES))
    else:
        layers = [_attention(*spec) for spec in specs]
        layout_map = head_parallel_layout_map(mesh, "model", model=layers)
        distribution = keras.distribution.ModelParallel(
            layout_map=layout_map, batch_dim_name=batch_axis
        )
        with distribution.scope():
            sharded = _functional(layers)
    with distribution.scope():
        sharded.set_weights(initial_weights)
        sharded.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
        sharded_output = sharded.predict(x, verbose=0)
        variables = {
            v.path.split("/", 1)[1] if subclassed else v.path: _variable_report(v)
            for v in sharded.variables
        }
        sharded_loss = float(sharded.train_on_batch(x, y))
        optimizer_axes = {v.path: _spec(v) for v in sharded.optimizer.variables if len(v.shape) > 0}
        collectives = {
            # Inputs split along "batch" only: on a 1-D mesh ModelParallel would
            # split the batch along "model" too (its first axis).
            layer.name: _forward_collectives(
                layer, mesh, "batch" if "batch" in axis_names else None, x
            )
            for layer in sharded._flatten_layers()
            if isinstance(layer, GroupedQueryAttention)
        }
    reference_loss = float(reference.train_on_batch(x, y))
    weight_difference = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(sharded.get_weights(), reference.get_weights(), strict=True)
    )
    moved = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(reference.get_weights(), initial_weights, strict=True)
    )
    return {
        "mesh": dict(zip(axis_names, mesh_shape, strict=True)),
        "layers": {
            spec[0]: {"num_heads": spec[1], "num_key_value_heads": spec[2]} for spec in specs
        },
        "variables": variables,
        "optimizer_variable_axes": optimizer_axes,
        "output_max_abs_difference": float(np.max(np.abs(sharded_output - reference_output))),
        "output_max_abs": float(np.max(np.abs(reference_output))),
        "sharded_loss": sharded_loss,
        "reference_loss": reference_loss,
        "weights_after_step_max_abs_difference": weight_difference,
        "weights_moved_by_step": moved,
        "forward_collectives": collectives,
    }


def check_kv_cache_decoding():
    """Prefill then one decode step, jitted, with a cache split along KV heads and batch."""
    mesh = keras.distribution.DeviceMesh(
        (2, 4), ("batch", "model"), keras.distribution.list_devices("cpu")
    )
    batch, prompt_length, max_length = 2, 5, 8
    rng = np.random.default_rng(2)
    tokens = rng.normal(size=(batch, prompt_length + 1, FEATURES)).astype("float32")

    def decode(layer, cache, pin_cache):
        trainable = [v.value for v in layer.trainable_variables]
        non_trainable = [v.value for v in layer.non_trainable_variables]

        @jax.jit
        def prefill_and_step(trainable, non_trainable, cache):
            (prefill, cache), _ = layer.stateless_call(
                trainable, non_trainable, tokens[:, :prompt_length], cache=cache, cache_index=0
            )
            (step, cache), _ = layer.stateless_call(
                trainable,
                non_trainable,
                tokens[:, prompt_length:],
                cache=pin_cache(cache),
                cache_index=prompt_length,
            )
            return jax.numpy.concatenate([prefill, step], axis=1), pin_cache(cache)

        return prefill_and_step(trainable, non_trainable, cache)

    reference = _attention("attention", 8, 4, use_rope=True)
    reference.build((None, None, FEATURES))
    weights = _set_random_weights(reference, seed=3)
    expected, _ = decode(reference, reference.init_cache(batch, max_length), lambda c: c)

    layer = _attention("attention", 8, 4, use_rope=True)
    layout_map = head_parallel_layout_map(mesh, "model", model=layer)
    with keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch").scope():
        layer.build((None, None, FEATURES))
        layer.set_weights(weights)

        def pin_cache(cache):
            # Inside jit this is a sharding constraint on the updated cache.
            return distribute_kv_cache(cache, mesh, model_axis="model", batch_axis="batch")

        cache = pin_cache(layer.init_cache(batch, max_length))
        cache_axes = [_array_axes(buffer) for buffer in cache]
        cache_shard_shape = [list(buffer.addressable_shards[0].data.shape) for buffer in cache]
        outputs, cache = decode(layer, cache, pin_cache)
    return {
        "cache_axes": cache_axes,
        "cache_shard_shape": cache_shard_shape,
        "cache_axes_after_decoding": [_array_axes(buffer) for buffer in cache],
        "output_max_abs_difference": float(np.max(np.abs(np.asarray(outputs - expected)))),
        "output_max_abs": float(np.max(np.abs(np.asarray(expected)))),
    }


# A whole decoder (the tiny Llama of tests/models/test_api.py) split by heads over 2 of
# the devices: the models' own tests cannot get several JAX devices in their process.
WHOLE_MODEL_CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "num_hidden_layers": 2,
    "intermediate_size": 48,
    "vocab_size": 50,
    "tie_word_embeddings": False,
}


def check_whole_model():
    from keras_mha.models import build_model
    from keras_mha.planning.spec import from_config

    spec = from_config(WHOLE_MODEL_CONFIG)
    keras.utils.set_random_seed(0)
    plain = build_model(spec)
    devices = keras.distribution.list_devices()[:2]
    mesh = keras.distribution.DeviceMesh((2,), ("model",), devices)
    distribution = keras.distribution.ModelParallel(
        layout_map=head_parallel_layout_map(mesh, "model")
    )
    with distribution.scope():
        sharded = build_model(spec)
    sharded.set_weights(plain.get_weights())
    ids = np.arange(12, dtype="int32").reshape(2, 6)
    kernel = sharded.blocks[0].attention.key_kernel.value
    return {
        "spec": [str(axis) for axis in kernel.sharding.spec],
        "devices": len(kernel.sharding.device_set),
        "difference": float(np.abs(np.asarray(sharded(ids)) - np.asarray(plain(ids))).max()),
    }


# The rest of a tensor-parallel layout, as vLLM splits a Llama block: MLP in and out
# projections by their inner width, the embedding and the LM head by the vocabulary.
TENSOR_PARALLEL_LAYOUT = {
    "token_embedding/embeddings": ("model", None),
    "gate_proj/kernel": (None, "model"),
    "up_proj/kernel": (None, "model"),
    "down_proj/kernel": ("model", None),
    "lm_head/kernel": (None, "model"),
}


def check_tensor_parallel_bytes(kv_heads):
    """Per-device bytes of a whole tiny Llama split tensor-parallel over 2 devices, and of
    one attention layer's KV cache split with it, from the shards JAX holds."""
    from keras_mha.models import build_model
    from keras_mha.planning.spec import from_config

    config = {**WHOLE_MODEL_CONFIG, "num_key_value_heads": kv_heads}
    spec = from_config(config)
    mesh = keras.distribution.DeviceMesh((2,), ("model",), keras.distribution.list_devices()[:2])
    # The blocks' attention layers are all named "attention": one stand-in gives their map
    # (a multi-query layer's single KV head replicated).
    stand_in = GroupedQueryAttention(
        config["num_attention_heads"], kv_heads, head_dim=config["head_dim"], name="attention"
    )
    layout_map = head_parallel_layout_map(mesh, "model", model=stand_in)
    for path, axes in TENSOR_PARALLEL_LAYOUT.items():
        layout_map[f".*{path}"] = axes
    with keras.distribution.ModelParallel(layout_map=layout_map).scope():
        model = build_model(spec)
    first = keras.distribution.list_devices()[0]
    per_variable = []  # (path, bytes): the blocks' attention variables share their paths
    for variable in model.weights:
        shards = [s for s in variable.value.addressable_shards if str(s.device) == str(first)]
        per_variable.append((variable.path, int(shards[0].data.nbytes)))
    attention = model.blocks[0].attention
    batch, max_length = 3, 16
    cache = distribute_kv_cache(attention.init_cache(batch, max_length), mesh, model_axis="model")
    cache_bytes = sum(
        int(next(s for s in buffer.addressable_shards if str(s.device) == str(first)).data.nbytes)
        for buffer in cache
    )
    return {
        "config": config,
        "variable_bytes_on_device_0": per_variable,
        "kv_cache": {
            "batch": batch,
            "max_length": max_length,
            "bytes_on_device_0": cache_bytes,
            "dtype": str(cache[0].dtype),
        },
    }


def _run(check, *args):
    try:
        return {"ok": True, "result": check(*args)}
    except Exception:
        return {"ok": False, "error": traceback.format_exc()}


def main():
    report = {
        "backend": keras.backend.backend(),
        "device_count": len(keras.distribution.list_devices("cpu")),
        "cases": {name: _run(check_case, name) for name in CASES},
        "kv_cache_decoding": _run(check_kv_cache_decoding),
        "whole_model": _run(check_whole_model),
        "tensor_parallel_bytes": {
            str(kv_heads): _run(check_tensor_parallel_bytes, kv_heads) for kv_heads in (2, 1)
        },
    }
    sys.stdout.write("\n" + json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
