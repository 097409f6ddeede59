"""Which layers of a whole model `quantize` reaches: the blocks' matrices, as the planner counts.

`DecoderModel.quantize(mode)` and `EncoderModel.quantize(mode)` are Keras's
`Model.quantize` with a default `filters`: the attention layers and the MLP's Dense
layers of every block (`QUANTIZED_LAYERS`). Embeddings, the LM head and the norms stay
in the model's float dtype, which is what the planner's generic `int8` / `int4` formats
count (`keras_mha.planning.planner.quantization.BLOCK_ROLES`: the block matrices, the LM
head and embeddings left alone). Norms have no quantized form, so no layer warns.
Pass `filters=` to choose other layers (Keras's regex or callable).

`from_pretrained(..., quantize=mode)` builds the same layers in that mode and quantizes
each checkpoint tensor as it is read (`keras_mha.models.quantized_loading`).

The modes and the Keras config each runs with come from
`keras_mha.planning.weight_formats`, the description the planner counts bytes by: int4
asks Keras for its blocks of 128 inputs explicitly (`keras_config`), whatever Keras's
default.

Example:
    >>> [name for name in QUANTIZED_LAYERS][:2]
    ['attention', 'gate_proj']
"""

from __future__ import annotations

from keras_mha.errors import UsageError
from keras_mha.planning.weight_formats import RUNTIME_FORMATS, runtime_format

#: Layer names, inside a block, whose weights `quantize` quantizes by default.
QUANTIZED_LAYERS = (
    "attention",
    "gate_proj",
    "up_proj",
    "down_proj",
    "intermediate",
    "output_dense",
)
#: The modes `from_pretrained(quantize=...)` and `bench model --quantize` take: those that
#: need no calibration data (GPTQ and AWQ need it: `model.quantize("gptq", config=...)`).
LOAD_MODES = tuple(RUNTIME_FORMATS)


def is_quantized_by_default(layer) -> bool:
    """Whether `model.quantize(mode)` quantizes `layer` when no `filters` are given.

    Example:
        >>> import keras
        >>> is_quantized_by_default(keras.layers.Dense(2, name="lm_head"))
        False
    """
    return layer.name in QUANTIZED_LAYERS


def check_mode(mode, argument="quantize"):
    """`mode` if it is None or one of `LOAD_MODES`, else a one-line `UsageError`.

    Example:
        >>> check_mode("int8")
        'int8'
    """
    if mode is None or mode in LOAD_MODES:
        return mode
    hint = (
        "; GPTQ and AWQ need calibration data: call model.quantize(mode, config=...)"
        if mode in ("gptq", "awq")
        else ""
    )
    raise UsageError(
        f"{argument}={mode!r}; expected one of {list(LOAD_MODES)} or None{hint}",
        key=argument,
        value=mode,
    )


def keras_config(mode):
    """The Keras quantization config `mode` runs with by default: int4's block size from
    `weight_formats`, None for the other modes (and on a Keras without
    `Int4QuantizationConfig`, whose int4 is per column).

    Example:
        >>> keras_config("int4").block_size, keras_config("int8")
        (128, None)
    """
    import keras

    block_size = runtime_format(mode).block_size if mode in RUNTIME_FORMATS else None
    config_class = getattr(keras.quantizers, "Int4QuantizationConfig", None)
    if block_size is None or config_class is None:
        return None
    return config_class(block_size=block_size)


#: The modes Keras calibrates block by block on data (`Model.quantize(mode, config=...)`).
CALIBRATED_MODES = ("gptq", "awq")


def _awaiting_calibration(layer, mode) -> bool:
    """Whether `layer` was put in `mode` ("gptq", "awq") and waits for its calibration.

    An attention layer's `quantize` makes its projections such `Dense` layers; their
    names (`query_dense`, ...) match no filter that chose the attention, so Keras's
    calibration pass must be let through to them or they stay uncalibrated.
    """
    return (
        layer.quantization_mode == mode and getattr(layer, f"is_{mode}_calibrated", True) is False
    )


class QuantizeBlocks:
    """Mixin of the models: `quantize` defaults to the blocks' matrices (see above), and
    GPTQ / AWQ calibrate the blocks in order (`get_quantization_layer_structure`)."""

    def quantize(self, mode=None, config=None, filters=None, **kwargs):
        """Keras's `Model.quantize`; `filters=None` means the blocks' attention and MLP,
        `config=None` the config of `keras_config(mode)`.

        For `"gptq"` and `"awq"` the filter also lets through the projections an attention
        layer made for that mode (see `_awaiting_calibration`).
        """
        if filters is None:
            filters = is_quantized_by_default
        if config is None:
            config = keras_config(mode)
        calibrated = mode if mode is not None else getattr(config, "mode", None)
        if calibrated in CALIBRATED_MODES:
            chosen = filters

            def filters(layer):
                return _awaiting_calibration(layer, calibrated) or _matches(layer, chosen)

        from keras_mha.layers.quantization import cheap_collections

        with cheap_collections():
            return super().quantize(mode, config=config, filters=filters, **kwargs)

    def get_quantization_layer_structure(self, mode=None):
        """The layout Keras's GPTQ and AWQ calibrate: the embeddings, then each block.

        `pre_block_layers` turns calibration token ids into the first block's input
        (`block_inputs`: embeddings, Gemma's scale, learned positions); each of
        `sequential_blocks` is then run on the previous one's output, its `Dense`
        layers (the attention's projections and the MLP) calibrated on their inputs.
        """
        if mode not in CALIBRATED_MODES:
            return None
        return {"pre_block_layers": [self.block_inputs], "sequential_blocks": list(self.blocks)}


def _matches(layer, filters) -> bool:
    """Keras's `should_quantize_layer`: a regex, a list of them, or a callable."""
    import re

    if isinstance(filters, str):
        return bool(re.search(filters, layer.name))
    if isinstance(filters, (list, tuple)):
        return any(re.search(pattern, layer.name) for pattern in filters)
    return bool(filters(layer))


__all__ = [
    "CALIBRATED_MODES",
    "LOAD_MODES",
    "QUANTIZED_LAYERS",
    "QuantizeBlocks",
    "check_mode",
    "is_quantized_by_default",
    "keras_config",
]
