"""The eager PyTorch decode step of `GroupedQueryAttention`, in plain torch ops.

An eager single-token step does little arithmetic (a few vector-matrix products and
one pass over the cache), so its time goes to dispatch: every `keras.ops` call
flattens and converts its arguments before reaching torch, and the general cache
path runs some 60 of them (projections, RoPE, the write, masks, gates, the output
projection). This module runs the same computation as torch calls on the layer's
variables, with the same formulas and dtypes as the general path, so the outputs
agree to float round-off (tested against it and against the full causal pass):

- projections as one matmul (an `addmm` with a bias) per kernel viewed
  `(features, heads * head_dim)`;
- q/k RMS norms in float32, RoPE with the layer's frequencies, angles computed once
  for queries and keys;
- the new keys/values written into the cache in place;
- attention over the written prefix only (a view: no mask for a lone query), through
  `attention_kernels.fused_attention`, which groups each KV head's query heads;
- head gates and the output projection.

It applies only where it is this simple: eager PyTorch (not under `torch.compile`),
self-attention with a known (Python int or CPU tensor) `cache_index`, autograd off
(the write is in place), the fused path allowed (no attention scores, no active
dropout, no soft cap), no propagated padding masks. Elsewhere the general path runs.

Example:
    >>> with torch.no_grad():  # doctest: +SKIP
    ...     output, cache = layer(token, cache=cache, cache_index=position)
"""

from __future__ import annotations

import weakref

import keras

from keras_mha.layers import attention_kernels, masks
from keras_mha.layers.linear import torch_linear

# RotaryEmbedding layer -> {(rotary_dim, device): inverse frequencies as a tensor}.
_FREQUENCIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def applies(layer, query, cache, start, query_mask, causal, use_fused):
    """Whether the torch step can run this call (`start`: the static cache index or None)."""
    if keras.backend.backend() != "torch" or start is None or not use_fused:
        return False
    import torch

    if torch.compiler.is_compiling() or query_mask is not None:
        return False
    if layer.sliding_window is not None and not causal:
        return False  # A window without causality: left to the general path's masks.
    if not torch.is_grad_enabled():
        return True
    # Autograd on: the in-place cache write is only right when nothing needs a gradient.
    tensors = [query, *cache, *(v.value for v in layer.trainable_variables)]
    return not any(getattr(t, "requires_grad", False) for t in tensors)


def _matrix(variable, rows):
    return variable.value.reshape(rows, -1)


def _project(inputs, kernel, bias, heads):
    batch, length, features = inputs.shape
    matrix = _matrix(kernel, features)
    if bias is None:
        out = inputs @ matrix
    else:  # One addmm, as the general path's `linear`.
        out = torch_linear(inputs, matrix, bias.value.reshape(-1))
    return out.view(batch, length, heads, -1)


def _rms_norm(layer, heads, scale):
    import torch

    x = heads.float()
    x = x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + layer.qk_norm_epsilon)
    return (x * scale.value.float()).to(heads.dtype)


def _rope(layer, tensors, start):
    """Rotate `tensors` `(B, T, heads, D)` at positions `start ..`, as `RotaryEmbedding`."""
    import torch

    rope = layer.rotary_embedding
    head_dim = tensors[0].shape[-1]
    rotary_dim = rope.rotary_dim(head_dim)
    if rotary_dim == 0:
        return tensors
    device = tensors[0].device
    # Converting the frequencies is a dozen dispatches itself: once per layer and device.
    cached = _FREQUENCIES.setdefault(rope, {})
    inv_freq = cached.get((rotary_dim, device))
    if inv_freq is None:
        values = rope._inverse_frequencies(rotary_dim)
        inv_freq = torch.tensor(values, dtype=torch.float32, device=device)
        cached[rotary_dim, device] = inv_freq
    length = tensors[0].shape[1]
    positions = torch.arange(start, start + length, dtype=torch.int32, device=device).float()
    angles = positions[None, :, None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)[:, :, None, :]
    cos, sin = torch.cos(angles), torch.sin(angles)
    rotated = []
    for tensor in tensors:
        x = tensor.float()
        rotating, passing = x[..., :rotary_dim], x[..., rotary_dim:]
        first, second = rotating[..., : rotary_dim // 2], rotating[..., rotary_dim // 2 :]
        out = rotating * cos + torch.cat([-second, first], dim=-1) * sin
        if rotary_dim < head_dim:
            out = torch.cat([out, passing], dim=-1)
        rotated.append(out.to(tensor.dtype))
    return rotated


def step(layer, query, cache, start, attention_mask, causal):
    """`(output, cache)` of self-attention with `cache` written at `start` (a Python int)."""
    import torch

    heads, kv_heads = layer.num_heads, layer.num_key_value_heads
    q = _project(query, layer.query_kernel, getattr(layer, "query_bias", None), heads)
    k = _project(query, layer.key_kernel, getattr(layer, "key_bias", None), kv_heads)
    v = _project(query, layer.value_kernel, getattr(layer, "value_bias", None), kv_heads)
    if layer.use_qk_norm:
        q = _rms_norm(layer, q, layer.query_norm_scale)
        k = _rms_norm(layer, k, layer.key_norm_scale)
    if layer.use_rope:
        q, k = _rope(layer, (q, k), start)
    batch, query_length = query.shape[0], query.shape[1]
    stop = start + query_length
    cache.key[:, :, start:stop] = k.transpose(1, 2)
    cache.value[:, :, start:stop] = v.transpose(1, 2)

    scale = layer._scale()
    plain_causal = causal and attention_mask is None and layer.sliding_window is None
    if start == 0 and query_length > 1 and plain_causal:
        # A prefill: the kernel's own causal mask, as the general path.
        attended = attention_kernels.fused_attention(
            q, k, v, None, scale=scale, is_causal=True, rows_may_be_empty=False
        )
        return _output(layer, attended, batch, query_length), cache
    first = 0
    if layer.sliding_window is not None and causal:
        first = max(0, start - layer.sliding_window + 1)
    keys, values = cache.key[:, :, first:stop], cache.value[:, :, first:stop]
    mask = None
    if attention_mask is not None:
        mask = masks.normalise_attention_mask(
            attention_mask,
            batch=batch,
            query_length=query_length,
            key_length=cache.max_length,
            num_heads=heads,
        )[..., first:stop]
    if query_length > 1 and causal:
        # Query i (at start + i) sees keys up to start + i of the prefix [first, stop);
        # a lone query sees the whole prefix, so it needs no mask.
        key_positions = torch.arange(first, stop, device=query.device)
        query_positions = torch.arange(start, stop, device=query.device)[:, None]
        allowed = key_positions <= query_positions
        if layer.sliding_window is not None:
            allowed = allowed & (query_positions - key_positions < layer.sliding_window)
        mask = allowed[None, None] if mask is None else mask & allowed
    if keys.dtype != q.dtype:
        keys, values = keys.to(q.dtype), values.to(q.dtype)
    attended = attention_kernels.fused_attention(
        q,
        keys,
        values,
        mask,
        scale=scale,
        rows_may_be_empty=attention_mask is not None,
        key_heads_first=True,
    )
    return _output(layer, attended, batch, query_length), cache


def _output(layer, attended, batch, query_length):
    """Head gates, then the output projection, as `GroupedQueryAttention._finish`."""
    attended = attended * layer.head_gates.value.to(attended.dtype)[:, None]
    kernel = _matrix(layer.output_kernel, layer.num_heads * layer.head_dim)
    output = attended.reshape(batch, query_length, -1) @ kernel
    if layer.use_output_bias:
        output = output + layer.output_bias.value
    return output
