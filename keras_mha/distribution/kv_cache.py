"""Sharding a KV cache along its KV heads, to sit next to head-parallel weights.

The cache from `GroupedQueryAttention.init_cache` is a plain tensor the caller
holds, `(batch, 2, max_length, num_key_value_heads, head_dim)`, not a layer
variable, so no `LayoutMap` reaches it: place it with
`keras.distribution.distribute_tensor` and the layout below. Split along the
same mesh axis as the weights, each device keeps exactly the keys and values
of the KV heads whose projections it holds, and writing a decode step into
the cache needs no communication.
"""

from __future__ import annotations

import keras

from keras_mha.distribution.head_parallel import _mesh_axis_size

_CACHE_RANK = 5  # (batch, 2, max_length, num_key_value_heads, head_dim)


def kv_cache_layout(mesh, num_key_value_heads, model_axis="model", batch_axis=None):
    """The `TensorLayout` of a KV cache under head parallelism.

    The KV-head dimension is split along `model_axis` (replicated when
    `num_key_value_heads` is 1, multi-query), and the batch dimension along
    `batch_axis` when given (data parallelism).

    Args:
        mesh: a `keras.distribution.DeviceMesh`.
        num_key_value_heads: the layer's `num_key_value_heads`.
        model_axis: mesh axis the heads are split along, as in
            `head_parallel_layout_map`; None keeps the heads whole.
        batch_axis: mesh axis the batch is split along, or None.

    Returns:
        A `keras.distribution.TensorLayout` with axes
        `(batch_axis, None, None, model_axis or None, None)`.

    Raises:
        ValueError: an axis is not in `mesh`, or `num_key_value_heads`
            (other than 1) is not divisible by the size of `model_axis`.

    Example:
        >>> devices = [f"cpu:{i}" for i in range(8)]
        >>> mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), devices)
        >>> kv_cache_layout(mesh, num_key_value_heads=4, batch_axis="batch").axes
        ('batch', None, None, 'model', None)
    """
    heads_axis = None
    if model_axis is not None:
        axis_size = _mesh_axis_size(mesh, model_axis)
        if num_key_value_heads != 1:
            if num_key_value_heads % axis_size:
                raise ValueError(
                    f"num_key_value_heads={num_key_value_heads} is not divisible by the size "
                    f"{axis_size} of mesh axis {model_axis!r}; the cache is split by whole KV "
                    "heads."
                )
            heads_axis = model_axis
    if batch_axis is not None:
        _mesh_axis_size(mesh, batch_axis)
    return keras.distribution.TensorLayout(
        (batch_axis, None, None, heads_axis, None), device_mesh=mesh
    )


def distribute_kv_cache(cache, mesh, model_axis="model", batch_axis=None):
    """Place a KV cache on `mesh`, split along its KV heads (and batch).

    Use it on the cache from `layer.init_cache(...)` before decoding with a
    head-parallel layer, or inside a jitted decode step to pin the updated
    cache's layout (there it becomes a sharding constraint). JAX only, like
    `keras.distribution`'s model parallelism.

    Args:
        cache: `(batch, 2, max_length, num_key_value_heads, head_dim)`.
        mesh, model_axis, batch_axis: as in `kv_cache_layout`.

    Returns:
        The cache, laid out on the mesh.

    Raises:
        ValueError: not on the JAX backend; `cache` does not have rank 5; a
            dimension is not divisible by the size of its mesh axis.

    Example:
        >>> cache = layer.init_cache(batch_size=4, max_length=128)
        >>> cache = distribute_kv_cache(cache, mesh, batch_axis="batch")
        >>> output, cache = layer(tokens, cache=cache, cache_index=0)
    """
    backend = keras.backend.backend()
    if backend != "jax":
        raise ValueError(
            f"distribute_kv_cache needs the JAX backend (keras.distribution places tensors "
            f"on a mesh only there); the backend is {backend!r}."
        )
    shape = tuple(cache.shape)
    if len(shape) != _CACHE_RANK or shape[1] != 2:
        raise ValueError(
            "`cache` must have shape (batch, 2, max_length, num_key_value_heads, head_dim); "
            f"received {shape}."
        )
    if batch_axis is not None:
        batch_axis_size = _mesh_axis_size(mesh, batch_axis)
        if shape[0] % batch_axis_size:
            raise ValueError(
                f"The cache's batch size {shape[0]} is not divisible by the size "
                f"{batch_axis_size} of mesh axis {batch_axis!r}."
            )
    layout = kv_cache_layout(mesh, shape[3], model_axis=model_axis, batch_axis=batch_axis)
    return keras.distribution.distribute_tensor(cache, layout)
