"""The quantized dtype policies of a block's or a model's own sublayers, kept in its config.

A `DecoderBlock` makes its `Dense` projections in `__init__` with the block's (float)
policy. After `model.quantize(...)` Keras gives each quantized `Dense` or `Embedding`
an `int8_from_float32`-like policy; a config that did not record it would rebuild
float sublayers, whose one `kernel` cannot take the saved int8 kernel and scale
(`Layer 'down_proj' expected 1 variables`). The owner's `get_config` records the
policies that differ from its own under `sublayer_dtypes`, and its `__init__` makes
each sublayer with the recorded one, so Keras's `build` creates the quantized variables
the `.keras` file holds.

Example:
    >>> dense = keras.layers.Dense(4, name="up_proj"); dense.build((None, 8))
    >>> dense.quantize("int8")
    >>> quantized_policies([dense])["up_proj"]["config"]["mode"]
    'int8'
"""

from __future__ import annotations

import keras


def quantized_policies(sublayers):
    """`{name: serialized policy}` of the quantized layers among `sublayers` (None skipped)."""
    return {
        layer.name: keras.saving.serialize_keras_object(layer.dtype_policy)
        for layer in sublayers
        if layer is not None and layer.quantization_mode is not None
    }


def quantized_policy(mode, dtype):
    """The policy Keras's `quantize(mode)` gives a layer of float `dtype`, with the config
    `model.quantize` runs (`keras_mha.models.quantize.keras_config`): a layer made with it
    builds its quantized variables directly (`from_pretrained(quantize=...)`).

    Example:
        >>> quantized_policy("int4", "bfloat16").name
        'int4/128_from_bfloat16'
    """
    from keras_mha.models.quantize import keras_config

    name = mode
    if mode == "int4":  # Keras names the block size: -1 for one scale per column
        block_size = getattr(keras_config(mode), "block_size", None)
        name = f"int4/{-1 if block_size is None else block_size}"
    source = keras.dtype_policies.get(dtype).name
    return keras.dtype_policies.get(f"{name}_from_{source}")


def policy_for(policies, name, default):
    """The policy given for sublayer `name` in `policies`, else `default`: a serialized
    policy (a config's), or a policy or its name (`build_model(quantize=...)`, which
    does not serialize: Keras's serializer imports TensorFlow where it is installed).

    Example:
        >>> policy_for({}, "lm_head", "float32")
        'float32'
        >>> policy_for({"lm_head": "int8_from_float32"}, "lm_head", "float32").name
        'int8_from_float32'
    """
    recorded = (policies or {}).get(name)
    if recorded is None:
        return default
    if isinstance(recorded, dict):
        return keras.saving.deserialize_keras_object(recorded)
    return keras.dtype_policies.get(recorded)


__all__ = ["policy_for", "quantized_policies", "quantized_policy"]
