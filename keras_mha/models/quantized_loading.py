"""Checkpoint tensors into layers built quantized: each float tensor quantized as it is read.

`from_pretrained(source, quantize=mode)` builds the layers `model.quantize(mode)` would
quantize directly in that mode (`build_model(quantize=...)`): their int8 / int4 / float8
variables exist and no float kernel of them is ever made. The families' tensor tables
still name the float model's variables (`blocks.0.gate_proj.kernel`,
`blocks.0.attention.query_kernel`); `load_target` answers such a path with a
`QuantizedTarget` where the layer is quantized: the float shape the checkpoint tensor
converts to, and a `fill` that quantizes that tensor with Keras's own quantizers, as
Keras 3.15's `Dense.quantize(mode)` does (`keras/src/layers/core/dense.py`):

- int8: `AbsMaxQuantizer(axis=0)`, one scale per output column;
- int4: `abs_max_quantize_grouped_with_zero_point` over blocks of inputs (per column,
  `AbsMaxQuantizer(axis=0, value_range=(-8, 7))`, when the block size is -1), packed two
  to a byte with `pack_int4`;
- float8: the float kernel as it is; the scales and amax histories keep the initial
  values `Dense.quantize("float8")` leaves them with.

Only the tensor being read is ever held in float: peak memory is the quantized model
plus about one tensor (docs/guides/quantization.md).

Example:
    >>> target = load_target(model, "blocks.0.attention.query_kernel")  # doctest: +SKIP
    >>> target.shape, target.dense.quantization_mode  # doctest: +SKIP
    ((64, 4, 16), 'int8')
"""

from __future__ import annotations

from dataclasses import dataclass

import keras
import numpy as np
from keras import ops

from keras_mha.errors import UsageError
from keras_mha.models.deferred import backend_tensor, fill, owned_array
from keras_mha.models.weight_names import resolve

#: The modes whose variables `QuantizedTarget.fill` computes (GPTQ / AWQ need calibration).
FILLED_MODES = ("int8", "int4", "float8")


def _weight_quantizer(dense, default):
    # Keras's `QuantizationConfig.weight_quantizer_or_default(dense.quantization_config, ...)`.
    config = dense.quantization_config
    return default if config is None or config.weight_quantizer is None else config.weight_quantizer


def quantized_kernel(dense, kernel):
    """`[(variable, value)]` of `dense`, built quantized, for the float `kernel`
    `(inputs, units)` (a backend tensor in the layer's variable dtype): what Keras's
    `Dense.quantize(dense.quantization_mode)` assigns.

    Example:
        >>> dense = keras.layers.Dense(4, dtype="int8_from_float32")
        >>> dense.build((None, 3))
        >>> parts = quantized_kernel(dense, ops.ones((3, 4)))
        >>> [(v.name, keras.backend.standardize_dtype(value.dtype)) for v, value in parts]
        [('kernel', 'int8'), ('kernel_scale', 'float32')]
    """
    mode = dense.quantization_mode
    if mode == "float8":
        return [(dense._kernel, kernel)]
    if mode == "int8":
        quantizer = _weight_quantizer(dense, keras.quantizers.AbsMaxQuantizer(axis=0))
        values, scale = quantizer(kernel, to_numpy=True)
        return [(dense._kernel, values), (dense.kernel_scale, ops.squeeze(scale, axis=0))]
    # int4: the block size the variables were built with (`Dense._int4_build`).
    block_size = dense._int4_block_size
    if block_size is None or block_size == -1:
        default = keras.quantizers.AbsMaxQuantizer(axis=0, value_range=(-8, 7), output_dtype="int8")
        values, scale = _weight_quantizer(dense, default)(kernel, to_numpy=True)
        parts = [(dense.kernel_scale, ops.squeeze(scale, axis=0))]
    else:
        values, scale, zero = keras.quantizers.abs_max_quantize_grouped_with_zero_point(
            kernel, block_size=block_size, to_numpy=True
        )
        parts = [(dense.kernel_scale, scale), (dense.kernel_zero, zero)]
    packed, _, _ = keras.quantizers.pack_int4(values, axis=-1)
    return [(dense._kernel, packed), *parts]


@dataclass(frozen=True)
class QuantizedTarget:
    """A float variable of the float model, held by a `Dense` built quantized.

    Attributes:
        dense: the quantized `Dense` (an MLP projection, or an attention layer's
            `query_dense`, ...).
        shape: the float variable's shape (`(features, heads, head_dim)` for an attention
            kernel), which the checkpoint tensor converts to.
        part: "kernel" (quantized when filled) or "bias" (float; reshaped only).
    """

    dense: object
    shape: tuple
    part: str

    def fill(self, value: np.ndarray, *, shared: bool = False) -> None:
        """Quantize `value` (of `shape`) into the Dense's variables, as `deferred.fill`."""
        dense = self.dense
        if self.part == "bias":
            fill(dense.bias, np.reshape(value, (dense.units,)), shared=shared)
            return
        kernel = np.reshape(value, (dense._kernel.shape[0], dense.units))
        dtype = keras.backend.standardize_dtype(dense.variable_dtype)
        # Quantized from the float variable's own dtype, as after a float load.
        kernel = backend_tensor(owned_array(kernel, dtype, shared=shared))
        for variable, part in quantized_kernel(dense, kernel):
            fill(variable, ops.convert_to_numpy(part))


def _quantized_float_variable(owner, name, path):
    """(Dense, float shape, part) holding the float variable `name` of quantized `owner`;
    None where the float variable is `owner`'s own (a bias, a norm scale) or absent."""
    from keras_mha.layers.grouped_query_attention import GroupedQueryAttention
    from keras_mha.layers.quantization import float_variables_of_quantized

    if isinstance(owner, keras.layers.Dense):
        if name != "kernel":
            return None
        return owner, (owner._kernel.shape[0], owner.units), "kernel"
    if isinstance(owner, GroupedQueryAttention):
        found = float_variables_of_quantized(owner).get(name)
        if found is None:
            return None
        dense, shape = found
        return dense, shape, name.rsplit("_", 1)[1]
    raise UsageError(
        f"{path}: layer {owner.name!r} is a quantized {type(owner).__name__} "
        f"({owner.quantization_mode}); checkpoint loading fills quantized Dense and "
        "attention layers only",
        key=path,
    )


def load_target(model, path: str):
    """What loading fills for the float model's variable `path`: the variable, or a
    `QuantizedTarget` where its layer was built quantized; None where neither exists.

    Raises:
        UsageError: the layer is quantized in a mode loading does not fill (GPTQ, AWQ),
            or is a quantized layer other than a `Dense` or an attention layer.
    """
    owner_path, name = path.rsplit(".", 1)
    owner = resolve(model, owner_path)
    mode = getattr(owner, "quantization_mode", None)
    found = None if mode is None else _quantized_float_variable(owner, name, path)
    if found is None:
        return resolve(model, path)
    if mode not in FILLED_MODES:
        raise UsageError(
            f"{path}: layer {owner.name!r} is quantized ({mode}); checkpoint loading fills "
            f"{list(FILLED_MODES)}: load the float weights, then calibrate",
            key=path,
            value=mode,
        )
    dense, shape, part = found
    return QuantizedTarget(dense, tuple(shape), part)


def fill_target(target, value: np.ndarray, *, shared: bool = False) -> None:
    """Fill `target` (`load_target`'s answer) with the float `value`."""
    if isinstance(target, QuantizedTarget):
        target.fill(value, shared=shared)
    else:
        fill(target, value, shared=shared)


__all__ = ["FILLED_MODES", "QuantizedTarget", "fill_target", "load_target", "quantized_kernel"]
