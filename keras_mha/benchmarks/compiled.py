"""Compile a layer's forward, forward+backward and decode step the backend's own way.

Every function here treats keras-mha layers and Keras built-ins alike, so both
sides of a comparison are compiled and differentiated identically:

| backend    | forward / decode step              | forward+backward                         |
|------------|------------------------------------|------------------------------------------|
| JAX        | `jax.jit` of `layer.stateless_call` | `jax.jit(jax.value_and_grad(...))`       |
| TensorFlow | `tf.function(jit_compile=...)`      | `tf.GradientTape` inside that tf.function |
| PyTorch    | eager (`torch.compile` on request)  | `torch.autograd.grad`                    |

The forward+backward loss is `mean(output ** 2)`; gradients are taken with
respect to the input and every trainable weight. Each returned `CompiledCall`
blocks until its result is computed, so wall-clock time around it is the
time of the computation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# keras is imported inside the functions: the benchmark's parent process reads
# `CompileOptions` without importing a backend.


@dataclass(frozen=True)
class CompileOptions:
    """How to compile on each backend.

    Args:
        tf_jit_compile: `tf.function(jit_compile=...)` on TensorFlow (XLA).
        torch_compile: wrap the PyTorch calls in `torch.compile`.

    Example:
        >>> CompileOptions(tf_jit_compile=True).describe("tensorflow")
        'tf.function(jit_compile=True)'
    """

    tf_jit_compile: bool = True
    torch_compile: bool = False

    def describe(self, backend: str) -> str:
        """One line saying how calls are compiled on `backend`."""
        if backend == "jax":
            return "jax.jit"
        if backend == "tensorflow":
            return f"tf.function(jit_compile={self.tf_jit_compile})"
        if backend == "torch":
            return "torch.compile" if self.torch_compile else "torch eager"
        return f"{backend} (uncompiled)"


@dataclass
class CompiledCall:
    """One compiled computation: `run(*args)` computes it and waits for the result.

    Attributes:
        run: the call. Returns the result as backend tensors.
        traces: how many times the Python function was traced (JAX,
            TensorFlow) or how many graphs Inductor compiled (`torch.compile`);
            0 for eager PyTorch, where nothing is compiled.

    Example:
        >>> call = compile_forward(layer, x, lambda x: (x,), {})
        >>> output = call.run()
    """

    run: Callable[..., Any]
    _trace_count: list = field(default_factory=lambda: [0])

    @property
    def traces(self) -> int:
        return self._trace_count[0]


def scalar_loss(output):
    """The benchmark's scalar loss: `mean(output ** 2)` in float32.

    Example:
        >>> float(scalar_loss(ops.ones((2, 3))))
        1.0
    """
    from keras import ops

    return ops.mean(ops.square(ops.cast(output, "float32")))


def _torch_compile(function, traces):
    """`torch.compile(function)`, counting in `traces[0]` the graphs Inductor compiles.

    A Python counter inside a compiled function would count calls, not
    compilations (TorchDynamo replays side effects on every call), so the count
    comes from a backend that wraps Inductor.
    """
    import torch

    inductor = torch._dynamo.lookup_backend("inductor")

    def counting_inductor(graph_module, example_inputs):
        traces[0] += 1
        return inductor(graph_module, example_inputs)

    return torch.compile(function, backend=counting_inductor)


def _backend() -> str:
    import keras

    return keras.backend.backend()


def compile_forward(layer, x, arguments, call_kwargs, options=CompileOptions()):
    """Compiled inference call `layer(*arguments(x), **call_kwargs)`.

    Args:
        layer: a built Keras layer.
        x: the input tensor.
        arguments: maps `x` to the layer's positional arguments (`(x,)` for
            keras-mha self-attention, `(x, x)` for Keras's built-ins).
        call_kwargs: keyword arguments of the call (`use_causal_mask=True`).
        options: `CompileOptions`.

    Returns:
        A `CompiledCall` whose `run()` returns the output.

    Example:
        >>> call = compile_forward(layer, x, lambda x: (x,), {})
        >>> call.run().shape
        (1, 16, 64)
    """
    traces = [0]
    backend = _backend()
    if backend == "jax":
        import jax

        trainable = [v.value for v in layer.trainable_variables]
        non_trainable = [v.value for v in layer.non_trainable_variables]

        def forward(trainable, non_trainable, x):
            traces[0] += 1
            output, _ = layer.stateless_call(trainable, non_trainable, *arguments(x), **call_kwargs)
            return output

        jitted = jax.jit(forward)
        return CompiledCall(
            lambda: jax.block_until_ready(jitted(trainable, non_trainable, x)), traces
        )
    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=options.tf_jit_compile)
        def forward(x):
            traces[0] += 1
            return layer(*arguments(x), **call_kwargs)

        return CompiledCall(lambda: forward(x), traces)
    if backend == "torch":
        import torch

        def forward(x):
            return layer(*arguments(x), **call_kwargs)

        compiled = _torch_compile(forward, traces) if options.torch_compile else forward

        def run():
            with torch.no_grad():
                return compiled(x)

        return CompiledCall(run, traces)
    raise ValueError(f"KERAS_BACKEND={backend!r} is not supported; use jax, tensorflow or torch.")


def compile_forward_backward(layer, x, arguments, call_kwargs, options=CompileOptions()):
    """Compiled loss and gradients w.r.t. `x` and every trainable weight of `layer`.

    Args and Returns: as `compile_forward`; `run()` returns the loss.

    Example:
        >>> call = compile_forward_backward(layer, x, lambda x: (x,), {})
        >>> float(call.run()) > 0
        True
    """
    traces = [0]
    backend = _backend()
    if backend == "jax":
        import jax

        trainable = [v.value for v in layer.trainable_variables]
        non_trainable = [v.value for v in layer.non_trainable_variables]

        def loss(trainable, x):
            traces[0] += 1
            output, _ = layer.stateless_call(trainable, non_trainable, *arguments(x), **call_kwargs)
            return scalar_loss(output)

        jitted = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))

        def run():
            value, gradients = jax.block_until_ready(jitted(trainable, x))
            return value

        return CompiledCall(run, traces)
    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=options.tf_jit_compile)
        def forward_backward(x):
            traces[0] += 1
            with tf.GradientTape() as tape:
                tape.watch(x)
                value = scalar_loss(layer(*arguments(x), **call_kwargs))
            gradients = tape.gradient(value, [x, *layer.trainable_variables])
            return value, gradients

        return CompiledCall(lambda: forward_backward(x)[0], traces)
    if backend == "torch":
        import torch

        parameters = [v.value for v in layer.trainable_variables]
        leaf = x.detach().clone().requires_grad_(True)

        def forward_backward(leaf):
            value = scalar_loss(layer(*arguments(leaf), **call_kwargs))
            torch.autograd.grad(value, [leaf, *parameters])
            return value.detach()

        compiled = (
            _torch_compile(forward_backward, traces) if options.torch_compile else forward_backward
        )
        return CompiledCall(lambda: compiled(leaf), traces)
    raise ValueError(f"KERAS_BACKEND={backend!r} is not supported; use jax, tensorflow or torch.")


def compile_decode_step(layer, cache, options=CompileOptions()):
    """Compiled one-token decode step with a fixed-shape KV cache; the cache is carried.

    `run(token, cache_index)` feeds `token` `(batch, 1, features)` at
    `cache_index` (a backend int32 scalar tensor, so that every position reuses
    one compiled step), keeps the updated cache for the next call and returns
    the step's output. On JAX the cache buffer is donated to the step, as a
    decoding loop would.

    Example:
        >>> step = compile_decode_step(layer, layer.init_cache(1, 32))
        >>> step.run(x[:, :1], ops.convert_to_tensor(0, "int32")).shape
        (1, 1, 64)
    """
    traces = [0]
    state = {"cache": cache}
    backend = _backend()
    if backend == "jax":
        import jax

        trainable = [v.value for v in layer.trainable_variables]
        non_trainable = [v.value for v in layer.non_trainable_variables]

        def step(trainable, non_trainable, token, cache, cache_index):
            traces[0] += 1
            (output, cache), _ = layer.stateless_call(
                trainable, non_trainable, token, cache=cache, cache_index=cache_index
            )
            return output, cache

        jitted = jax.jit(step, donate_argnums=(3,))

        def run(token, cache_index):
            output, state["cache"] = jax.block_until_ready(
                jitted(trainable, non_trainable, token, state["cache"], cache_index)
            )
            return output

        return CompiledCall(run, traces)
    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=options.tf_jit_compile)
        def step(token, cache, cache_index):
            traces[0] += 1
            return layer(token, cache=cache, cache_index=cache_index)

        def run(token, cache_index):
            output, state["cache"] = step(token, state["cache"], cache_index)
            return output

        return CompiledCall(run, traces)
    if backend == "torch":
        import torch

        def step(token, cache, cache_index):
            return layer(token, cache=cache, cache_index=cache_index)

        compiled = _torch_compile(step, traces) if options.torch_compile else step

        def run(token, cache_index):
            with torch.no_grad():
                output, state["cache"] = compiled(token, state["cache"], cache_index)
            return output

        return CompiledCall(run, traces)
    raise ValueError(f"KERAS_BACKEND={backend!r} is not supported; use jax, tensorflow or torch.")
