"""Head-parallel sharding of keras-mha attention layers with `keras.distribution`.

Attention heads are independent until the output projection sums over them,
so splitting the heads across the devices of one mesh axis needs a single
reduction per layer (after the output projection) and nothing else: each
device projects, attends and gates its own heads. This module only writes the
`keras.distribution.LayoutMap` that says so; Keras and JAX do the rest when
the variables are created under `keras.distribution.ModelParallel`.

Which variable is split along which axis (`H` query heads, `Hkv` KV heads,
`D` head size, `F` features):

| variable                                  | shape          | split along            |
|-------------------------------------------|----------------|------------------------|
| `query_kernel`                            | `(F, H, D)`    | `H`                    |
| `query_bias`                              | `(H, D)`       | `H`                    |
| `key_kernel`, `value_kernel`              | `(F, Hkv, D)`  | `Hkv` (MQA: replicated)|
| `key_bias`, `value_bias`                  | `(Hkv, D)`     | `Hkv` (MQA: replicated)|
| `output_kernel`                           | `(H, D, F_out)`| `H`                    |
| `head_gates`                              | `(H,)`         | `H`                    |
| `output_bias`, `query_norm_scale`, `key_norm_scale` | `(F_out,)`, `(D,)` | replicated  |

Query head `h` reads KV head `h // (H // Hkv)`, so splitting both head axes
into the same number of contiguous blocks hands every device whole groups:
the KV heads it holds and exactly the query heads that read them.
"""

from __future__ import annotations

import re
import warnings

import keras

from keras_mha import backends

# Variable name -> which head axis of it is split: "query" (H), "key_value"
# (Hkv) or None (replicated). The position in the tuple is the variable's axis.
_HEAD_AXES = {
    "query_kernel": (None, "query", None),
    "query_bias": ("query", None),
    "key_kernel": (None, "key_value", None),
    "key_bias": ("key_value", None),
    "value_kernel": (None, "key_value", None),
    "value_bias": ("key_value", None),
    "output_kernel": ("query", None, None),
    "output_bias": (None,),
    "head_gates": ("query",),
    "query_norm_scale": (None,),
    "key_norm_scale": (None,),
}

# Matches any parent path: a layer's variables are named
# "<ancestor>/.../<layer name>/<variable>", and which ancestors appear depends
# on how the model was built (a functional model does not prefix its name).
_ANY_PARENTS = "(?:.*/)?"


def _mesh_axis_size(mesh, model_axis):
    if not isinstance(mesh, keras.distribution.DeviceMesh):
        raise TypeError(
            f"`mesh` must be a keras.distribution.DeviceMesh; received {type(mesh).__name__}."
        )
    if model_axis not in mesh.axis_names:
        raise ValueError(
            f"`model_axis`={model_axis!r} is not an axis of the mesh; its axes are "
            f"{tuple(mesh.axis_names)}."
        )
    return int(mesh.shape[list(mesh.axis_names).index(model_axis)])


def _attention_layers(model):
    """Every keras-mha attention layer in `model` (a layer, a model or an iterable of them)."""
    from keras_mha.layers import ATTENTION_LAYER_CLASSES

    roots = [model] if isinstance(model, keras.layers.Layer) else list(model)
    found, seen = [], set()
    for root in roots:
        if not isinstance(root, keras.layers.Layer):
            raise TypeError(
                "`model` must be a keras Layer or Model, or an iterable of them; it holds "
                f"a {type(root).__name__}."
            )
        # `_flatten_layers` walks sublayers before they are built, which is
        # when the map is needed: variables take their layout when created.
        for layer in root._flatten_layers(include_self=True, recursive=True):
            if isinstance(layer, ATTENTION_LAYER_CLASSES) and id(layer) not in seen:
                seen.add(id(layer))
                found.append(layer)
    if not found:
        raise ValueError(
            "`model` holds no keras-mha attention layer (GroupedQueryAttention, "
            "MultiHeadAttention, MultiQueryAttention), so there is nothing to shard by heads."
        )
    return found


def _key_value_heads_are_split(layer, axis_size, model_axis):
    """Check divisibility; True when KV heads are split, False when replicated (MQA)."""
    num_heads, num_kv_heads = layer.num_heads, layer.num_key_value_heads
    if num_heads % axis_size:
        raise ValueError(
            f"Layer {layer.name!r}: num_heads={num_heads} is not divisible by the size "
            f"{axis_size} of mesh axis {model_axis!r}; head-parallel sharding gives every "
            "device the same number of whole query heads."
        )
    if num_kv_heads == 1:
        return False  # Multi-query: every device needs the single KV head.
    if num_kv_heads % axis_size:
        raise ValueError(
            f"Layer {layer.name!r}: num_key_value_heads={num_kv_heads} is not divisible by "
            f"the size {axis_size} of mesh axis {model_axis!r}; every device must hold whole "
            f"KV groups (one KV head and its {num_heads // num_kv_heads} query heads). Use a "
            f"{model_axis!r} axis whose size divides {num_kv_heads}."
        )
    return True


def head_parallel_axes(layer, mesh, model_axis="model"):
    """The mesh axes of every variable of one attention layer under head parallelism.

    Validates the head counts against the size of `model_axis` (see
    `head_parallel_layout_map`) and returns `{variable name: axes}`, each
    `axes` a tuple with one entry per dimension of the variable: `model_axis`
    where that dimension is split, None where it is not.

    Example:
        >>> devices = [f"cpu:{i}" for i in range(4)]
        >>> mesh = keras.distribution.DeviceMesh((4,), ("model",), devices)
        >>> layer = GroupedQueryAttention(num_heads=8, num_key_value_heads=4)
        >>> head_parallel_axes(layer, mesh)["key_kernel"]
        (None, 'model', None)
        >>> head_parallel_axes(MultiQueryAttention(num_heads=8), mesh)["key_kernel"]
        (None, None, None)
    """
    axis_size = _mesh_axis_size(mesh, model_axis)
    split_key_value = _key_value_heads_are_split(layer, axis_size, model_axis)
    mesh_axis_for = {"query": model_axis, "key_value": model_axis if split_key_value else None}
    return {
        name: tuple(mesh_axis_for.get(axis) for axis in axes) for name, axes in _HEAD_AXES.items()
    }


def _warn_if_not_jax():
    if not backends.current().applies_layouts:
        warnings.warn(
            f"Keras applies a LayoutMap to variables only on the JAX backend; on "
            f"{backends.name()!r} "
            "keras.distribution.ModelParallel leaves every variable on one device.",
            stacklevel=3,
        )


def head_parallel_layout_map(mesh, model_axis="model", model=None, layout_map=None):
    """A `keras.distribution.LayoutMap` that splits keras-mha attention by heads.

    Query heads are split across the devices of `model_axis`, and so are the
    KV heads, into matching contiguous blocks, so each device holds whole
    groups: some KV heads and exactly the query heads that read them. A
    multi-query layer's single KV head is replicated instead. The output
    projection is split along its input heads, the head gates along heads,
    and the output bias and q/k norm scales are replicated. Other mesh axes
    (such as a `"batch"` axis for data parallelism) are left to the
    distribution: variables are replicated along them.

    Layouts take effect when variables are created: build the model inside
    `keras.distribution.ModelParallel(layout_map=..., batch_dim_name=...)`
    (its `scope()`, or `keras.distribution.set_distribution`). Only the JAX
    backend applies them; elsewhere this warns.

    Args:
        mesh: a `keras.distribution.DeviceMesh`.
        model_axis: name of the mesh axis to split the heads along.
        model: the keras-mha attention layers to shard: a layer or model
            (searched recursively) or an iterable of them. Only each layer's
            name and head counts are read, which exist before the layer is
            built, so pass the unbuilt model (or the layers before they are
            called). With it, every head count is checked against the size of
            `model_axis`, and the keys are per layer:
            `(?:.*/)?<layer name>/<variable name>`. Layers that share a name
            must share a layout.
            Without it (None), the map has one key per variable name,
            `(?:.*/)?query_kernel` and so on, that matches every keras-mha
            attention layer and splits KV heads too: nothing is checked
            here, a multi-query layer or a head count that the axis does not
            divide fails when JAX creates the variable (its error names
            the shape, not the layer), and multi-query layers are not
            recognised. Pass `model` unless every layer has a number of KV
            heads divisible by the axis size.
        layout_map: an existing `LayoutMap` on the same mesh to add the keys
            to (for example one that already shards embeddings or MLPs);
            default a new one.

    Returns:
        The `LayoutMap`.

    Raises:
        ValueError: `model_axis` is not an axis of `mesh`; `num_heads` or
            `num_key_value_heads` (other than 1) of a layer is not divisible
            by the size of `model_axis`; two layers share a name but need
            different layouts; `model` holds no keras-mha attention layer.

    Example:
        >>> devices = [f"cpu:{i}" for i in range(8)]  # keras.distribution.list_devices()
        >>> mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), devices)
        >>> attention = GroupedQueryAttention(num_heads=8, num_key_value_heads=4, name="attn")
        >>> layout_map = head_parallel_layout_map(mesh, "model", model=attention)
        >>> layout_map["attn/key_kernel"].axes
        (None, 'model', None)

        On 8 devices, the variables created under the distribution are split:

        >>> distribution = keras.distribution.ModelParallel(
        ...     layout_map=layout_map, batch_dim_name="batch")  # doctest: +SKIP
        >>> with distribution.scope():  # doctest: +SKIP
        ...     inputs = keras.Input((16, 64))
        ...     model = keras.Model(inputs, attention(inputs))
        >>> tuple(attention.key_kernel.value.sharding.spec)  # doctest: +SKIP
        (None, 'model', None)
    """
    axis_size = _mesh_axis_size(mesh, model_axis)
    if layout_map is None:
        layout_map = keras.distribution.LayoutMap(mesh)
    elif not isinstance(layout_map, keras.distribution.LayoutMap):
        raise TypeError(
            "`layout_map` must be a keras.distribution.LayoutMap or None; received "
            f"{type(layout_map).__name__}."
        )
    elif layout_map.device_mesh is not mesh:
        raise ValueError(
            f"`layout_map` is on mesh {layout_map.device_mesh}, not on `mesh`={mesh}; "
            "a ModelParallel distribution uses a single mesh."
        )
    _warn_if_not_jax()

    if model is None:
        for name, axes in _HEAD_AXES.items():
            layout_map[_ANY_PARENTS + name] = tuple(
                model_axis if axis is not None else None for axis in axes
            )
        return layout_map

    axes_by_layer_name, layer_by_name = {}, {}
    for layer in _attention_layers(model):
        axes = head_parallel_axes(layer, mesh, model_axis)
        previous = axes_by_layer_name.setdefault(layer.name, axes)
        if previous != axes:
            raise ValueError(
                f"Two attention layers are named {layer.name!r} but need different layouts "
                f"({layer_by_name[layer.name].num_key_value_heads} and "
                f"{layer.num_key_value_heads} KV heads on a {model_axis!r} axis of size "
                f"{axis_size}); the layout map tells layers apart by name, so give them "
                "distinct names."
            )
        layer_by_name[layer.name] = layer
    for layer_name, axes in axes_by_layer_name.items():
        prefix = _ANY_PARENTS + re.escape(layer_name) + "/"
        for variable_name, variable_axes in axes.items():
            layout_map[prefix + variable_name] = variable_axes
    return layout_map
