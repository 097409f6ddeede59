"""KV-head conversion of one attention layer: identity, the pooling, the permutation, and
everything a converted layer must keep doing (gates, RoPE, q/k norms, biases, sliding
windows, the KV cache, `.keras` round trips)."""

import keras
import numpy as np
import pytest

from keras_mha.errors import PruningError
from keras_mha.layers import (
    GroupedQueryAttention,
    MultiHeadAttention,
    MultiQueryAttention,
    kv_conversion,
)

FEATURES, LENGTH = 16, 7
# Every feature a converted layer must keep: biases, RoPE, q/k norms, a window.
FULL_FEATURED = {
    "head_dim": 4,
    "use_bias": True,
    "causal": True,
    "sliding_window": 4,
    "use_rope": True,
    "use_qk_norm": True,
}


def _inputs(seed=0):
    return np.random.default_rng(seed).normal(size=(2, LENGTH, FEATURES)).astype("float32")


def _numpy(value):
    return keras.ops.convert_to_numpy(value)


def _randomised(layer, seed=1):
    """Every variable drawn at random (biases and norm scales are 0 / 1 otherwise)."""
    generator = np.random.default_rng(seed)
    for variable in layer.weights:
        if variable.name != "head_gates":
            variable.assign(generator.normal(scale=0.3, size=variable.shape).astype("float32"))
    return layer


def _assert_round_off(actual, expected):
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def _layer(layer_class=MultiHeadAttention, *args, **options):
    layer = layer_class(*args, **{**FULL_FEATURED, **options})
    layer.build((None, None, FEATURES))
    return _randomised(layer)


# The pooling and its checks are NumPy; only the permutation and the layer's use after
# conversion (cache, .keras) run on every backend.
numpy_only = pytest.mark.backend_independent


@numpy_only
@pytest.mark.parametrize("method", kv_conversion.METHODS)
def test_todays_count_is_the_identity_bit_for_bit(method):
    layer = _layer(GroupedQueryAttention, 8, 4)
    x = _inputs()
    before = _numpy(layer(x))
    variables = {v.path: (v, _numpy(v)) for v in layer.weights}
    assert layer.convert_kv_heads(4, method=method) == list(range(8))
    assert type(layer) is GroupedQueryAttention
    for path, (variable, value) in variables.items():
        current = {v.path: v for v in layer.weights}[path]
        assert current is variable and np.array_equal(_numpy(current), value)
    assert np.array_equal(_numpy(layer(x)), before)


@numpy_only
@pytest.mark.parametrize("method", ["mean", "first"])
def test_pooled_kv_heads_are_the_mean_or_first_of_each_group(method):
    layer = _layer(GroupedQueryAttention, 12, 6)
    before = {v.name: _numpy(v) for v in layer.weights}
    layer.convert_kv_heads(2, method=method)
    assert (type(layer), layer.num_heads, layer.num_key_value_heads) == (
        GroupedQueryAttention,
        12,
        2,
    )
    # KV head j of 2 now serves query heads 6j..6j+5, which used old KV heads 3j..3j+2.
    for name, axis in (("key_kernel", 1), ("value_kernel", 1), ("key_bias", 0), ("value_bias", 0)):
        old = np.moveaxis(before[name], axis, 0)
        groups = [old[0:3], old[3:6]]
        expected = np.stack(
            [g.astype("float64").mean(axis=0) if method == "mean" else g[0] for g in groups]
        )
        np.testing.assert_array_equal(
            np.moveaxis(_numpy(getattr(layer, name)), axis, 0), expected.astype("float32")
        )
    for name in ("query_kernel", "query_bias", "output_kernel", "output_bias", "head_gates"):
        np.testing.assert_array_equal(_numpy(getattr(layer, name)), before[name])
    for name in ("query_norm_scale", "key_norm_scale"):
        np.testing.assert_array_equal(_numpy(getattr(layer, name)), before[name])


GATES = np.array([1, 0.5, 0, 1, 2, 1, 0.25, 1], "float32")


def test_regroup_permutation_leaves_outputs_unchanged():
    layer = _layer(MultiHeadAttention, 8)
    layer.head_gates.assign(GATES)
    x = _inputs()
    before = _numpy(layer(x))
    order = kv_conversion.regroup_order(layer, 2)
    assert sorted(order) == list(range(8)) and order != list(range(8))
    queries = kv_conversion.permute_kv_heads(layer, order)
    assert queries == order  # MHA: every query head moves with its KV head
    _assert_round_off(_numpy(layer(x)), before)
    np.testing.assert_array_equal(_numpy(layer.head_gates), GATES[order])


def test_regroup_pairs_identical_heads_so_pooling_them_changes_nothing():
    # KV head h + 4 is KV head h again: `regroup` must pair the twins, after which the
    # mean is exact and the outputs stay the same; `mean` pools the layout's neighbours
    # (0, 1), (2, 3), ... and does change them.
    def twinned():
        layer = _layer(MultiHeadAttention, 8)
        for name in ("key_kernel", "value_kernel", "key_bias", "value_bias"):
            variable = getattr(layer, name)
            axis = 1 if "kernel" in name else 0
            value = np.moveaxis(_numpy(variable), axis, 0)
            value[4:] = value[:4]
            variable.assign(np.moveaxis(value, 0, axis))
        return layer

    x = _inputs()
    regrouped, plain = twinned(), twinned()
    before = _numpy(regrouped(x))
    twins = [0, 4, 1, 5, 2, 6, 3, 7]
    assert kv_conversion.regroup_order(regrouped, 4) == twins
    assert regrouped.convert_kv_heads(4, method="regroup") == twins
    _assert_round_off(_numpy(regrouped(x)), before)
    plain.convert_kv_heads(4, method="mean")
    assert np.abs(_numpy(plain(x)) - before).max() > 1e-2 * np.abs(before).max()


def test_converted_layer_keeps_its_cache_and_gates():
    layer = _layer(MultiHeadAttention, 8)
    layer.head_gates.assign(GATES)
    x = _inputs()
    layer.convert_kv_heads(1, method="regroup")
    assert type(layer) is MultiQueryAttention and tuple(layer.key_kernel.shape) == (FEATURES, 1, 4)
    full = _numpy(layer(x))

    # Decoding with the (8x smaller) cache gives the full forward pass, window included.
    cache = layer.init_cache(batch_size=2, max_length=LENGTH + 1)
    assert tuple(cache.key.shape) == (2, 1, LENGTH + 1, 4)
    prefill, cache = layer(x[:, :-1], cache=cache, cache_index=0)
    step, cache = layer(x[:, -1:], cache=cache, cache_index=LENGTH - 1)
    _assert_round_off(np.concatenate([_numpy(prefill), _numpy(step)], 1), full)

    # The gates still scale their own heads: folded into the output rows, same outputs.
    np.testing.assert_array_equal(_numpy(layer.head_gates), GATES)
    layer.output_kernel.assign(_numpy(layer.output_kernel) * GATES[:, None, None])
    layer.head_gates.assign(np.ones(8, "float32"))
    _assert_round_off(_numpy(layer(x)), full)


@numpy_only
def test_regroup_never_pools_further_apart_heads_than_the_layout():
    layer = _layer(MultiHeadAttention, 12)
    features = kv_conversion._kv_features(kv_conversion.head_variable_values(layer))

    def spread(order):
        groups = features[order].reshape(4, 3, -1)
        return float(((groups - groups.mean(axis=1, keepdims=True)) ** 2).sum())

    assert spread(kv_conversion.regroup_order(layer, 4)) < spread(list(range(12)))


@numpy_only
def test_converted_layers_save_and_load_as_their_new_class(tmp_path):
    x = _inputs()
    inputs = keras.Input((LENGTH, FEATURES))
    layers = [_layer(MultiHeadAttention, 8, name=f"attention_{i}") for i in range(2)]
    layers[0].convert_kv_heads(2)
    layers[1].head_gates.assign(GATES)
    layers[1].convert_kv_heads(1, method="regroup")
    assert [type(layer) for layer in layers] == [GroupedQueryAttention, MultiQueryAttention]
    assert layers[0].get_config()["num_key_value_heads"] == 2
    model = keras.Model(inputs, layers[1](layers[0](inputs)))
    output = _numpy(model(x))
    model.save(tmp_path / "converted.keras")
    loaded = keras.saving.load_model(tmp_path / "converted.keras")
    restored = [loaded.get_layer(f"attention_{i}") for i in range(2)]
    assert [(type(layer), layer.num_key_value_heads) for layer in restored] == [
        (GroupedQueryAttention, 2),
        (MultiQueryAttention, 1),
    ]
    np.testing.assert_array_equal(_numpy(restored[1].head_gates), _numpy(layers[1].head_gates))
    np.testing.assert_array_equal(_numpy(loaded(x)), output)


@numpy_only
@pytest.mark.parametrize(
    "count, method, mention",
    [
        (0, "mean", "expected 1 to 4"),
        (8, "mean", "cannot add any"),
        (3, "mean", "expected one of [1, 2, 4]"),
        (2.0, "mean", "not a number of KV heads"),
        (True, "mean", "not a number of KV heads"),
        (2, "median", "expected one of mean, first, regroup"),
    ],
)
def test_refusals_name_the_value_and_change_nothing(count, method, mention):
    layer = _layer(MultiHeadAttention, 4)
    before = [_numpy(v) for v in layer.weights]
    with pytest.raises(PruningError) as caught:
        layer.convert_kv_heads(count, method=method)
    assert mention in str(caught.value) and "\n" not in str(caught.value)
    assert type(layer) is MultiHeadAttention and layer.num_key_value_heads == 4
    for variable, value in zip(layer.weights, before, strict=True):
        np.testing.assert_array_equal(_numpy(variable), value)


@numpy_only
def test_unbuilt_layer_and_fixed_count_subclasses_are_refused():
    class Custom(MultiHeadAttention):
        pass

    layer = Custom(4, head_dim=4)
    layer.build((None, None, FEATURES))
    with pytest.raises(PruningError, match="subclass of MultiHeadAttention"):
        layer.convert_kv_heads(2)
    with pytest.raises(PruningError, match="not built"):
        GroupedQueryAttention(4, 2).convert_kv_heads(1)
    with pytest.raises(PruningError, match="is a Dense"):
        kv_conversion.check_kv_conversion(keras.layers.Dense(2), 1)
