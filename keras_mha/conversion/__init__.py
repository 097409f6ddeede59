"""Multi-head checkpoints turned grouped-query: fewer KV heads, then a short uptraining.

- `convert_attention(model, num_key_value_heads, method="mean")`: pool the key/value
  heads of every keras-mha attention layer of a model (`"mean"`, `"first"`,
  `"regroup"`; see `keras_mha.layers.kv_conversion`).
- `uptrain(model, data, steps=..., teacher=None)`: fine-tune the converted model with
  `fit`, by next-token loss or by distillation from the original.
- `held_out_split(data, fraction)`: token examples split for uptraining and measuring.
- `keras_mha.conversion.report`: the figures of `keras-mha convert` (KV cache before and
  after from the cost model) and their table / markdown rendering.

Example:
    >>> from keras_mha.conversion import convert_attention
    >>> model = convert_attention(model, 4)  # doctest: +SKIP
"""

_EXPORTS = {
    "METHODS": "keras_mha.layers.kv_conversion",
    "convert_attention": "keras_mha.conversion.convert",
    "check_conversion": "keras_mha.conversion.convert",
    "uptrain": "keras_mha.conversion.uptraining",
    "held_out_split": "keras_mha.conversion.uptraining",
}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'keras_mha.conversion' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_EXPORTS))


__all__ = sorted(_EXPORTS)
