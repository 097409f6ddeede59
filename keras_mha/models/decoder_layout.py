"""A `DecoderModel` described as data (`keras_mha.backends.common.decoder_layout`) for a
backend's whole-model decode step, or None where the layers' own calls must run.

The description covers what a float32 decoder's single-token step computes: embeddings
(scaled, plus learned positions), per block the norms (RMS or LayerNorm), the attention
layer, the gated or plain MLP with its activation, sequential or parallel residuals and
sandwich norms, then the final norm and the LM head (tied or not, soft-capped or not).
Anything else answers None, and `generate` keeps the layers' eager calls: quantized or
LoRA layers, another compute or variable dtype, a distribution, attention with query /
key norms or a logit soft cap, an activation on a Dense layer, a norm over other axes.

Example:
    >>> decoder_layout(model).blocks[0].parallel_residual  # doctest: +SKIP
    False
"""

from __future__ import annotations

import keras

from keras_mha.backends.common.decoder_layout import (
    BlockLayout,
    DecoderLayout,
    DenseLayout,
    NormLayout,
)
from keras_mha.layers import GroupedQueryAttention
from keras_mha.models.blocks import RMSNorm
from keras_mha.models.direct_calls import supports_direct_calls
from keras_mha.models.supported import ACTIVATIONS


class _NotDescribed(Exception):
    """A layer this description does not cover: the model keeps its layers' calls."""


def decoder_layout(model) -> DecoderLayout | None:
    """`model`'s `DecoderLayout`, or None where a trait is not described (see above).

    Example:
        >>> decoder_layout(keras.Sequential()) is None
        True
    """
    blocks = getattr(model, "blocks", None)
    if blocks is None or not hasattr(model, "call_with_cache"):
        return None
    if not supports_direct_calls(model) or model.compute_dtype != "float32":
        return None
    try:
        return DecoderLayout(
            compute_dtype=model.compute_dtype,
            token_embedding=_embedding(model.token_embedding),
            position_embedding=(
                None if model.position_embedding is None else _embedding(model.position_embedding)
            ),
            embedding_scale=float(model.hidden_size) ** 0.5 if model.embedding_scale else None,
            blocks=tuple(_block(block) for block in blocks),
            final_norm=_norm(model.final_norm),
            lm_head=None if model.lm_head is None else _dense(model.lm_head),
            logit_soft_cap=model.final_logit_soft_cap,
        )
    except _NotDescribed:
        return None


def _block(block) -> BlockLayout:
    attention = block.attention
    if not isinstance(attention, GroupedQueryAttention):
        raise _NotDescribed
    if attention.use_qk_norm or attention.logit_soft_cap is not None:
        raise _NotDescribed
    if block.activation not in ACTIVATIONS:
        raise _NotDescribed

    def optional_norm(layer):
        return None if layer is None else _norm(layer)

    return BlockLayout(
        attention_norm=_norm(block.attention_norm),
        attention=attention,
        post_attention_norm=optional_norm(block.post_attention_norm),
        mlp_norm=_norm(block.mlp_norm),
        gate=None if block.gate_proj is None else _dense(block.gate_proj),
        up=_dense(block.up_proj),
        down=_dense(block.down_proj),
        post_mlp_norm=optional_norm(block.post_mlp_norm),
        activation=ACTIVATIONS[block.activation],
        parallel_residual=block.parallel_residual,
    )


def _norm(layer) -> NormLayout:
    if type(layer) is RMSNorm:
        return NormLayout("rms", layer.scale, None, layer.epsilon, layer.scale_offset)
    if type(layer) is keras.layers.LayerNormalization:
        axes = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
        if layer.rms_scaling or list(axes) not in ([-1], [2]):
            raise _NotDescribed
        return NormLayout("layer", layer.gamma, layer.beta, float(layer.epsilon), 0.0)
    raise _NotDescribed


def _dense(layer) -> DenseLayout:
    if (
        type(layer) is not keras.layers.Dense
        or layer.lora_enabled
        or layer.activation is not keras.activations.linear
    ):
        raise _NotDescribed
    return DenseLayout(layer.kernel, layer.bias)


def _embedding(layer):
    if type(layer) is not keras.layers.Embedding or layer.lora_enabled:
        raise _NotDescribed
    return layer.embeddings


__all__ = ["decoder_layout"]
