"""A decoder model described as data: its variables and traits, for a whole-model step.

A backend that runs a model's decode step as one function of its own ops (PyTorch's
`keras_mha.backends.torch.model_step`) needs the model's weights and the few traits
that decide the arithmetic, not its Keras layers. `keras_mha.models.decoder_layout`
describes a `DecoderModel` with these records (or answers None where a trait is not
described here, and the layers' own calls run); the backend reads only them, so it
imports nothing of the models.

Example:
    >>> norm = NormLayout("rms", scale="w", bias=None, epsilon=1e-6, scale_offset=0.0)
    >>> norm.kind
    'rms'
"""

from __future__ import annotations

from typing import Any, NamedTuple


class NormLayout(NamedTuple):
    """An RMS norm (`kind="rms"`: `x * rsqrt(mean(x^2) + epsilon) * (scale_offset +
    scale)`) or a LayerNorm over the last axis (`kind="layer"`, `bias` None or a variable)."""

    kind: str
    scale: Any
    bias: Any
    epsilon: float
    scale_offset: float


class DenseLayout(NamedTuple):
    """A linear layer: `inputs @ kernel (+ bias)`, the kernel `(inputs, units)`."""

    kernel: Any
    bias: Any


class BlockLayout(NamedTuple):
    """One decoder block (`keras_mha.models.blocks.DecoderBlock`).

    `attention` is the block's `GroupedQueryAttention` layer (its variables and
    settings are read as its eager decode step reads them); `gate` is None for a plain
    MLP; `activation` is a `keras_mha.models.supported.ACTIVATIONS` entry
    `(function_name, arguments)`; the post norms are None without sandwich norms.
    """

    attention_norm: NormLayout
    attention: Any
    post_attention_norm: NormLayout | None
    mlp_norm: NormLayout
    gate: DenseLayout | None
    up: DenseLayout
    down: DenseLayout
    post_mlp_norm: NormLayout | None
    activation: tuple
    parallel_residual: bool


class DecoderLayout(NamedTuple):
    """A causal LM: token (and learned position) embeddings, blocks, final norm, head.

    `embedding_scale` multiplies the embeddings (Gemma's `sqrt(hidden_size)`, rounded
    to the compute dtype first) or is None; `lm_head` is None when the head is the
    token table (tied); `logit_soft_cap` is `c` of `c * tanh(logits / c)` or None.
    """

    compute_dtype: str
    token_embedding: Any
    position_embedding: Any
    embedding_scale: float | None
    blocks: tuple
    final_norm: NormLayout
    lm_head: DenseLayout | None
    logit_soft_cap: float | None


__all__ = ["BlockLayout", "DecoderLayout", "DenseLayout", "NormLayout"]
