"""PyTorch's decode steps: eager calls under `torch.no_grad()`, or `torch.compile`.

`compile_decode_step` (see `keras_mha.backends.steps` for what every backend shares)
runs `forward` eagerly with autograd off, the caches written in place, or with
`compile_torch=True` under `torch.compile`, static graphs (`dynamic=False`, or one step
per tensor signature). A layer's compiled step traces `layer.call` itself where Keras's
`Layer.__call__` would add nothing (`eager_decode.keras_call_adds_nothing`), and its
decode function (`layer_decode_function`) reuses the last such step for the same cache
and query shape. The index is a 0-d int32 tensor to a compiled step, so one graph serves
every position.

Example:
    >>> layer = GroupedQueryAttention(8, 2, head_dim=16, causal=True)
    >>> layer.build((None, None, 64))
    >>> prompt = keras.random.normal((1, 5, 64))
    >>> decode = layer_decode_function(layer)
    >>> cache = layer.init_cache(1, 64)
    >>> output, cache = decode(prompt, cache, 0)
    >>> output, cache = decode(output[:, -1:], cache, prompt.shape[1])
    >>> tuple(output.shape)
    (1, 1, 64)
"""

from __future__ import annotations

import functools
import types
import warnings

import keras
import torch

from keras_mha.backends import steps
from keras_mha.backends.common import kv_cache
from keras_mha.backends.torch import eager_decode


def compile_decode_step(
    owner,
    forward,
    *,
    static_index=False,
    compile_torch=False,
    jit_compile=True,
    eager_forward=None,
    on_trace=None,
    guard_tensors_only=False,
    one_signature=False,
):
    """`forward` run eagerly with autograd off, or under `torch.compile` with
    `compile_torch=True` (options: `keras_mha.backends.compile_decode_step`).

    Example:
        >>> layer = GroupedQueryAttention(8, 2, head_dim=16, causal=True)
        >>> _ = layer(keras.ops.ones((1, 4, 64)))
        >>> step = compile_decode_step(layer, lambda x, mask, cache, index: layer(
        ...     x, cache=cache, cache_index=index, attention_mask=mask))
        >>> output, cache = step(keras.ops.ones((1, 1, 64)), None, layer.init_cache(1, 16), 7)
        >>> tuple(output.shape)
        (1, 1, 64)
    """
    on_trace = on_trace or (lambda: None)
    quantized = quantized_layers(owner) if compile_torch else []
    if quantized:
        warnings.warn(
            f"compile_torch=True: {owner.name} has quantized layers "
            f"({', '.join(quantized[:3])}); their Keras calls go through "
            "one torch.autograd.Function class whose trace torch.compile reuses for every "
            "layer, so they run eagerly (the numbers of the eager step)",
            stacklevel=3,
        )
        compile_torch = False
    if compile_torch:
        # Dynamo replays Python side effects at every call: `on_trace` stays outside.
        forward = steps.positioned(forward, static_index)
        return _compiled_torch_step(forward, on_trace, guard_tensors_only, one_signature)
    return _eager_torch_step(eager_forward or forward, static_index)


def quantized_layers(owner) -> list:
    """Names of `owner`'s quantized layers (itself included): their Keras calls go through
    Keras's `custom_gradient`, one `torch.autograd.Function` class for every call, and
    torch.compile replays the first call's trace for the others (a key projection came out
    at the query's width), so steps over them run eagerly.

    Example:
        >>> layer = GroupedQueryAttention(4, 2, head_dim=8)
        >>> layer.build((None, None, 32))
        >>> quantized_layers(layer)
        []
        >>> layer.quantize("int8")
        >>> quantized_layers(layer)[0] == layer.name
        True
    """
    layers = [owner, *owner._flatten_layers(include_self=False)]
    return [layer.name for layer in layers if getattr(layer, "quantization_mode", None)]


def _compiled_torch_step(forward, on_trace, guard_tensors_only, one_signature):
    # Python ints would be specialised (a graph per position): the index is a tensor.
    # Checking every Python attribute a Keras call reads cost more than the step
    # (measured), hence `guard_tensors_only`. Autograd is switched off outside the graph.
    def tensor_guards(guard_entries):
        return torch.compiler.keep_tensor_guards_unsafe(guard_entries, keep_parameters=True)

    options = {"guard_filter_fn": tensor_guards} if guard_tensors_only else None
    if guard_tensors_only:
        # Dynamo keeps its graphs per code object: guarding only the tensors, the steps
        # made from one closure (a prefill and a step, two layers) would share them.
        forward = _with_own_code(forward)
    # Graphs stay static: Dynamo's default compiles static graphs and makes a dimension
    # dynamic only when a later call changes its size, which a one-signature step never sees.
    compiled = torch.compile(forward, dynamic=None if one_signature else False, options=options)
    first_call = [True]
    run_tensors = _without_autograd(compiled)  # on torch tensors, `index` one too

    def step(inputs, mask, caches, index):
        if first_call[0]:
            first_call[0] = False
            on_trace()
        if steps.is_int(index):
            index = _index_tensor(int(index))
        # NumPy in a compiled frame fails inside Dynamo: converted here, as Keras would.
        if not isinstance(inputs, torch.Tensor):
            inputs = keras.ops.convert_to_tensor(inputs)
        if mask is not None and not isinstance(mask, torch.Tensor):
            mask = keras.ops.convert_to_tensor(mask)
        return run_tensors(inputs, mask, caches, index)

    step.run_tensors = run_tensors  # for a caller that converted the arguments itself
    return step


@functools.lru_cache(maxsize=1 << 16)
def _index_tensor(index):
    """The 0-d int32 tensor of a position, made once: graphs only read it."""
    return torch.tensor(index, dtype=torch.int32)


def _with_own_code(function):
    """`function` with a code object of its own (a copy), closure and defaults kept."""
    code = function.__code__.replace()
    return types.FunctionType(
        code, function.__globals__, function.__name__, function.__defaults__, function.__closure__
    )


def _eager_torch_step(forward, static_index):
    if static_index:  # a prefill: position 0 whatever `index` is
        return _without_autograd(lambda inputs, mask, caches, _: forward(inputs, mask, caches, 0))
    return _without_autograd(forward)


def _without_autograd(function):
    """`function`, called with autograd off: what `torch.no_grad()` does, without its
    context-manager wrapper, which cost 3x as much as switching the mode (about a fused
    kernel launch per step)."""
    set_grad_enabled = torch._C._set_grad_enabled

    def call(*args):
        enabled = torch.is_grad_enabled()
        set_grad_enabled(False)
        try:
            return function(*args)
        finally:
            set_grad_enabled(enabled)

    return call


def layer_decode_function(layer, *, compile_torch=False, jit_compile=True):
    """`GroupedQueryAttention.make_decode_function`: see its docstring.

    Example:
        >>> layer = GroupedQueryAttention(8, 2, head_dim=16, causal=True)
        >>> layer.build((None, None, 64))
        >>> decode = layer_decode_function(layer)
        >>> output, cache = decode(keras.ops.ones((1, 3, 64)), layer.init_cache(1, 16), 0)
        >>> tuple(output.shape)
        (1, 3, 64)
    """
    forward = steps.layer_forward(layer)

    def eager_forward(query, mask, cache, index):
        # Keras's per-call bookkeeping costs about as much as the step itself; after one
        # direct step, `warm_step` checks only what can change between steps.
        if mask is None:
            output = eager_decode.warm_step(layer, query, cache, index)
            if output is not None:
                return output
        if eager_decode.can_skip_keras_call(layer, query, cache, index, mask):
            return eager_decode.call_directly(layer, query, cache, index, mask)
        return forward(query, mask, cache, index)

    def checked_forward(query, mask, cache, index):
        # `decode` checked the int index: the graph needs no guard against an overrun.
        with kv_cache.index_checked_by_caller():
            return forward(query, mask, cache, index)

    def direct_forward(query, mask, cache, index):
        # `decode` checked the int index, and that `Layer.__call__` would add nothing.
        with kv_cache.index_checked_by_caller():
            return layer.call(query, cache=cache, cache_index=index, attention_mask=mask)

    options = {"compile_torch": compile_torch, "jit_compile": jit_compile}
    options.update(eager_forward=eager_forward, guard_tensors_only=True)  # one graph
    prefill = compile_decode_step(layer, forward, static_index=True, **options)
    step = compile_decode_step(layer, forward, **options)
    checked_step = step
    if compile_torch:
        checked_step = compile_decode_step(layer, checked_forward, **options)
    direct_steps = {}  # tensor signature -> a compiled step over `layer.call` for it

    def direct_step(query, mask, cache, index):
        """The compiled step that traces `layer.call` for these tensors, or None."""
        if not eager_decode.keras_call_adds_nothing(layer, query, cache, index, mask):
            return None
        signature = _tensor_signature(query, mask, *cache)
        found = direct_steps.get(signature)
        if found is None and len(direct_steps) < _DIRECT_SIGNATURES:
            found = compile_decode_step(layer, direct_forward, one_signature=True, **options)
            direct_steps[signature] = found
        if not layer._called:
            layer._called = True  # what Layer.__call__ would record
        return found

    # `eager_decode.remember_step(...)` of the last direct step, its payload the step.
    last_direct = [None]

    def decode(query, cache, cache_index, attention_mask=None):
        if attention_mask is None:  # a step that ran before (at 0: the prefill's place)
            run = eager_decode.last_step(last_direct[0], layer, query, cache, cache_index, 1)
            if run is not None:  # its tensors were converted then, as they are now
                return run.run_tensors(query, None, cache, _index_tensor(cache_index))
        run = step
        if steps.is_int(cache_index):
            if cache_index == 0:
                run = prefill
            elif checked_step is not step and steps.check_write(query, cache, cache_index):
                run = direct_step(query, attention_mask, cache, cache_index) or checked_step
                if run is not checked_step and attention_mask is None:
                    last_direct[0] = eager_decode.remember_step(layer, query, cache, run)
        return run(query, attention_mask, cache, cache_index)

    return decode


# Compiled steps over `layer.call` a PyTorch decode function keeps, one per signature of
# its tensors; further signatures take the step through `Layer.__call__`.
_DIRECT_SIGNATURES = 32


def _tensor_signature(*tensors):
    """Shape, strides, dtype and device of each tensor (None stays None): what Dynamo's
    tensor guards compare."""
    return tuple(None if t is None else (t.shape, t.stride(), t.dtype, t.device) for t in tensors)
