"""The eager PyTorch decode step of `GroupedQueryAttention`, in plain torch ops.

An eager single-token step does little arithmetic (a few vector-matrix products and
one pass over the cache), so its time goes to dispatch: every `keras.ops` call
converts its arguments before reaching torch, and the general cache path runs some
60 of them. `step` runs the same computation as torch calls on the layer's variables,
with the same formulas and dtypes, so the outputs agree to float round-off (tested
against the general path and the full causal pass). The layer's `call` takes it
where `applies` says so: eager PyTorch (not under `torch.compile`), self-attention
written into the cache at a known position, autograd off or nothing requiring a
gradient (the write is in place), the fused path allowed, no propagated padding mask.

`call_directly` is the eager step of `GroupedQueryAttention.make_decode_function`:
it calls `layer.call` without Keras's `Layer.__call__` when `can_skip_keras_call`
shows that `__call__` would hand the arguments on unchanged and add nothing to the
result (its bookkeeping costs about as much as the step itself; see
docs/concepts/attention-paths.md). After one such step, `warm_step` serves the next ones
of the same cache and query shape, checking only what can change between steps.

`layer_call` is the plain call's way in (`layer(x, cache=..., cache_index=...)`): eager,
as the decode function; inside a user's `torch.compile` step, `traced_call` traces `step`
itself for a one-token call at an int position (its caches of reshaped kernels, RoPE
angles and gate values left out of the trace), so Dynamo guards a few hundred Python
values per call instead of the general path's 1,800.

Example:
    >>> with torch.no_grad():  # doctest: +SKIP
    ...     output, cache = call_directly(layer, token, cache, position, None)
"""

from __future__ import annotations

import weakref

import numpy as np
import torch
from keras.src.backend.common import global_state

from keras_mha.backends.common import (
    attention_kernels,
    attention_probe,
    kv_cache,
    masks,
    padding_masks,
)
from keras_mha.backends.torch import attention
from keras_mha.backends.torch.tensors import rows_linear

# Keras's scopes under which `Layer.__call__` or a variable read does more than hand on
# the stored tensors, by their names in Keras's global state.
_KERAS_SCOPES = ("autocast_scope", "stateless_scope", "symbolic_scope", "distribution")
# RotaryEmbedding layer -> {(rotary_dim, device): inverse frequencies as a tensor}.
_FREQUENCIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# (inverse frequencies as a tuple, device) -> (start, length, cos, sin) of the last step.
_ANGLES: dict = {}


def applies(layer, inputs, cache, start, options):
    """Whether `step` can run this call of `layer`.

    Args:
        inputs: the call's `padding_masks.AttentionInputs`.
        start: the Python int behind a `cache_index`, None when traced or absent.
        options: the call's `AttentionOptions` (`keras_mha.layers.attention_paths`).
    """
    return not torch.compiler.is_compiling() and _step_serves(layer, inputs, cache, start, options)


def _step_serves(layer, inputs, cache, start, options):
    """`applies`, eager or traced (`step` is traced for a plain call, `layer_call`)."""
    if start is None or not options.use_fused:
        return False
    if isinstance(cache, kv_cache.QuantizedKVCache):
        return False  # quantized on writing, dequantized for attention: the general path
    if layer.quantization_mode is not None:
        return False  # `step` reads float kernels; Keras's quantized Dense layers run instead
    if inputs.query_mask is not None:
        return False
    if layer.sliding_window is not None and not options.causal:
        return False  # A window without causality: left to the general path's masks.
    if not torch.is_grad_enabled():
        return True
    # Autograd on: the in-place cache write is only right when nothing needs a gradient.
    tensors = [inputs.query, *cache, *(v.value for v in layer.trainable_variables)]
    return not any(getattr(t, "requires_grad", False) for t in tensors)


# The keyword arguments of a decode call that `layer_call` takes; any other goes to Keras.
_DECODE_ARGUMENTS = frozenset(("cache", "cache_index", "attention_mask"))


def layer_call(layer, query, arguments):
    """`layer(query, **arguments)` for a decode call (`cache` given) where Keras's
    `Layer.__call__` would add nothing, else None (the caller then calls Keras).

    The plain call a Keras user writes, `layer(x, cache=cache, cache_index=i)`, then runs
    as the layer's decode function does: after one direct step, `warm_step` serves the
    next ones of the same cache and query shape; with autograd on, or anything Keras's
    call would act on, it returns None. Under `torch.compile` the trace takes `layer.call`
    itself, without Keras's bookkeeping (`keras_call_adds_nothing`).

    Example:
        >>> with torch.no_grad():  # doctest: +SKIP
        ...     output, cache = layer_call(layer, token, {"cache": cache, "cache_index": 9})
    """
    if not arguments.keys() <= _DECODE_ARGUMENTS:
        return None
    cache = arguments.get("cache")
    index = arguments.get("cache_index")
    mask = arguments.get("attention_mask")
    if cache is None:
        return None
    if torch.compiler.is_compiling():
        # First: Dynamo guards every Python value the trace reads, at every call of the
        # compiled step, and the warm step's bookkeeping would add its own.
        if not keras_call_adds_nothing(layer, query, cache, index, mask):
            return None
        return traced_call(layer, query, cache, index, mask)
    if mask is None:
        warm = warm_step(layer, query, cache, index)
        if warm is not None:
            return warm
    if can_skip_keras_call(layer, query, cache, index, mask):
        return call_directly(layer, query, cache, index, mask)
    return None


def traced_call(layer, query, cache, cache_index, attention_mask):
    """`layer.call(query, cache=..., ...)` as `torch.compile` traces a plain decode call.

    A one-token step at an int position (a Python int, or the symbolic int Dynamo makes of
    it) traces `step`, plain torch calls; anything else traces `layer.call`. Dynamo
    guards every Python value a trace reads, at every call of the compiled function: the
    general path's `keras.ops` read some 1,800, whose checks cost about a tenth of a
    step at context 2048 on a CPU (measured), `step` about a tenth as many.

    Example:
        >>> step = torch.compile(lambda x, c, i: layer(x, cache=c, cache_index=i))  # doctest: +SKIP
        >>> output, cache = step(token, cache, 9)  # traces `traced_call`  # doctest: +SKIP
    """
    if attention_mask is None and query.shape[1] == 1 and not isinstance(cache_index, torch.Tensor):
        inputs = padding_masks.gather(query)
        checked, start = layer._check_call(inputs, cache, cache_index)
        options = layer._attention_options(None, False, None)
        if _step_serves(layer, inputs, checked, start, options):
            return step(layer, query, checked, start, None, options, _stored_value)
    return layer.call(query, cache=cache, cache_index=cache_index, attention_mask=attention_mask)


def call_directly(layer, query, cache, cache_index, attention_mask):
    """`layer(query, cache=..., cache_index=..., attention_mask=...)` without `__call__`.

    Only where Keras's `__call__` would add nothing (`can_skip_keras_call(...)`, or a
    model's `direct_calls`); the result is the same. A cache this layer already checked
    against a query of this batch, width and dtype goes straight to `step` where
    `applies` (the write position is still checked); anything else goes through
    `layer.call`, whose checks, once passed, are remembered for the next step.
    """
    if not layer._called:
        layer._called = True  # what Layer.__call__ would record
    if attention_mask is None:
        warm = warm_step(layer, query, cache, cache_index)
        if warm is not None:
            return warm
    if attention_mask is None and _checked_before(layer, query, cache):
        start = kv_cache.static_index(cache_index)
        options = layer._attention_options(None, False, None)
        if applies(layer, padding_masks.gather(query), cache, start, options):
            kv_cache.check_static_write(start, query.shape[1], cache.key.shape[2])
            # `can_skip_keras_call` found no Keras scope: variables hold their values.
            if _on_meta_device():
                return step(layer, query, cache, start, None, options, _keras_value)
            _WARM[layer] = remember_step(layer, query, cache, options)
            return step(layer, query, cache, start, None, options, _stored_value)
    output, cache = layer.call(
        query, attention_mask=attention_mask, cache=cache, cache_index=cache_index
    )
    _remember_checked(layer, query, cache)
    return output, cache


# layer -> `remember_step(...)` of the last step that `call_directly` sent straight to
# `step` (its payload the attention options); what `warm_step` compares with.
_WARM: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def warm_step(layer, query, cache, cache_index):
    """The eager step of a layer's decode function when nothing changed since its last
    direct step, else None (the caller then checks everything, as `can_skip_keras_call`
    and `call_directly`).

    "Nothing changed": what `last_step` compares (the same cache, query and dtype
    policy, room for the query, nothing of `Layer.__call__` switched on), and no mask,
    autograd, tracing, a `meta` default device or attention recording. What those checks
    read at every step costs about a tenth of a small step (measured at context 2048).

    Example:
        >>> with torch.no_grad():  # doctest: +SKIP
        ...     output, cache = warm_step(layer, token, cache, 9) or layer(token, ...)
    """
    options = last_step(_WARM.get(layer), layer, query, cache, cache_index)
    if options is None or not _nothing_else_switched_on(layer):
        return None
    return step(layer, query, cache, cache_index, None, options, _stored_value)


def _nothing_else_switched_on(layer):
    """What `warm_step` checks of torch and Keras beyond `last_step` (see there)."""
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        return False
    return not attention_probe.is_recording(layer) and not _on_meta_device()


def remember_step(layer, query, cache, payload):
    """What `last_step` compares a later decode call with: the cache buffers (by weak
    reference, so a dropped cache is freed), the query's type, shape, strides, dtype and
    device, the layer's dtype policy, and `payload` (what the caller needs to run the
    step again). None for a cache that is not a `KVCache`.

    Example:
        >>> known = remember_step(layer, token, cache, options)  # doctest: +SKIP
    """
    if type(cache) is not kv_cache.KVCache:
        return None
    buffers = weakref.ref(cache.key), weakref.ref(cache.value)
    signature = type(query), query.shape, query.stride(), query.dtype, query.device
    return (*buffers, *signature, layer._dtype_policy, payload)


def last_step(known, layer, query, cache, index, first=0):
    """The payload of `known` (a `remember_step` result, or None) when this call is like
    that one, else None: the same cache buffers, a query of the same signature with no
    Keras mask, an int `index` from `first` on with room for the query, the same dtype
    policy, and none of `Layer.__call__`'s machinery switched on (`no_call_machinery`).
    Each step of a decode loop checks only these, since the rest cannot change between
    steps; after a step has left the CPU's caches cold, a full check costs several times
    its hot-loop time.

    Example:
        >>> options = last_step(known, layer, token, cache, 9)  # doctest: +SKIP
    """
    if known is None or type(cache) is not kv_cache.KVCache or type(index) is not int:
        return None
    key, value, kind, shape, stride, dtype, device, policy, payload = known
    if cache.key is not key() or cache.value is not value() or type(query) is not kind:
        return None
    if query.shape != shape or query.dtype is not dtype or query.stride() != stride:
        return None
    if not first <= index <= cache.key.shape[2] - shape[1] or query.device != device:
        return None
    if layer._dtype_policy is not policy or getattr(query, "_keras_mask", None) is not None:
        return None
    return payload if no_call_machinery(layer) else None


# layer -> (weak references to the key and value buffers of the cache it last checked,
# and the query's and the layer's properties that check read).
_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _signature(layer, query):
    """What `GroupedQueryAttention._check_call` read from the query and the layer, beyond
    the cache itself and the write position."""
    shape = query.shape
    return (
        len(shape),
        shape[0],
        shape[-1],
        query.dtype,
        layer._query_features,
        layer.num_key_value_heads,
        layer.head_dim,
        layer._dtype_policy,  # its compute dtype, at a tenth of the property's cost
    )


def _checked_before(layer, query, cache):
    known = _CHECKED.get(layer)
    return (
        known is not None
        and type(cache) is kv_cache.KVCache
        and known[0]() is cache.key
        and known[1]() is cache.value
        and known[2] == _signature(layer, query)
    )


def _remember_checked(layer, query, cache):
    if type(cache) is kv_cache.KVCache:
        references = weakref.ref(cache.key), weakref.ref(cache.value)
        _CHECKED[layer] = (*references, _signature(layer, query))


def can_skip_keras_call(layer, query, cache, cache_index, attention_mask):
    """Whether `Layer.__call__` would equal `layer.call` for this decode step.

    True only for an eager PyTorch decode step with autograd off where everything
    `Layer.__call__` does is a no-op:

    - the layer is built and its name-scope path set (it was called or built
      through Keras once), it is not quantized, rematerialized or
      activity-regularized, has no input spec, its variables are in its compute
      dtype, and no distribution, autocast, stateless or symbolic scope is active;
    - `query` and the cache buffers are torch tensors already in the compute dtype
      (nothing to convert), `query` carries no Keras padding mask (nothing to
      propagate), `cache_index` is an int or an integer tensor and `attention_mask`
      None or a non-floating tensor (Keras converts floating tensors only);
    - no dropout (`training` would come from an enclosing call);
    - no torch module hooks (global or on the layer), no `Module.compile()`, and not
      under `torch.compile` tracing (which keeps the general path).

    Example:
        >>> with torch.no_grad():  # doctest: +SKIP
        ...     can_skip_keras_call(layer, token, cache, 5, None)
        True
    """
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        return False
    return keras_call_adds_nothing(layer, query, cache, cache_index, attention_mask)


def keras_call_adds_nothing(layer, query, cache, cache_index, attention_mask):
    """`can_skip_keras_call` without its autograd and tracing conditions: for a caller
    that runs `layer.call` under `torch.no_grad()` itself (the compiled decode step).

    Example:
        >>> keras_call_adds_nothing(layer, token, cache, 5, None)  # doctest: +SKIP
        True
    """
    if not isinstance(query, torch.Tensor) or getattr(query, "_keras_mask", None) is not None:
        return False
    if type(cache) not in (tuple, list, kv_cache.KVCache) or len(cache) != 2:
        return False
    key, value = cache
    if not (isinstance(key, torch.Tensor) and isinstance(value, torch.Tensor)):
        return False
    if key.dtype != query.dtype or value.dtype != query.dtype:
        return False
    # Anything but an integer index takes the general path, which refuses it.
    if isinstance(cache_index, torch.Tensor):
        if cache_index.is_floating_point() or cache_index.dtype == torch.bool:
            return False
    elif isinstance(cache_index, bool) or not isinstance(cache_index, (int, np.integer)):
        return False
    if attention_mask is not None and not (
        isinstance(attention_mask, torch.Tensor) and not attention_mask.is_floating_point()
    ):
        return False
    return not layer.dropout and _layer_call_is_plain(layer, query.dtype)


def _layer_call_is_plain(layer, dtype):
    """No Keras or torch machinery of `__call__` is active for `layer` (see above), whose
    compute dtype is `dtype` (a torch dtype)."""
    if not layer.built or layer._parent_path is None:
        return False
    policy = layer.dtype_policy
    if policy.quantization_mode is not None or layer._remat_mode:
        return False
    compute_dtype = policy.compute_dtype
    if compute_dtype != policy.variable_dtype or kv_cache.dtype_name(dtype) != compute_dtype:
        return False
    return no_call_machinery(layer)


def no_call_machinery(layer):
    """None of what `__call__` adds and can be switched on at any time is on for `layer`:
    an input spec, an activity regularizer, a Keras scope or distribution, torch hooks,
    `Module.compile()`.

    Example:
        >>> no_call_machinery(layer)  # doctest: +SKIP
        True
    """
    if layer.input_spec is not None or layer.activity_regularizer is not None:
        return False
    if _in_keras_scope():
        return False
    return not _has_hooks(layer) and getattr(layer, "_compiled_call_impl", None) is None


def _has_hooks(layer):
    """Torch module hooks on `layer`, or global ones."""
    module = torch.nn.modules.module
    return bool(
        layer._forward_hooks
        or layer._forward_pre_hooks
        or layer._backward_hooks
        or layer._backward_pre_hooks
        or module._global_forward_hooks
        or module._global_forward_pre_hooks
        or module._global_backward_hooks
        or module._global_backward_pre_hooks
    )


def _keras_value(variable):
    return variable.value


def _stored_value(variable):
    """The variable's tensor itself: what `.value` returns outside any Keras scope."""
    value = variable._value
    return variable.value if value is None else value


def _variable_reader():
    """How `step` reads variables: their stored tensors when that is what `.value` gives.

    `.value` looks up the stateless and autocast scopes and the default device
    (a `meta` device gives placeholders) for every variable; once per step is enough.
    """
    if _in_keras_scope() or _on_meta_device():
        return _keras_value
    return _stored_value


def _keras_state():
    """This thread's Keras global state as one dict: read once per step instead of through
    Keras's getters (about 0.7 us each, several per step)."""
    return vars(global_state.GLOBAL_STATE_TRACKER)  # clear_session replaces the tracker


def _in_keras_scope():
    """An autocast, stateless or symbolic scope, or a distribution, is active."""
    get = _keras_state().get
    return not all(get(name) is None for name in _KERAS_SCOPES)


def _on_meta_device():
    """Keras's default device is `meta` (placeholder tensors, as `keras.device("meta")`)."""
    return str(_keras_state().get("torch_device")) == "meta"


# layer -> (its query, key, value and output kernels, the same viewed as matrices).
_MATRICES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _projection_matrices(layer, read):
    """The four kernels as `(inputs, outputs)` matrices (views), made again only when a
    kernel's tensor changes, not reshaped at every step."""
    query = read(layer.query_kernel)
    key = read(layer.key_kernel)
    value = read(layer.value_kernel)
    output = read(layer.output_kernel)
    tracing = torch.compiler.is_compiling()  # a trace reshapes once, when it is made
    known = None if tracing else _MATRICES.get(layer)
    if known is not None:
        kernels, matrices = known
        if kernels[0] is query and kernels[1] is key and kernels[2] is value:
            if kernels[3] is output:
                return matrices
    matrices = (
        query.reshape(query.shape[0], -1),
        key.reshape(key.shape[0], -1),
        value.reshape(value.shape[0], -1),
        output.reshape(-1, output.shape[-1]),
    )
    if not tracing:
        # Until the next step, this keeps the kernels it saw (the variables' own tensors).
        _MATRICES[layer] = ((query, key, value, output), matrices)
    return matrices


def _rms_norm(layer, heads, scale):
    x = heads.float()
    x = x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + layer.qk_norm_epsilon)
    return (x * scale.float()).to(heads.dtype)


def _rope(layer, tensors, start):
    """Rotate `tensors` `(B, T, heads, D)` at positions `start ..`, as `RotaryEmbedding`."""
    rope = layer.rotary_embedding
    head_dim = tensors[0].shape[-1]
    rotary_dim = rope.rotary_dim(head_dim)
    if rotary_dim == 0:
        return tensors
    device = tensors[0].device
    # Converting the frequencies is a dozen dispatches itself: once per layer and device
    # (a trace makes them once).
    tracing = torch.compiler.is_compiling()
    cached = {} if tracing else _FREQUENCIES.setdefault(rope, {})
    inv_freq = cached.get((rotary_dim, device))
    if inv_freq is None:
        values = rope._inverse_frequencies(rotary_dim)
        inv_freq = torch.tensor(values, dtype=torch.float32, device=device)
        cached[rotary_dim, device] = inv_freq
    frequencies = None if tracing else rope._inverse_frequencies(rotary_dim)
    cos, sin = _rotation(frequencies, inv_freq, start, tensors[0])
    rotated = []
    for tensor in tensors:
        x = tensor.float()
        rotating, passing = x[..., :rotary_dim], x[..., rotary_dim:]
        first, second = rotating[..., : rotary_dim // 2], rotating[..., rotary_dim // 2 :]
        # `a * cos + b * sin`, each product written into a tensor made here.
        out = (rotating * cos).add_(torch.cat([-second, first], dim=-1).mul_(sin))
        if rotary_dim < head_dim:
            out = torch.cat([out, passing], dim=-1)
        rotated.append(out.to(tensor.dtype))
    return rotated


def _rotation(frequencies, inv_freq, start, tensor):
    """`cos` and `sin` of the angles at positions `start .. start + T` (`tensor`'s T).

    A model's layers share their RoPE settings and, in one step, their positions: the
    angles of the last call are kept per (frequencies, device) and reused by the next
    layers instead of being computed once per layer.
    """
    device, length = tensor.device, tensor.shape[1]
    key = (frequencies, device)
    last = None if frequencies is None else _ANGLES.get(key)  # None: traced, kept nowhere
    if isinstance(start, int) and last is not None and last[:2] == (start, length):
        return last[2:]
    positions = torch.arange(start, start + length, dtype=torch.int32, device=device).float()
    angles = positions[None, :, None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)[:, :, None, :]
    cos, sin = torch.cos(angles), torch.sin(angles)
    if isinstance(start, int) and frequencies is not None:
        _ANGLES[key] = (start, length, cos, sin)
    return cos, sin


def step(layer, query, cache, start, attention_mask, options, read=None):
    """`(output, cache)` of self-attention with `cache` written at `start` (a Python int).

    `cache` is a checked `KVCache`; `options` the call's
    `AttentionOptions` (`keras_mha.layers.attention_paths`);
    `read(variable)` gives a variable's tensor (default: as `_variable_reader` finds).
    """
    read = read or _variable_reader()
    if query.device != cache.key.device:
        query = query.to(cache.key.device)  # as keras.ops moves a CPU tensor to the GPU
    batch, length, head_dim = query.shape[0], query.shape[1], layer.head_dim
    rows = query.reshape(batch * length, -1)  # once for the three projections
    query_matrix, key_matrix, value_matrix, output_matrix = _projection_matrices(layer, read)
    if layer.use_bias:
        q = rows_linear(rows, query_matrix, read(layer.query_bias))
        k = rows_linear(rows, key_matrix, read(layer.key_bias))
        v = rows_linear(rows, value_matrix, read(layer.value_bias))
    else:
        q, k, v = rows @ query_matrix, rows @ key_matrix, rows @ value_matrix
    q = q.view(batch, length, -1, head_dim)
    k = k.view(batch, length, -1, head_dim)
    v = v.view(batch, length, -1, head_dim)
    if layer.use_qk_norm:
        q = _rms_norm(layer, q, read(layer.query_norm_scale))
        k = _rms_norm(layer, k, read(layer.key_norm_scale))
    if layer.use_rope:
        q, k = _rope(layer, (q, k), start)
    stop = start + length
    if length == 1:  # (B, 1, Hkv, D) into column `start` of (B, Hkv, S, D)
        cache.key.select(2, start).copy_(k.select(1, 0))
        cache.value.select(2, start).copy_(v.select(1, 0))
    else:
        cache.key[:, :, start:stop] = k.transpose(1, 2)
        cache.value[:, :, start:stop] = v.transpose(1, 2)
    if length == 1 and attention_mask is None:
        # A lone query sees the whole written prefix (a view): no mask at all.
        first, _ = masks.visible_prefix(start, 1, layer.sliding_window, options.causal)
        attended = attention.one_query_attention(
            q, cache.key[:, :, first:stop], cache.value[:, :, first:stop], None, scale=options.scale
        )
    else:
        attended = _attend_chunk(layer, q, k, v, cache, start, attention_mask, options)
    return _output(layer, attended, batch, length, read, output_matrix), cache


def _attend_chunk(layer, q, k, v, cache, start, attention_mask, options):
    """Attention of `length` queries at `start ..`, or of one query under a mask."""
    batch, length = q.shape[0], q.shape[1]
    causal, window = options.causal, layer.sliding_window
    if start == 0 and length > 1 and causal and attention_mask is None and window is None:
        # A prefill: the kernel's own causal mask, as the general path.
        return attention_kernels.fused_attention(
            q, k, v, None, scale=options.scale, is_causal=True, rows_may_be_empty=False
        )
    first, stop = masks.visible_prefix(start, length, window, causal)
    keys, values = cache.key[:, :, first:stop], cache.value[:, :, first:stop]
    mask = None
    if attention_mask is not None:
        if isinstance(attention_mask, torch.Tensor) and attention_mask.device != q.device:
            attention_mask = attention_mask.to(q.device)
        mask = masks.normalise_attention_mask(
            attention_mask,
            batch=batch,
            query_length=length,
            key_length=cache.max_length,
            num_heads=layer.num_heads,
        )[..., first:stop]
    if length > 1 and causal:
        # Query i (at start + i) sees keys up to start + i of the prefix [first, stop);
        # a lone query sees the whole prefix, so it needs no mask.
        key_positions = torch.arange(first, stop, device=q.device)
        query_positions = torch.arange(start, stop, device=q.device)[:, None]
        allowed = key_positions <= query_positions
        if window is not None:
            allowed = allowed & (query_positions - key_positions < window)
        mask = allowed[None, None] if mask is None else mask & allowed
    return attention_kernels.fused_attention(
        q,
        keys,
        values,
        mask,
        scale=options.scale,
        rows_may_be_empty=attention_mask is not None,
        key_heads_first=True,
    )


def _output(layer, attended, batch, length, read, matrix):
    """Head gates, then the output projection (`matrix`), as `GroupedQueryAttention._output`."""
    gates = read(layer.head_gates)
    # Gates at 1 (no pruning) leave the heads as they are; a trace cannot read them.
    if torch.compiler.is_compiling() or not _all_ones(layer, gates):
        attended = attended * gates.to(attended.dtype)[:, None]
    bias = read(layer.output_bias) if layer.use_output_bias else None
    output = rows_linear(attended.reshape(batch * length, -1), matrix, bias)
    return output.view(batch, length, -1)


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
    state = _keras_state()
    if torch.compiler.is_compiling() or state.get("stateless_scope") is not None:
        return False
    if state.get("symbolic_scope") is not None:
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
