"""Eager PyTorch calls of a whole model's layers: dense, embedding, norms, attention, activations.

In an eager PyTorch step each `keras.ops` call converts its arguments, checks for
symbolic tensors and infers dtypes before it reaches torch; a decoder block's norms,
MLP and residuals run some twenty of them, which costs about as much as their
arithmetic at a single-token step. Inside `direct_calls` (generate's eager PyTorch
prefill and steps: autograd off, no autocasting, quantization or distribution), `run`
calls the function here for the layer's kind (`EAGER_KERNELS`;
`keras_mha.models.eager_calls` maps the model's layer classes to them) instead of its
Keras `call`. Each function calls the torch kernel Keras's torch backend reaches, in the
same order and dtypes, so the result is the same bit for bit (tested against the Keras
path); a layer in a configuration it does not cover (LoRA, an activation on a Dense,
a norm over several axes, mixed dtypes) goes to its `call`. The attention layers have
their own eager step (`keras_mha.backends.torch.eager_decode`). The activations, the norms'
scaling and the block's residual sums and gated product (`add_into`, `multiply_into`)
write into a tensor the step has just made: the same values, without allocating another
tensor of the activations' size each time (docs/benchmarks.md says what that saves).

Example:
    >>> with direct_calls(True, models_eager_calls(eager_calls())):  # doctest: +SKIP
    ...     hidden = run(block.mlp_norm, hidden)   # rms_norm below, not RMSNorm.call
"""

from __future__ import annotations

import keras
import torch
from keras.src.backend import get_autocast_scope, in_stateless_scope, in_symbolic_scope

from keras_mha.backends import EagerKernels
from keras_mha.backends.torch import eager_decode


def _tensor(variable):
    """The variable's tensor: what `variable.value` gives outside Keras's autocast,
    stateless and symbolic scopes (`eager_calls` is None inside them)."""
    value = variable._value
    return variable.value if value is None else value


def dense(layer, inputs, training=None):
    """`keras.layers.Dense.call`: `matmul(x, kernel) + bias` (torch.matmul, as Keras)."""
    # `_kernel`: the `kernel` property's checks (quantization, LoRA) cost more than the
    # matmul of a decode step; a layer they would change takes its own `call`.
    kernel = getattr(layer, "_kernel", None)
    if (
        kernel is None
        or layer.lora_enabled
        or layer.quantization_mode is not None
        or layer.activation is not keras.activations.linear
    ):
        return layer.call(inputs)
    kernel = _tensor(kernel)
    bias = None if layer.bias is None else _tensor(layer.bias)
    if kernel.dtype != inputs.dtype or (bias is not None and bias.dtype != inputs.dtype):
        return layer.call(inputs)
    outputs = torch.matmul(inputs, kernel)
    return outputs if bias is None else outputs + bias


def embedding(layer, inputs):
    """`keras.layers.Embedding.call`: a row lookup (ids are checked on entry)."""
    table = _tensor(layer.embeddings)
    if layer.lora_enabled or layer.quantization_mode is not None:
        return layer.call(inputs)
    return torch.nn.functional.embedding(inputs.long(), table)


def rms_norm(layer, inputs):
    """`RMSNorm.call` in torch ops."""
    x = inputs.to(torch.float32)
    x = x * torch.rsqrt(torch.mean(torch.square(x), dim=-1, keepdim=True) + layer.epsilon)
    # `x` is new here (not `inputs`): the scaling is written into it.
    scale = _tensor(layer.scale)
    if layer.scale_offset:
        return x.mul_(layer.scale_offset + scale.to(torch.float32)).to(inputs.dtype)
    return x.to(inputs.dtype).mul_(scale.to(inputs.dtype))


def layer_norm(layer, inputs):
    """`keras.layers.LayerNormalization.call` over the last axis: torch's `layer_norm` in
    float32 (Keras's torch path), cast back."""
    if layer.rms_scaling or list(layer.axis) not in ([-1], [inputs.ndim - 1]):
        return layer.call(inputs)

    def float32(variable):
        return None if variable is None else _tensor(variable).to(torch.float32)

    outputs = torch.nn.functional.layer_norm(
        inputs.to(torch.float32),
        (inputs.shape[-1],),
        float32(layer.gamma),
        float32(layer.beta),
        layer.epsilon,
    )
    return outputs.to(inputs.dtype)


def attention(layer, query, attention_mask=None, cache=None, cache_index=None, **kwargs):
    """`GroupedQueryAttention.call` (MHA's and MQA's too); on a KV cache,
    `eager_decode.call_directly`: a cache the layer checked at an earlier step goes
    straight to its eager step."""
    if cache is None or kwargs:
        return layer.call(
            query, attention_mask=attention_mask, cache=cache, cache_index=cache_index, **kwargs
        )
    return eager_decode.call_directly(layer, query, cache, cache_index, attention_mask)


def add_into(fresh, other):
    """`other + fresh`, written into `fresh` (a tensor just computed and used nowhere
    else) when it has the sum's shape and dtype: the same sum bit for bit, without
    allocating another tensor of its size.

    Example:
        >>> add_into(torch.ones(2), torch.ones(2))  # doctest: +SKIP
        tensor([2., 2.])
    """
    if _writable_as(fresh, other):
        return fresh.add_(other)
    return other + fresh


def multiply_into(fresh, other):
    """`fresh * other`, written into `fresh` (just computed, used nowhere else) when it
    has the product's shape and dtype."""
    if _writable_as(fresh, other):
        return fresh.mul_(other)
    return fresh * other


def _writable_as(fresh, other):
    # Contiguous: not a broadcast view (whose elements share memory); same shape and
    # dtype: the result of the out-of-place operation fits `fresh` exactly.
    return (
        getattr(other, "shape", None) == fresh.shape
        and other.dtype == fresh.dtype
        and fresh.is_contiguous()
        and not fresh.requires_grad
    )


def activation(function_name, arguments):
    """The torch function of a `models.supported.ACTIVATIONS` entry (a `keras.activations` name
    and its arguments), or None where Keras's own is kept. SiLU and ReLU write into
    their input, which `direct_calls.activate` only gets fresh.

    Example:
        >>> activation("gelu", {"approximate": True})(torch.zeros(2))  # doctest: +SKIP
        tensor([0., 0.])
    """
    functional = torch.nn.functional
    if function_name == "silu":
        return lambda x: functional.silu(x, inplace=not x.requires_grad)
    if function_name == "relu" and not arguments:
        return lambda x: functional.relu(x, inplace=not x.requires_grad)
    if function_name == "gelu":
        mode = "tanh" if arguments.get("approximate", True) else "none"
        return lambda x: functional.gelu(x, approximate=mode)
    return None


#: The functions above, under the names of `keras_mha.backends.EagerKernels`.
EAGER_KERNELS = EagerKernels(
    dense=dense,
    embedding=embedding,
    layer_norm=layer_norm,
    rms_norm=rms_norm,
    attention=attention,
    activation=activation,
    add_into=add_into,
    multiply_into=multiply_into,
)


def eager_calls() -> EagerKernels | None:
    """`EAGER_KERNELS`; None inside a Keras autocast, stateless or symbolic scope (where a
    variable's tensor is not its value).

    Example:
        >>> eager_calls() is EAGER_KERNELS  # doctest: +SKIP
        True
    """
    if in_stateless_scope() or in_symbolic_scope() or get_autocast_scope() is not None:
        return None
    return EAGER_KERNELS


__all__ = [
    "EAGER_KERNELS",
    "activation",
    "add_into",
    "attention",
    "dense",
    "eager_calls",
    "embedding",
    "layer_norm",
    "multiply_into",
    "rms_norm",
]
