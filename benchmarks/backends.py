"""The backend-specific half of `keras-mha bench layers`: compiling, references, peaks.

Everything a timed call needs, written once per backend:

| backend    | compiled as                                       | waits for the result with |
|------------|---------------------------------------------------|---------------------------|
| JAX        | `jax.jit` (the decode state donated)              | `jax.block_until_ready`   |
| TensorFlow | `tf.function(jit_compile=True)` (XLA)             | `sync_devices()` on a GPU |
| PyTorch    | eager, or `torch.compile` with `--torch-compile`  | `torch.cuda.synchronize`  |

The hand-written references (`reference_forward`, `reference_decode`) take the
keras-mha layer's own weights and do what a user writing attention by hand
would: the four projections as plain matmuls plus the backend's fused kernel
called directly - `torch.nn.functional.scaled_dot_product_attention(...,
enable_gqa=True)`, `jax.nn.dot_product_attention` (cuDNN on a GPU in 16-bit
floats, XLA otherwise), a grouped einsum in an XLA-compiled `tf.function`.
Their decode steps keep K and V in separate buffers updated in place: an
indexed write on torch, `dynamic_update_slice` with the buffers donated on
JAX, XLA's dynamic-update-slice into `tf.Variable`s on TensorFlow.

`matmul_peak` and `copy_bandwidth` measure the roofline the figures are
compared with: a large matmul in the benchmark's dtype, and `y = x + 1` over a
buffer far larger than the caches.

Example:
    >>> run = compile_call(lambda params, x: x * 2, training=False)
    >>> finish(run([], ops.ones((2,))))  # doctest: +SKIP
"""

from __future__ import annotations

import time

# keras and the backend are imported inside the functions: the benchmark's
# parent process parses flags and renders tables without importing a backend.


def backend() -> str:
    import keras

    return keras.backend.backend()


def device() -> str:
    """`cuda`/`gpu`/`cpu`: where the backend computes (Keras's own device choice).

    Example:
        >>> device() in ("cpu", "gpu", "cuda")
        True
    """
    name = backend()
    if name == "torch":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "jax":
        import jax

        return jax.devices()[0].platform
    import tensorflow as tf

    return "gpu" if tf.config.list_logical_devices("GPU") else "cpu"


def device_name() -> str:
    """The name of the accelerator `device()` computes on (`NVIDIA H100 80GB HBM3`), or
    `cpu`.

    Example:
        >>> isinstance(device_name(), str)
        True
    """
    if device() == "cpu":
        return "cpu"
    name = backend()
    if name == "torch":
        import torch

        return torch.cuda.get_device_name()
    if name == "jax":
        import jax

        return jax.devices()[0].device_kind
    import tensorflow as tf

    return tf.config.list_logical_devices("GPU")[0].name


def versions() -> dict:
    import keras

    found = {"keras": keras.__version__}
    module = {"jax": "jax", "tensorflow": "tensorflow", "torch": "torch"}[backend()]
    found[module] = __import__(module).__version__
    return found


def finish(result):
    """Wait until `result` is computed (the device runs asynchronously) and return it."""
    name = backend()
    if name == "jax":
        import jax

        return jax.block_until_ready(result)
    if name == "torch":
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return result
    import tensorflow as tf

    if tf.config.list_logical_devices("GPU"):
        tf.test.experimental.sync_devices()
    return result


def _torch_compile_if(enabled, function):
    if not enabled:
        return function
    import torch

    return torch.compile(function)


def compile_call(apply, *, training, tf_jit_compile=True, torch_compile=False):
    """`run(params, *args)`: `apply(params, *args)` compiled, or its loss and gradients.

    Args:
        apply: `apply(params, x) -> output`; `params` is a list of tensors or
            variables that the gradients are taken with respect to.
        training: False for the forward pass; True for `mean(output ** 2)`
            in float32 and its gradients with respect to `x` and `params`, by
            the backend's autodiff (`run` then returns the loss).

    Example:
        >>> run = compile_call(lambda params, x: x @ params[0], training=True)
    """
    from keras import ops

    def loss(params, x):
        return ops.mean(ops.square(ops.cast(apply(params, x), "float32")))

    name = backend()
    if name == "jax":
        import jax

        if training:
            return jax.jit(lambda params, x: jax.value_and_grad(loss, argnums=(0, 1))(params, x)[0])
        return jax.jit(apply)
    if name == "tensorflow":
        import tensorflow as tf

        if not training:
            return tf.function(apply, jit_compile=tf_jit_compile)

        @tf.function(jit_compile=tf_jit_compile)
        def forward_backward(params, x):
            with tf.GradientTape() as tape:
                tape.watch([x, *params])
                value = loss(params, x)
            tape.gradient(value, [x, *params])
            return value

        return forward_backward
    import torch

    if not training:
        compiled = _torch_compile_if(torch_compile, apply)

        def forward(params, x):
            with torch.no_grad():
                return compiled(params, x)

        return forward

    def forward_backward(params, x):
        leaf = x.detach().requires_grad_(True)
        value = loss(params, leaf)
        torch.autograd.grad(value, [leaf, *params])
        return value.detach()

    return _torch_compile_if(torch_compile, forward_backward)


def compile_step(step, *, tf_jit_compile=True, torch_compile=False):
    """A decode step `step(params, token, state, index) -> (output, state)`, compiled.

    The state (a KV cache) is donated on JAX, so XLA may update it in place.

    Example:
        >>> run = compile_step(lambda params, token, state, index: (token, state))
    """
    name = backend()
    if name == "jax":
        import jax

        return jax.jit(step, donate_argnums=(2,))
    if name == "tensorflow":
        import tensorflow as tf

        return tf.function(step, jit_compile=tf_jit_compile)
    import torch

    compiled = _torch_compile_if(torch_compile, step)

    def run(params, token, state, index):
        with torch.no_grad():
            return compiled(params, token, state, index)

    return run


def decode_index(position: int):
    """The cache position as each backend's decode loop passes it.

    An int32 scalar tensor on JAX and TensorFlow (one compiled step serves
    every position); a Python int on PyTorch, as an eager loop would.
    """
    if backend() == "torch":
        return position
    from keras import ops

    return ops.convert_to_tensor(position, dtype="int32")


# --------------------------------------------------------------------- keras layers
def layer_apply(layer, call_kwargs=None, two_inputs=False):
    """`(apply, params)` for a built Keras layer: `apply(params, x)` calls it on `x`.

    On JAX the call is `layer.stateless_call` with `params` as the trainable
    weights; elsewhere the layer reads its own variables (`params` are those
    variables, so gradients reach them).
    """
    call_kwargs = call_kwargs or {}
    params = [variable.value for variable in layer.trainable_variables]

    def arguments(x):
        return (x, x) if two_inputs else (x,)

    if backend() == "jax":
        non_trainable = [variable.value for variable in layer.non_trainable_variables]

        def apply(params, x):
            output, _ = layer.stateless_call(params, non_trainable, *arguments(x), **call_kwargs)
            return output

        return apply, params
    return (lambda params, x: layer(*arguments(x), **call_kwargs)), params


def layer_step(layer, call=None):
    """`(step, params)`: one cached decode step of a keras layer through its public API.

    `call(layer_or_stateless, token, cache, index)` defaults to keras-mha's
    `layer(token, cache=cache, cache_index=index)`; the cache stays opaque.
    """
    call = call or (lambda fn, token, cache, index: fn(token, cache=cache, cache_index=index))
    params = [variable.value for variable in layer.trainable_variables]
    if backend() == "jax":
        non_trainable = [variable.value for variable in layer.non_trainable_variables]

        def step(params, token, cache, index):
            def stateless(*args, **kwargs):
                return layer.stateless_call(params, non_trainable, *args, **kwargs)[0]

            return call(stateless, token, cache, index)

        return step, params
    return (lambda params, token, cache, index: call(layer, token, cache, index)), params


def in_place_step(step, cache):
    """`step` on a cache of variables updated in place (keras-mha's TensorFlow serving path).

    The compiled step reads the variables from here and does not return them
    (a variable returned by a `tf.function` comes back as a copy), as the
    reference's step does with its own.
    """

    def run(params, token, state, index):
        output, _ = step(params, token, cache, index)
        return output, state

    return run


def keras_hub_step(fn, token, cache, index):
    """keras-hub's `CachedMultiHeadAttention` step, masked to positions <= index (as its models)."""
    from keras import ops

    positions = ops.arange(ops.shape(cache)[2])
    mask = ops.broadcast_to(
        ops.expand_dims(positions <= index, 0), (ops.shape(token)[0], 1, ops.shape(cache)[2])
    )
    return fn(token, token, cache=cache, cache_update_index=index, attention_mask=mask)


# ----------------------------------------------------------------------- references
def reference_weights(layer):
    """The keras-mha layer's projections as 2-D matrices (features, heads * head_dim).

    Returns a dict of backend tensors: `wq, wk, wv, wo` and, where the layer
    has them, `bq, bk, bv, bo`; plus the head counts and the logit scale.
    """
    from keras import ops

    def matrix(variable, rows):
        return ops.reshape(variable.value, (rows, -1))

    features = layer.query_kernel.shape[0]
    weights = {
        "wq": matrix(layer.query_kernel, features),
        "wk": matrix(layer.key_kernel, features),
        "wv": matrix(layer.value_kernel, features),
        "wo": matrix(layer.output_kernel, layer.num_heads * layer.head_dim),
    }
    for short, name in (("bq", "query"), ("bk", "key"), ("bv", "value"), ("bo", "output")):
        bias = getattr(layer, f"{name}_bias", None)
        if bias is not None:
            weights[short] = ops.reshape(bias.value, (-1,))
    shape = {"heads": layer.num_heads, "kv_heads": layer.num_key_value_heads}
    shape["head_dim"] = layer.head_dim
    return weights, shape


def _project(w, x, kernel, bias):
    out = x @ w[kernel]
    return out + w[bias] if bias in w else out


def _grouped_einsum_attention(q, k, v, allowed, scale):
    """Softmax attention, queries grouped per KV head; float32 softmax like the kernels.

    q (B, T, Hkv, G, D); k, v (B, S, Hkv, D); allowed broadcastable to (T, S).
    """
    from keras import ops

    logits = ops.einsum("btkgd,bskd->bkgts", q, k)
    logits = ops.cast(logits, "float32") * scale
    logits = ops.where(allowed, logits, -1e30)
    weights = ops.cast(ops.softmax(logits, axis=-1), v.dtype)
    return ops.einsum("bkgts,bskd->btkgd", weights, v)


def reference_forward(weights, shape, causal, dtype):
    """`apply(params, x)` of the hand-written attention; `params` = the weight tensors.

    Example:
        >>> layer = GroupedQueryAttention(4, 2, causal=True); layer.build((None, None, 32))
        >>> x = keras.random.normal((1, 6, 32))
        >>> apply, params = reference_forward(*reference_weights(layer), True, "float32")
        >>> tuple(apply(params, x).shape)
        (1, 6, 32)
    """
    names = sorted(weights)
    heads, kv_heads, head_dim = shape["heads"], shape["kv_heads"], shape["head_dim"]
    scale = head_dim**-0.5
    name = backend()

    if name == "torch":
        import torch.nn.functional as functional

        def apply(params, x):
            w = dict(zip(names, params, strict=True))
            batch, length, _ = x.shape
            q = _project(w, x, "wq", "bq").view(batch, length, heads, head_dim).transpose(1, 2)
            k = _project(w, x, "wk", "bk").view(batch, length, kv_heads, head_dim).transpose(1, 2)
            v = _project(w, x, "wv", "bv").view(batch, length, kv_heads, head_dim).transpose(1, 2)
            o = functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
            return _project(w, o.transpose(1, 2).reshape(batch, length, -1), "wo", "bo")

    elif name == "jax":
        import jax

        # cuDNN's fused kernel takes 16-bit floats only; XLA's composition otherwise.
        gpu_kernel = device() == "gpu" and dtype in ("bfloat16", "float16")
        implementation = "cudnn" if gpu_kernel else None

        def apply(params, x):
            w = dict(zip(names, params, strict=True))
            batch, length, _ = x.shape
            q = _project(w, x, "wq", "bq").reshape(batch, length, heads, head_dim)
            k = _project(w, x, "wk", "bk").reshape(batch, length, kv_heads, head_dim)
            v = _project(w, x, "wv", "bv").reshape(batch, length, kv_heads, head_dim)
            o = jax.nn.dot_product_attention(
                q, k, v, is_causal=causal, implementation=implementation
            )
            return _project(w, o.reshape(batch, length, -1), "wo", "bo")

    else:
        import tensorflow as tf

        groups = heads // kv_heads

        def apply(params, x):
            w = dict(zip(names, params, strict=True))
            batch, length = tf.shape(x)[0], tf.shape(x)[1]
            q = tf.reshape(_project(w, x, "wq", "bq"), (batch, length, kv_heads, groups, head_dim))
            k = tf.reshape(_project(w, x, "wk", "bk"), (batch, length, kv_heads, head_dim))
            v = tf.reshape(_project(w, x, "wv", "bv"), (batch, length, kv_heads, head_dim))
            allowed = True
            if causal:
                allowed = tf.range(length)[None, :] <= tf.range(length)[:, None]
            o = _grouped_einsum_attention(q, k, v, allowed, scale)
            return _project(w, tf.reshape(o, (batch, length, heads * head_dim)), "wo", "bo")

    return apply, [weights[key] for key in names]


def reference_decode(weights, shape, prefill, max_length):
    """`(step, params, state)`: a hand-written cached decode step, K and V kept apart.

    `prefill` (B, context, features) fills positions 0..context-1 (untimed);
    `step(params, token, state, index)` writes the token's K/V at `index`, in
    place, and attends over positions 0..index.

    Example:
        >>> layer = GroupedQueryAttention(4, 2, causal=True); layer.build((None, None, 32))
        >>> x = keras.random.normal((1, 6, 32))
        >>> step, params, state = reference_decode(*reference_weights(layer), x, 64)
    """
    from keras import ops

    names = sorted(weights)
    heads, kv_heads, head_dim = shape["heads"], shape["kv_heads"], shape["head_dim"]
    groups, scale = heads // kv_heads, head_dim**-0.5
    w = dict(weights)
    batch, context, _ = prefill.shape
    prefill_k = ops.reshape(_project(w, prefill, "wk", "bk"), (batch, context, kv_heads, head_dim))
    prefill_v = ops.reshape(_project(w, prefill, "wv", "bv"), (batch, context, kv_heads, head_dim))
    padding = ((0, 0), (0, max_length - context), (0, 0), (0, 0))
    name = backend()

    if name == "torch":
        import torch.nn.functional as functional

        # (B, Hkv, S, D): SDPA's layout, so the attended prefix is a view.
        state = tuple(
            ops.pad(t, padding).transpose(1, 2).contiguous().detach()
            for t in (prefill_k, prefill_v)
        )

        def step(params, token, state, index):
            w = dict(zip(names, params, strict=True))
            k_cache, v_cache = state
            q = _project(w, token, "wq", "bq").view(batch, 1, heads, head_dim).transpose(1, 2)
            k = _project(w, token, "wk", "bk").view(batch, kv_heads, head_dim)
            v = _project(w, token, "wv", "bv").view(batch, kv_heads, head_dim)
            k_cache[:, :, index].copy_(k)
            v_cache[:, :, index].copy_(v)
            o = functional.scaled_dot_product_attention(
                q, k_cache[:, :, : index + 1], v_cache[:, :, : index + 1], enable_gqa=True
            )
            return _project(w, o.transpose(1, 2).reshape(batch, 1, -1), "wo", "bo"), state

        return step, [w[key] for key in names], state

    if name == "jax":
        from jax import lax

        state = (ops.pad(prefill_k, padding), ops.pad(prefill_v, padding))

        def step(params, token, state, index):
            w = dict(zip(names, params, strict=True))
            k_cache, v_cache = state
            q = _project(w, token, "wq", "bq").reshape(batch, 1, kv_heads, groups, head_dim)
            k = _project(w, token, "wk", "bk").reshape(batch, 1, kv_heads, head_dim)
            v = _project(w, token, "wv", "bv").reshape(batch, 1, kv_heads, head_dim)
            k_cache = lax.dynamic_update_slice(k_cache, k, (0, index, 0, 0))
            v_cache = lax.dynamic_update_slice(v_cache, v, (0, index, 0, 0))
            allowed = ops.arange(max_length)[None, :] <= index
            o = _grouped_einsum_attention(q, k_cache, v_cache, allowed, scale)
            return _project(w, o.reshape(batch, 1, -1), "wo", "bo"), (k_cache, v_cache)

        return step, [w[key] for key in names], state

    import tensorflow as tf
    from tensorflow.compiler.tf2xla.python import xla

    # Variables that XLA updates in place; the step reads them from here (a variable
    # returned from a tf.function would come back as a copy of its value).
    k_cache, v_cache = (
        tf.Variable(ops.pad(t, padding), trainable=False) for t in (prefill_k, prefill_v)
    )

    def step(params, token, state, index):
        w = dict(zip(names, params, strict=True))
        q = tf.reshape(_project(w, token, "wq", "bq"), (batch, 1, kv_heads, groups, head_dim))
        k = tf.reshape(_project(w, token, "wk", "bk"), (batch, 1, kv_heads, head_dim))
        v = tf.reshape(_project(w, token, "wv", "bv"), (batch, 1, kv_heads, head_dim))
        start = tf.stack([0, index, 0, 0])
        k_cache.assign(xla.dynamic_update_slice(k_cache, k, start))
        v_cache.assign(xla.dynamic_update_slice(v_cache, v, start))
        allowed = tf.range(max_length)[None, :] <= index
        o = _grouped_einsum_attention(q, k_cache, v_cache, allowed, scale)
        return _project(w, tf.reshape(o, (batch, 1, heads * head_dim)), "wo", "bo"), state

    return step, [w[key] for key in names], ()


# ---------------------------------------------------------------------------- peaks
def _best_seconds(run, budget_s=1.0, min_calls=3, max_calls=50):
    run()  # compile / warm up
    times, spent = [], 0.0
    while len(times) < min_calls or (spent < budget_s and len(times) < max_calls):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
        spent += times[-1]
    return min(times)


def matmul_peak(dtype: str, n: int | None = None) -> dict:
    """The best FLOP/s of an n x n matmul in `dtype` on the backend's device (n = 8192 on a GPU).

    Example:
        >>> matmul_peak("float32")["flops_per_s"] > 0  # doctest: +SKIP
        True
    """
    from keras import ops

    n = n or (1024 if device() == "cpu" else 8192)
    a = ops.cast(ops.ones((n, n)), dtype) / n
    b = ops.cast(ops.ones((n, n)), dtype)
    run = compile_call(lambda params, x: x @ params[0], training=False)
    seconds = _best_seconds(lambda: finish(run([b], a)))
    return {"n": n, "flops_per_s": 2 * n**3 / seconds}


def copy_bandwidth(mebibytes: int | None = None) -> dict:
    """Bytes read + written per second by `y = x + 1` over a float32 buffer (256 MiB; GPU 1 GiB).

    Example:
        >>> copy_bandwidth()["bytes_per_s"] > 0  # doctest: +SKIP
        True
    """
    from keras import ops

    size = (mebibytes or (256 if device() == "cpu" else 1024)) * 2**18  # float32 elements
    x = ops.zeros((size,), "float32")
    run = compile_call(lambda params, x: x + 1, training=False)
    seconds = _best_seconds(lambda: finish(run([], x)))
    return {"buffer_bytes": 4 * size, "bytes_per_s": 2 * 4 * size / seconds}
