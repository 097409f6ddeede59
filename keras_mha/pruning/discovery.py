"""Finding the keras-mha attention layers inside any Keras model.

Layers are found through Keras's own layer tracking (`layer._layers`), so
functional, `Sequential`, nested and subclassed models all work, and so do
attention layers held inside custom layers. Each layer is named by the path of
layer names from the model down to it (`"encoder/block_0/attention"`). Keras's own
`layer.path` is the name scope the layer was *built* in, so a layer built before
it was placed in a model (as `keras_mha.models.build_attention` does) gets just
its name, and six such layers called `"attention"` would share one path.
"""

from __future__ import annotations

from keras_mha.layers import ATTENTION_LAYER_CLASSES


def find_attention_layers(model):
    """All keras-mha attention layers of `model`, as an ordered `{path: layer}` dict.

    The order is a depth-first walk of the layer tree in tracking order, which
    for the usual models is the order the layers are called in. A layer used in
    several places appears once, under its first path.

    Args:
        model: a Keras model or layer.

    Returns:
        `{path: layer}`; empty when the model has no keras-mha attention layer.

    Example:
        >>> inputs = keras.Input((8, 16))
        >>> outputs = MultiHeadAttention(4, name="attention")(inputs)
        >>> find_attention_layers(keras.Model(inputs, outputs))
        {'attention': <MultiHeadAttention name=attention, built=True>}
    """
    found = {}
    seen = set()

    def visit(layer, prefix):
        for child in getattr(layer, "_layers", ()):
            if id(child) in seen:
                continue
            seen.add(id(child))
            path = f"{prefix}/{child.name}" if prefix else child.name
            if isinstance(child, ATTENTION_LAYER_CLASSES):
                unique, suffix = path, 2
                while unique in found:  # Two sibling layers may share a user-given name.
                    unique, suffix = f"{path}#{suffix}", suffix + 1
                found[unique] = child
            visit(child, path)

    if isinstance(model, ATTENTION_LAYER_CLASSES):
        found[model.name] = model
    seen.add(id(model))
    visit(model, "")
    return found


def require_attention_layers(model, argument="model"):
    """`find_attention_layers(model)`, raising when there is none or one is unbuilt.

    Example:
        >>> require_attention_layers(keras.Sequential([keras.layers.Dense(2)]))
        Traceback (most recent call last):
        ...
        ValueError: `model` (Sequential ...) has no keras-mha attention layer; expected ...
    """
    layers = find_attention_layers(model)
    if not layers:
        raise ValueError(
            f"`{argument}` ({type(model).__name__} {getattr(model, 'name', '')!r}) has no "
            "keras-mha attention layer; expected a model containing "
            "keras_mha.layers.GroupedQueryAttention / MultiHeadAttention / MultiQueryAttention."
        )
    unbuilt = [path for path, layer in layers.items() if not layer.built]
    if unbuilt:
        raise ValueError(
            f"The attention layers {unbuilt} of `{argument}` are not built; call the model on "
            "data (or build it) first."
        )
    return layers
