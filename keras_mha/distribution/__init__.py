"""Run keras-mha attention across devices with `keras.distribution` (JAX).

`head_parallel_layout_map` writes the `LayoutMap` that splits every attention
layer by heads (whole KV groups per device); `ModelParallel` applies it when
the variables are created, on a 1-D `("model",)` mesh or, with data
parallelism, a 2-D `("batch", "model")` mesh. `distribute_kv_cache` places a
decoding cache to match.

Example:
    >>> import keras
    >>> from keras_mha.distribution import head_parallel_layout_map
    >>> devices = [f"cpu:{i}" for i in range(8)]  # keras.distribution.list_devices()
    >>> mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), devices)
    >>> attention = GroupedQueryAttention(8, 4, name="attention")
    >>> layout_map = head_parallel_layout_map(mesh, "model", model=attention)
    >>> layout_map["attention/key_kernel"].axes
    (None, 'model', None)

    On 8 devices, build and compile the model under the distribution:

    >>> distribution = keras.distribution.ModelParallel(
    ...     layout_map=layout_map, batch_dim_name="batch")  # doctest: +SKIP
    >>> with distribution.scope():  # doctest: +SKIP
    ...     inputs = keras.Input((16, 64))
    ...     model = keras.Model(inputs, attention(inputs))
"""

from keras_mha.distribution.head_parallel import head_parallel_axes, head_parallel_layout_map
from keras_mha.distribution.kv_cache import distribute_kv_cache, kv_cache_layout

__all__ = [
    "distribute_kv_cache",
    "head_parallel_axes",
    "head_parallel_layout_map",
    "kv_cache_layout",
]
