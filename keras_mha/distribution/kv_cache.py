"""Sharding a KV cache along its KV heads, to sit next to head-parallel weights.

The cache from `GroupedQueryAttention.init_cache` is a `KVCache(key, value)`
pair of tensors the caller holds, each `(batch, num_key_value_heads,
max_length, head_dim)`, not layer variables, so no `LayoutMap` reaches them:
place both with `distribute_kv_cache` (`keras.distribution.distribute_tensor`
and the layout below). Split along the
same mesh axis as the weights, each device keeps exactly the keys and values
of the KV heads whose projections it holds, and writing a decode step into
the cache needs no communication.
"""

from __future__ import annotations

import keras

from keras_mha import backends
from keras_mha.backends.common.kv_cache import KVCache
from keras_mha.distribution.head_parallel import _mesh_axis_size

_BUFFER_RANK = 4  # (batch, num_key_value_heads, max_length, head_dim)


def kv_cache_layout(mesh, num_key_value_heads, model_axis="model", batch_axis=None):
    """The `TensorLayout` of each KV-cache buffer under head parallelism.

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
        `(batch_axis, model_axis or None, None, None)`, for the key and the
        value buffer alike.

    Raises:
        ValueError: an axis is not in `mesh`, or `num_key_value_heads`
            (other than 1) is not divisible by the size of `model_axis`.

    Example:
        >>> devices = [f"cpu:{i}" for i in range(8)]
        >>> mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), devices)
        >>> kv_cache_layout(mesh, num_key_value_heads=4, batch_axis="batch").axes
        ('batch', 'model', None, None)
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
    return keras.distribution.TensorLayout((batch_axis, heads_axis, None, None), device_mesh=mesh)


def distribute_kv_cache(cache, mesh, model_axis="model", batch_axis=None):
    """Place a KV cache on `mesh`, split along its KV heads (and batch).

    Use it on the cache from `layer.init_cache(...)` before decoding with a
    head-parallel layer, or inside a jitted decode step to pin the updated
    cache's layout (there it becomes a sharding constraint). JAX only, like
    `keras.distribution`'s model parallelism.

    Args:
        cache: the `KVCache(key, value)` from `init_cache` (or returned by
            the layer), each buffer `(batch, num_key_value_heads, max_length,
            head_dim)`.
        mesh: as in `kv_cache_layout`.
        model_axis: as in `kv_cache_layout`.
        batch_axis: as in `kv_cache_layout`.

    Returns:
        The cache, both buffers laid out on the mesh.

    Raises:
        ValueError: not on the JAX backend; `cache` is not a (key, value) pair
            of rank-4 buffers; a dimension is not divisible by the size of its
            mesh axis.

    Example:
        >>> layer = GroupedQueryAttention(num_heads=8, num_key_value_heads=4, head_dim=4)
        >>> layer.build((None, None, 16))
        >>> cache = layer.init_cache(batch_size=2, max_length=8)

        On JAX, with the (2, 4) `("batch", "model")` mesh of `kv_cache_layout`'s example:

        >>> cache = distribute_kv_cache(cache, mesh, batch_axis="batch")  # doctest: +SKIP
        >>> output, cache = layer(keras.ops.ones((2, 3, 16)), cache=cache, cache_index=0)
        >>> tuple(cache.key.shape)
        (2, 4, 8, 4)
    """
    if not backends.current().applies_layouts:
        raise ValueError(
            f"distribute_kv_cache needs the JAX backend (keras.distribution places tensors "
            f"on a mesh only there); the backend is {backends.name()!r}."
        )
    shapes = [tuple(getattr(part, "shape", ())) for part in cache] if _is_pair(cache) else None
    if shapes is None or any(len(shape) != _BUFFER_RANK for shape in shapes):
        received = shapes if shapes is not None else tuple(getattr(cache, "shape", ()))
        raise ValueError(
            "`cache` must be the (key, value) pair from `init_cache`, each (batch, "
            f"num_key_value_heads, max_length, head_dim); received {received}."
        )
    batch_size, num_key_value_heads = shapes[0][:2]
    if batch_axis is not None:
        batch_axis_size = _mesh_axis_size(mesh, batch_axis)
        if batch_size % batch_axis_size:
            raise ValueError(
                f"The cache's batch size {batch_size} is not divisible by the size "
                f"{batch_axis_size} of mesh axis {batch_axis!r}."
            )
    layout = kv_cache_layout(
        mesh, num_key_value_heads, model_axis=model_axis, batch_axis=batch_axis
    )
    return KVCache(*(keras.distribution.distribute_tensor(part, layout) for part in cache))


def _is_pair(cache):
    return isinstance(cache, (tuple, list)) and len(cache) == 2
