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

Once the step itself is this lean, Keras's `Layer.__call__` (argument binding, dtype
conversion, name scopes, call context, mask propagation, the torch `Module` hooks)
costs about as much as the step (measured: ~40% of a batch-1 step at context 2048 on
a CPU). `skips_keras_call` tells the layer's `__call__` when that bookkeeping would
hand the arguments to `call` unchanged and add nothing to the result, so that
`__call__` may call `call` directly.

Example:
    >>> with torch.no_grad():  # doctest: +SKIP
    ...     output, cache = layer(token, cache=cache, cache_index=position)
"""

from __future__ import annotations

import weakref

import keras
import numpy as np
from keras.src.backend import get_autocast_scope, in_stateless_scope, in_symbolic_scope

from keras_mha.layers import attention_kernels, kv_cache, masks
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


# The keyword arguments a decode step may pass through the fast call (see below).
_FAST_CALL_KEYWORDS = frozenset(
    ("cache", "cache_index", "attention_mask", "use_causal_mask", "training")
)
_KERAS_DTYPES = {}  # torch dtype -> Keras dtype name, filled on first use


def skips_keras_call(layer, args, kwargs):
    """Whether `Layer.__call__(*args, **kwargs)` would equal `layer.call(*args, **kwargs)`.

    True only for an eager PyTorch decode step with autograd off,
    `layer(query, cache=..., cache_index=...[, attention_mask=, use_causal_mask=,
    training=])`, where everything `Layer.__call__` does is a no-op:

    - the layer is built and its name-scope path set (it was called or built
      through Keras once), it is not quantized, rematerialized or
      activity-regularized, has no input spec, and its variables are in its compute
      dtype, with no autocast, stateless or symbolic scope around the call (so
      reading a variable's tensor directly gives what `variable.value` gives);
    - `query` and the cache buffers are torch tensors already in the compute dtype
      (nothing to convert), `query` carries no Keras padding mask (nothing to
      propagate), `cache_index` is an int or an integer tensor and `attention_mask`
      None or a non-floating tensor (Keras converts floating tensors only);
    - `training` cannot change the result (no dropout, or `training` given: Keras
      resolves it from an enclosing call only when it is None);
    - no torch module hooks (global or on the layer), no `Module.compile()`, and not
      under `torch.compile` tracing (which keeps the general path).

    Example:
        >>> with torch.no_grad():  # doctest: +SKIP
        ...     skips_keras_call(layer, (token,), {"cache": cache, "cache_index": 5})
        True
    """
    if len(args) != 1 or not kwargs.keys() <= _FAST_CALL_KEYWORDS:
        return False
    cache, cache_index = kwargs.get("cache"), kwargs.get("cache_index")
    if cache is None or cache_index is None or keras.backend.backend() != "torch":
        return False
    import torch

    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        return False
    query = args[0]
    if not isinstance(query, torch.Tensor) or getattr(query, "_keras_mask", None) is not None:
        return False
    if _keras_dtype(query.dtype) != layer.compute_dtype:
        return False
    if type(cache) not in (tuple, list, kv_cache.KVCache) or len(cache) != 2:
        return False
    if not all(isinstance(b, torch.Tensor) and b.dtype == query.dtype for b in cache):
        return False
    # Anything but an integer index takes the general path, which refuses it.
    if isinstance(cache_index, torch.Tensor):
        if cache_index.is_floating_point() or cache_index.dtype == torch.bool:
            return False
    elif isinstance(cache_index, bool) or not isinstance(cache_index, (int, np.integer)):
        return False
    mask = kwargs.get("attention_mask")
    if mask is not None and not (isinstance(mask, torch.Tensor) and not mask.is_floating_point()):
        return False
    if kwargs.get("use_causal_mask") not in (None, True, False):
        return False
    if layer.dropout and kwargs.get("training") is None:
        return False
    return _layer_call_is_plain(layer)


def _keras_dtype(torch_dtype):
    name = _KERAS_DTYPES.get(torch_dtype)
    if name is None:
        name = _KERAS_DTYPES[torch_dtype] = keras.backend.standardize_dtype(torch_dtype)
    return name


def _layer_call_is_plain(layer):
    """No Keras or torch machinery of `__call__` is active for `layer` (see above)."""
    from torch.nn.modules import module

    if not layer.built or layer._parent_path is None or layer.input_spec is not None:
        return False
    if getattr(layer, "quantization_mode", None) is not None or layer._remat_mode:
        return False
    if layer.activity_regularizer is not None:
        return False
    policy = layer.dtype_policy
    if policy.compute_dtype != policy.variable_dtype:
        return False
    if get_autocast_scope() is not None or in_stateless_scope() or in_symbolic_scope():
        return False
    if keras.distribution.distribution() is not None:
        return False
    hooks = (
        layer._forward_hooks,
        layer._forward_pre_hooks,
        layer._backward_hooks,
        layer._backward_pre_hooks,
        module._global_forward_hooks,
        module._global_forward_pre_hooks,
        module._global_backward_hooks,
        module._global_backward_pre_hooks,
    )
    return not any(hooks) and getattr(layer, "_compiled_call_impl", None) is None


def _keras_value(variable):
    return variable.value


def _stored_value(variable):
    """The variable's tensor itself: what `.value` returns outside any Keras scope."""
    value = variable._value
    return variable.value if value is None else value


def _project(rows, kernel, bias, shape):
    """`rows` `(B * T, features)` through `kernel` `(features, heads, D)`: `(B, T, heads, D)`."""
    matrix = kernel.reshape(rows.shape[1], -1)
    if bias is None:
        out = rows @ matrix
    else:  # One addmm, as the general path's `linear`.
        out = torch_linear(rows, matrix, bias.reshape(-1))
    return out.view(*shape, kernel.shape[1], -1)


def _rms_norm(layer, heads, scale):
    import torch

    x = heads.float()
    x = x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + layer.qk_norm_epsilon)
    return (x * scale.float()).to(heads.dtype)


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


def step(layer, query, cache, start, attention_mask, causal, outside_keras_scopes=False):
    """`(output, cache)` of self-attention with `cache` written at `start` (a Python int).

    `outside_keras_scopes`: the caller checked that no Keras scope is active
    (`skips_keras_call`), so the variables' tensors are read directly.
    """
    import torch

    read = _stored_value if outside_keras_scopes else _keras_value
    heads = layer.num_heads
    use_bias = layer.use_bias
    batch, query_length = query.shape[0], query.shape[1]
    rows = query.reshape(batch * query_length, -1)  # once for the three projections
    q, k, v = (
        _project(
            rows,
            read(getattr(layer, f"{name}_kernel")),
            read(getattr(layer, f"{name}_bias")) if use_bias else None,
            (batch, query_length),
        )
        for name in ("query", "key", "value")
    )
    if layer.use_qk_norm:
        q = _rms_norm(layer, q, read(layer.query_norm_scale))
        k = _rms_norm(layer, k, read(layer.key_norm_scale))
    if layer.use_rope:
        q, k = _rope(layer, (q, k), start)
    stop = start + query_length
    if query_length == 1:  # (B, 1, Hkv, D) into column `start` of (B, Hkv, S, D)
        cache.key.select(2, start).copy_(k.select(1, 0))
        cache.value.select(2, start).copy_(v.select(1, 0))
    else:
        cache.key[:, :, start:stop] = k.transpose(1, 2)
        cache.value[:, :, start:stop] = v.transpose(1, 2)

    scale = layer._scale()
    plain_causal = causal and attention_mask is None and layer.sliding_window is None
    if start == 0 and query_length > 1 and plain_causal:
        # A prefill: the kernel's own causal mask, as the general path.
        attended = attention_kernels.fused_attention(
            q, k, v, None, scale=scale, is_causal=True, rows_may_be_empty=False
        )
        return _output(layer, attended, batch, query_length, read), cache
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
    return _output(layer, attended, batch, query_length, read), cache


def _output(layer, attended, batch, query_length, read):
    """Head gates, then the output projection, as `GroupedQueryAttention._finish`."""
    gates = read(layer.head_gates)
    if not _all_ones(layer, gates):  # Gates at 1 (no pruning) leave the heads as they are.
        attended = attended * gates.to(attended.dtype)[:, None]
    kernel = read(layer.output_kernel).reshape(layer.num_heads * layer.head_dim, -1)
    rows = attended.reshape(batch * query_length, -1)
    if layer.use_output_bias:  # One addmm, as the general path's `linear`.
        output = torch_linear(rows, kernel, read(layer.output_bias))
    else:
        output = rows @ kernel
    return output.view(batch, query_length, -1)


# layer -> (its head_gates tensor, that tensor's in-place version and data pointer,
# whether every gate is 1).
_GATES_ALL_ONES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def gates_are_ones(layer):
    """Whether multiplying by `layer.head_gates` may be skipped: eager PyTorch, every gate 1.

    Not under `torch.compile` (reading the values would break the graph) and not
    while the gates require a gradient (pruning's gate gradients,
    pruning/gate_gradients.py, need the product in the graph). Skipping the
    product of a kernel or of the heads with ones changes no value.

    Example:
        >>> gates_are_ones(layer)  # doctest: +SKIP
        True
    """
    if keras.backend.backend() != "torch":
        return False
    import torch

    if torch.compiler.is_compiling() or in_stateless_scope() or in_symbolic_scope():
        return False
    # The stored tensor (outside a stateless scope, `.value` is it or its autocast copy).
    gates = _stored_value(layer.head_gates)
    return isinstance(gates, torch.Tensor) and not gates.is_meta and _all_ones(layer, gates)


def _all_ones(layer, gates):
    """Whether every gate is 1; re-read only after the gates change (in place or not)."""
    if gates.requires_grad:
        return False
    version, pointer = gates._version, gates.data_ptr()
    known = _GATES_ALL_ONES.get(layer)
    if known is not None and known[0] is gates and known[1:3] == (version, pointer):
        return known[3]
    ones = bool((gates == 1).all())
    _GATES_ALL_ONES[layer] = (gates, version, pointer, ones)
    return ones
