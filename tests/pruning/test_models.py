"""Small models for the pruning tests, and the discovery of their attention layers.

Every kind of model the pruning tools must see through: functional, Sequential,
nested models, subclassed models, and attention layers inside custom layers.
"""

import keras
import numpy as np
import pytest

from keras_mha.layers import GroupedQueryAttention, MultiHeadAttention, MultiQueryAttention
from keras_mha.pruning import find_attention_layers, get_head_gates, prune_heads, set_head_gates

SEQUENCE_LENGTH = 6
FEATURES = 16
NUM_CLASSES = 3


@keras.saving.register_keras_serializable(package="keras_mha_tests")
class Block(keras.layers.Layer):
    """A post-norm transformer block whose attention layer is an attribute."""

    def __init__(self, attention, **kwargs):
        super().__init__(**kwargs)
        self.attention = attention
        self.norm = keras.layers.LayerNormalization(name="norm")

    def build(self, input_shape):
        # A deserialised attention layer arrives built (with its pruned shape).
        if not self.attention.built:
            self.attention.build(input_shape)
        self.norm.build(input_shape)

    def call(self, x):
        return self.norm(x + self.attention(x))

    def get_config(self):
        config = super().get_config()
        config["attention"] = keras.saving.serialize_keras_object(self.attention)
        return config

    @classmethod
    def from_config(cls, config):
        config["attention"] = keras.saving.deserialize_keras_object(config["attention"])
        return cls(**config)


def _head(x):
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
    return keras.layers.Dense(NUM_CLASSES, name="classifier")(x)


def functional_model():
    """MHA (4 heads) then GQA (4 query heads, 2 KV heads), as a classifier."""
    inputs = keras.Input((SEQUENCE_LENGTH, FEATURES))
    x = MultiHeadAttention(4, name="mha")(inputs)
    x = GroupedQueryAttention(4, 2, name="gqa")(x)
    return keras.Model(inputs, _head(x), name="functional")


def block_model():
    """Attention inside custom layers: Block(MHA 4), Block(GQA 4/2), Block(MQA 4)."""
    inputs = keras.Input((SEQUENCE_LENGTH, FEATURES))
    x = Block(MultiHeadAttention(4, name="attention"), name="block_0")(inputs)
    x = Block(GroupedQueryAttention(4, 2, name="attention"), name="block_1")(x)
    x = Block(MultiQueryAttention(4, name="attention"), name="block_2")(x)
    return keras.Model(inputs, _head(x), name="blocks")


def nested_model():
    """A Sequential encoder holding a Block, used inside a functional model."""
    encoder = keras.Sequential(
        [
            keras.Input((SEQUENCE_LENGTH, FEATURES)),
            Block(MultiHeadAttention(4, name="attention"), name="block"),
            GroupedQueryAttention(8, 2, head_dim=4, name="gqa"),
        ],
        name="encoder",
    )
    inputs = keras.Input((SEQUENCE_LENGTH, FEATURES))
    return keras.Model(inputs, _head(encoder(inputs)), name="nested")


class Subclassed(keras.Model):
    """A subclassed model keeping its blocks in a list."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.blocks = [
            Block(MultiHeadAttention(4, name="attention"), name="block_0"),
            Block(GroupedQueryAttention(4, 2, name="attention"), name="block_1"),
        ]
        self.pool = keras.layers.GlobalAveragePooling1D()
        self.classifier = keras.layers.Dense(NUM_CLASSES)

    def call(self, x):
        for block in self.blocks:
            x = block(x)
        return self.classifier(self.pool(x))


def subclassed_model():
    model = Subclassed(name="subclassed")
    model(np.zeros((1, SEQUENCE_LENGTH, FEATURES), "float32"))
    return model


BUILDERS = {
    "functional": functional_model,
    "blocks": block_model,
    "nested": nested_model,
    "subclassed": subclassed_model,
}

EXPECTED_PATHS = {
    "functional": ["mha", "gqa"],
    "blocks": ["block_0/attention", "block_1/attention", "block_2/attention"],
    "nested": ["encoder/block/attention", "encoder/gqa"],
    "subclassed": ["block_0/attention", "block_1/attention"],
}


def classification_data(num_examples=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_examples, SEQUENCE_LENGTH, FEATURES)).astype("float32")
    y = rng.integers(0, NUM_CLASSES, num_examples)
    return x, y


def compiled(model, optimizer="adam"):
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def all_variables(model):
    """Copies of every variable of the model, for 'left untouched' checks."""
    return [np.array(keras.ops.convert_to_numpy(v)) for v in model.variables]


def assert_untouched(model, before):
    after = all_variables(model)
    assert len(after) == len(before)
    for old, new in zip(before, after, strict=True):
        np.testing.assert_array_equal(old, new)


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_find_attention_layers_sees_through_every_model_kind(kind):
    keras.utils.set_random_seed(0)
    model = BUILDERS[kind]()
    layers = find_attention_layers(model)
    assert list(layers) == EXPECTED_PATHS[kind]
    for layer in layers.values():
        assert isinstance(layer, GroupedQueryAttention)
    assert {id(layer) for layer in layers.values()} == {
        id(layer) for layer in model._flatten_layers() if isinstance(layer, GroupedQueryAttention)
    }


def test_paths_are_stable_after_physical_pruning():
    keras.utils.set_random_seed(0)
    model = nested_model()
    set_head_gates(model, {"encoder/gqa": [0, 0, 0, 0, 1, 1, 1, 1]})
    prune_heads(model)
    layers = find_attention_layers(model)
    assert list(layers) == EXPECTED_PATHS["nested"]
    assert layers["encoder/gqa"].num_heads == 4


def test_a_layer_used_twice_is_listed_once():
    shared = MultiHeadAttention(2, name="shared")
    inputs = keras.Input((SEQUENCE_LENGTH, FEATURES))
    model = keras.Model(inputs, shared(shared(inputs)))
    assert list(find_attention_layers(model)) == ["shared"]


def test_sibling_layers_with_the_same_name_get_distinct_paths():
    class TwoBlocks(keras.Model):
        def __init__(self):
            super().__init__()
            self.first = Block(MultiHeadAttention(2, name="attention"), name="block")
            self.second = Block(MultiHeadAttention(2, name="attention"), name="block")

        def call(self, x):
            return self.second(self.first(x))

    model = TwoBlocks()
    model(np.zeros((1, SEQUENCE_LENGTH, FEATURES), "float32"))
    assert list(find_attention_layers(model)) == ["block/attention", "block/attention#2"]


def test_set_head_gates_checks_everything_before_writing():
    model = functional_model()
    with pytest.raises(ValueError, match=r"`gates\['gqa'\]` has shape \(3,\); expected \(4,\)"):
        set_head_gates(model, {"mha": [0, 1, 1, 1], "gqa": [1, 1, 1]})
    with pytest.raises(ValueError, match="names the layer 'nope'"):
        set_head_gates(model, {"nope": [1]})
    gates = get_head_gates(model)
    assert all((values == 1).all() for values in gates.values())
    set_head_gates(model, {"mha": [0, 1, 1, 1]})
    np.testing.assert_array_equal(get_head_gates(model)["mha"], [0, 1, 1, 1])


def test_model_without_attention_layers_is_refused():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)], name="dense_only")
    assert find_attention_layers(model) == {}
    with pytest.raises(
        ValueError, match="`model` .*'dense_only'.* has no keras-mha attention layer"
    ):
        get_head_gates(model)
