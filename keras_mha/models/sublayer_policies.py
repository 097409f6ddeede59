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


def policy_for(policies, name, default):
    """The policy recorded for sublayer `name` in `policies` (a config's), else `default`.

    Example:
        >>> policy_for({}, "lm_head", "float32")
        'float32'
    """
    recorded = (policies or {}).get(name)
    return default if recorded is None else keras.saving.deserialize_keras_object(recorded)


__all__ = ["policy_for", "quantized_policies"]
