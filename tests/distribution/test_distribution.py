"""Head-parallel sharding with `keras.distribution` (`keras_mha.distribution`).

Two kinds of tests:

- The layout map itself (keys, mesh axes, validation errors) is made of plain
  Keras objects; those tests run in this process on every backend, with a
  mesh named over device strings that no backend has to provide.
- Real sharding needs JAX with 8 devices, and JAX fixes its device count when
  imported, so `tests/distribution/checks.py` runs in a fresh process with
  `XLA_FLAGS=--xla_force_host_platform_device_count=8` and prints what it
  measured as JSON; the tests below assert on it (JAX leg only).
"""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import keras
import pytest

from keras_mha.distribution import (
    distribute_kv_cache,
    head_parallel_axes,
    head_parallel_layout_map,
    kv_cache_layout,
)
from keras_mha.layers import GroupedQueryAttention, MultiHeadAttention, MultiQueryAttention

JAX_ONLY = pytest.mark.skipif(
    keras.backend.backend() != "jax",
    reason="keras.distribution model parallelism is implemented for JAX only",
)
CHECKS_SCRIPT = Path(__file__).with_name("checks.py")
CHECKS_TIMEOUT_SECONDS = 300

# Written out by hand (not computed by the code under test): the mesh axes of
# each variable of a layer whose KV heads are split, and of a multi-query one.
SPLIT_KV_AXES = {
    "query_kernel": [None, "model", None],
    "query_bias": ["model", None],
    "key_kernel": [None, "model", None],
    "key_bias": ["model", None],
    "value_kernel": [None, "model", None],
    "value_bias": ["model", None],
    "output_kernel": ["model", None, None],
    "output_bias": [None],
    "head_gates": ["model"],
    "query_norm_scale": [None],
    "key_norm_scale": [None],
}
MULTI_QUERY_AXES = {
    **SPLIT_KV_AXES,
    "key_kernel": [None, None, None],
    "key_bias": [None, None],
    "value_kernel": [None, None, None],
    "value_bias": [None, None],
}


def _mesh(shape=(2, 4), axis_names=("batch", "model")):
    count = 1
    for size in shape:
        count *= size
    return keras.distribution.DeviceMesh(shape, axis_names, [f"cpu:{i}" for i in range(count)])


def _axes(layout_map, path):
    layout = layout_map[path]
    return None if layout is None else list(layout.axes)


@pytest.fixture(autouse=True)
def _no_backend_warning():
    # On torch/TensorFlow the map is built but Keras will not apply it; that
    # warning has its own test.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Keras applies a LayoutMap")
        yield


class TestLayoutMap:
    @pytest.mark.parametrize(
        "layer, expected",
        [
            (GroupedQueryAttention(8, 4, name="attention"), SPLIT_KV_AXES),
            (MultiHeadAttention(4, name="attention"), SPLIT_KV_AXES),
            (MultiQueryAttention(8, name="attention"), MULTI_QUERY_AXES),
        ],
        ids=["gqa", "mha", "mqa"],
    )
    def test_every_variable_gets_its_axes(self, layer, expected):
        layout_map = head_parallel_layout_map(_mesh(), "model", model=layer)
        for name, axes in expected.items():
            # Paths as a functional model and as nested subclassed layers name them.
            assert _axes(layout_map, f"attention/{name}") == axes, name
            assert _axes(layout_map, f"model/block_0/attention/{name}") == axes, name
        assert head_parallel_axes(layer, _mesh())["key_kernel"] == tuple(expected["key_kernel"])

    def test_keys_match_only_the_named_layer(self):
        layout_map = head_parallel_layout_map(
            _mesh(), "model", model=GroupedQueryAttention(8, 4, name="attn")
        )
        assert _axes(layout_map, "attn/query_kernel") == [None, "model", None]
        for other in ("my_attn/query_kernel", "attn_1/query_kernel", "attn/dense/kernel"):
            assert layout_map[other] is None, other

    def test_one_map_for_layers_of_different_kinds(self):
        layers = [GroupedQueryAttention(8, 4, name="gqa"), MultiQueryAttention(4, name="mqa")]
        layout_map = head_parallel_layout_map(_mesh(), "model", model=layers)
        assert _axes(layout_map, "gqa/key_kernel") == [None, "model", None]
        assert _axes(layout_map, "mqa/key_kernel") == [None, None, None]
        assert _axes(layout_map, "mqa/query_kernel") == [None, "model", None]

    def test_finds_layers_inside_an_unbuilt_subclassed_model(self):
        class Blocks(keras.Model):
            def __init__(self):
                super().__init__()
                # Same name, same layout in every block: one set of keys.
                self.blocks = [GroupedQueryAttention(8, 4, name="attention") for _ in range(3)]
                self.mqa = MultiQueryAttention(4, name="mqa")

        model = Blocks()
        assert not model.built
        layout_map = head_parallel_layout_map(_mesh(), "model", model=model)
        assert _axes(layout_map, "blocks/attention/value_bias") == ["model", None]
        assert _axes(layout_map, "blocks/mqa/value_bias") == [None, None]
        assert len(layout_map) == 2 * len(SPLIT_KV_AXES)

    def test_without_model_one_generic_key_per_variable(self):
        layout_map = head_parallel_layout_map(_mesh(), "model")
        assert len(layout_map) == len(SPLIT_KV_AXES)
        for name, axes in SPLIT_KV_AXES.items():
            assert _axes(layout_map, f"any/layer/{name}") == axes
            assert _axes(layout_map, name) == axes
        assert layout_map["dense/kernel"] is None

    def test_adds_to_an_existing_map(self):
        mesh = _mesh()
        layout_map = keras.distribution.LayoutMap(mesh)
        layout_map["embedding/embeddings"] = (None, "model")
        result = head_parallel_layout_map(
            mesh, "model", model=GroupedQueryAttention(8, 4, name="a"), layout_map=layout_map
        )
        assert result is layout_map
        assert _axes(layout_map, "embedding/embeddings") == [None, "model"]
        assert _axes(layout_map, "a/output_kernel") == ["model", None, None]

    def test_a_size_one_model_axis_splits_nothing_and_accepts_any_head_count(self):
        mesh = _mesh((8, 1))
        layout_map = head_parallel_layout_map(
            mesh, "model", model=GroupedQueryAttention(6, 3, name="a")
        )
        assert layout_map["a/key_kernel"].device_mesh is mesh

    def test_warns_that_other_backends_ignore_it(self):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            head_parallel_layout_map(_mesh(), "model")
        messages = [str(w.message) for w in caught if "LayoutMap" in str(w.message)]
        if keras.backend.backend() == "jax":
            assert messages == []
        else:
            assert len(messages) == 1 and keras.backend.backend() in messages[0]


class TestLayoutMapErrors:
    def test_query_heads_not_divisible_names_both_numbers(self):
        with pytest.raises(ValueError, match=r"'odd': num_heads=6 .* size 4 of mesh axis 'model'"):
            head_parallel_layout_map(_mesh(), "model", model=MultiHeadAttention(6, name="odd"))

    def test_key_value_heads_not_divisible_names_both_numbers(self):
        # 8 query heads divide 4 devices, but 2 KV groups cannot be split 4 ways.
        with pytest.raises(
            ValueError, match=r"num_key_value_heads=2 .* size 4 of mesh axis 'model'"
        ):
            head_parallel_layout_map(_mesh(), "model", model=GroupedQueryAttention(8, 2))

    def test_multi_query_still_needs_divisible_query_heads(self):
        with pytest.raises(ValueError, match=r"num_heads=2 .* size 4"):
            head_parallel_layout_map(_mesh(), "model", model=MultiQueryAttention(2))

    def test_same_name_different_layouts(self):
        layers = [
            GroupedQueryAttention(8, 4, name="attention"),
            MultiQueryAttention(8, name="attention"),
        ]
        with pytest.raises(ValueError, match="Two attention layers are named 'attention'"):
            head_parallel_layout_map(_mesh(), "model", model=layers)

    def test_unknown_mesh_axis(self):
        with pytest.raises(ValueError, match=r"`model_axis`='heads' .*\('batch', 'model'\)"):
            head_parallel_layout_map(_mesh(), "heads")

    def test_mesh_must_be_a_device_mesh(self):
        with pytest.raises(TypeError, match="DeviceMesh; received tuple"):
            head_parallel_layout_map((2, 4), "model")

    def test_model_without_attention_layers(self):
        with pytest.raises(ValueError, match="no keras-mha attention layer"):
            head_parallel_layout_map(_mesh(), "model", model=keras.layers.Dense(4))

    def test_layout_map_on_another_mesh(self):
        other = keras.distribution.LayoutMap(_mesh())
        with pytest.raises(ValueError, match="`layout_map` is on mesh"):
            head_parallel_layout_map(_mesh(), "model", layout_map=other)


class TestKVCacheLayout:
    def test_split_along_kv_heads_and_batch(self):
        layout = kv_cache_layout(_mesh(), num_key_value_heads=4, batch_axis="batch")
        assert layout.axes == ("batch", "model", None, None)

    def test_multi_query_cache_is_replicated(self):
        assert kv_cache_layout(_mesh(), num_key_value_heads=1).axes == (None,) * 4

    def test_not_divisible(self):
        with pytest.raises(ValueError, match=r"num_key_value_heads=2 .* size 4 of mesh axis"):
            kv_cache_layout(_mesh(), num_key_value_heads=2)

    def test_unknown_batch_axis(self):
        with pytest.raises(ValueError, match="'data' is not an axis"):
            kv_cache_layout(_mesh(), num_key_value_heads=4, batch_axis="data")

    @pytest.mark.skipif(keras.backend.backend() == "jax", reason="checks the non-JAX error")
    def test_distributing_a_cache_needs_jax(self):
        with pytest.raises(ValueError, match="needs the JAX backend"):
            distribute_kv_cache((keras.ops.zeros((2, 4, 8, 4)),) * 2, _mesh())


# ---------------------------------------------------------------- 8 devices
@pytest.fixture(scope="module")
def device_report():
    env = dict(os.environ)
    env["KERAS_BACKEND"] = "jax"
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    completed = subprocess.run(
        [sys.executable, str(CHECKS_SCRIPT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=CHECKS_TIMEOUT_SECONDS,
    )
    lines = completed.stdout.strip().splitlines()
    assert completed.returncode == 0 and lines, (
        f"{CHECKS_SCRIPT.name} exited with {completed.returncode}:\n{completed.stderr[-4000:]}"
    )
    return json.loads(lines[-1])


CASES = {
    # name: mesh, {layer: (num_heads, num_key_value_heads)}, as in distribution_checks.py
    "mha_1d_functional": ({"model": 8}, {"attention": (8, 8)}),
    "gqa_mqa_2d_subclassed": ({"batch": 2, "model": 4}, {"block_gqa": (8, 4), "block_mqa": (4, 1)}),
}
FEATURES, HEAD_DIM = 16, 4


def _full_shape(name, num_heads, num_kv_heads):
    return {
        "query_kernel": [FEATURES, num_heads, HEAD_DIM],
        "query_bias": [num_heads, HEAD_DIM],
        "key_kernel": [FEATURES, num_kv_heads, HEAD_DIM],
        "key_bias": [num_kv_heads, HEAD_DIM],
        "value_kernel": [FEATURES, num_kv_heads, HEAD_DIM],
        "value_bias": [num_kv_heads, HEAD_DIM],
        "output_kernel": [num_heads, HEAD_DIM, FEATURES],
        "output_bias": [FEATURES],
        "head_gates": [num_heads],
        "query_norm_scale": [HEAD_DIM],
        "key_norm_scale": [HEAD_DIM],
    }[name]


def _case(device_report, name):
    case = device_report["cases"][name]
    assert case["ok"], case.get("error")
    return case["result"]


@JAX_ONLY
@pytest.mark.slow
class TestOnEightDevices:
    def test_the_subprocess_has_eight_jax_devices(self, device_report):
        assert device_report["backend"] == "jax"
        assert device_report["device_count"] == 8

    @pytest.mark.parametrize("case_name", list(CASES))
    def test_variables_carry_the_expected_shardings(self, device_report, case_name):
        result = _case(device_report, case_name)
        mesh, layers = CASES[case_name]
        assert result["mesh"] == mesh
        assert result["layers"] == {
            name: {"num_heads": heads, "num_key_value_heads": kv_heads}
            for name, (heads, kv_heads) in layers.items()
        }
        model_size, mesh_size = mesh["model"], 1
        for size in mesh.values():
            mesh_size *= size
        variables = result["variables"]
        for layer_name, (num_heads, num_kv_heads) in layers.items():
            expected_axes = MULTI_QUERY_AXES if num_kv_heads == 1 else SPLIT_KV_AXES
            for name, axes in expected_axes.items():
                report = variables[f"{layer_name}/{name}"]
                assert report["axes"] == axes, (layer_name, name)
                # Each device really holds only its heads.
                shard = [
                    size // model_size if axis == "model" else size
                    for size, axis in zip(
                        _full_shape(name, num_heads, num_kv_heads), axes, strict=True
                    )
                ]
                assert report["shard_shape"] == shard, (layer_name, name)
                assert report["devices"] == mesh_size
        # Layers the map does not name stay whole on every device.
        assert variables["head/kernel"] == {
            "axes": [None, None],
            "shard_shape": [FEATURES, FEATURES],
            "devices": mesh_size,
        }

    @pytest.mark.parametrize("case_name", list(CASES))
    def test_optimizer_state_is_sharded_like_its_variable(self, device_report, case_name):
        result = _case(device_report, case_name)
        momentum_axes = result["optimizer_variable_axes"]
        checked = 0
        for layer_name, (_, num_kv_heads) in CASES[case_name][1].items():
            expected = MULTI_QUERY_AXES if num_kv_heads == 1 else SPLIT_KV_AXES
            for path, axes in momentum_axes.items():
                for name in ("query_kernel", "key_kernel", "output_kernel"):
                    if path.endswith(f"{layer_name}_{name}_momentum"):
                        assert axes == expected[name], path
                        checked += 1
        assert checked == 3 * len(CASES[case_name][1])

    @pytest.mark.parametrize("case_name", list(CASES))
    def test_outputs_equal_the_single_device_model(self, device_report, case_name):
        result = _case(device_report, case_name)
        assert result["output_max_abs"] > 0.1
        assert result["output_max_abs_difference"] <= 1e-5 * result["output_max_abs"]

    @pytest.mark.parametrize("case_name", list(CASES))
    def test_one_training_step_equals_the_single_device_step(self, device_report, case_name):
        result = _case(device_report, case_name)
        assert result["sharded_loss"] == pytest.approx(result["reference_loss"], rel=1e-5)
        assert result["weights_moved_by_step"] > 1e-3  # The step did something...
        assert result["weights_after_step_max_abs_difference"] <= 1e-5  # ...the same thing.

    @pytest.mark.parametrize("case_name", list(CASES))
    def test_forward_pass_needs_one_all_reduce_and_no_gathers(self, device_report, case_name):
        # Whole KV groups per device: K/V never move between devices; the only
        # collective sums the heads' contributions after the output projection.
        result = _case(device_report, case_name)
        for layer_name in CASES[case_name][1]:
            assert result["forward_collectives"][layer_name] == {
                "all-reduce": 1,
                "all-gather": 0,
                "all-to-all": 0,
                "collective-permute": 0,
                "reduce-scatter": 0,
            }, layer_name

    def test_kv_cache_split_along_kv_heads_decodes_like_one_device(self, device_report):
        check = device_report["kv_cache_decoding"]
        assert check["ok"], check.get("error")
        result = check["result"]
        # batch 2 over "batch" (2), 4 KV heads over "model" (4).
        # Both buffers (key, value), each (batch, kv_heads, max_length, head_dim).
        assert result["cache_axes"] == [["batch", "model", None, None]] * 2
        assert result["cache_shard_shape"] == [[1, 1, 8, HEAD_DIM]] * 2
        assert result["cache_axes_after_decoding"] == [["batch", "model", None, None]] * 2
        assert result["output_max_abs"] > 0.1
        assert result["output_max_abs_difference"] <= 1e-5 * result["output_max_abs"]

    def test_whole_decoder_model_shards_by_heads_like_one_device(self, device_report):
        # keras_mha.models.build_model under ModelParallel with head_parallel_layout_map
        # (moved here from tests/models/test_api.py to share this subprocess: CI time).
        check = device_report["whole_model"]
        assert check["ok"], check.get("error")
        result = check["result"]
        assert result["spec"] == ["None", "model", "None"] and result["devices"] == 2
        assert result["difference"] < 1e-5

    @pytest.mark.parametrize("kv_heads", ["2", "1"])
    def test_planner_per_device_bytes_are_the_shards_jax_holds(self, device_report, kv_heads):
        """`keras-mha inspect --gpu 2x...` splits a model the way it is sharded: a tiny Llama
        split tensor-parallel over 2 devices (attention by heads, MLP by its inner width,
        embedding and LM head by the vocabulary; MQA's one KV head replicated) holds on
        one device exactly the planner's per-device float32 weights, plus keras-mha's head
        gates (not checkpoint weights), and its KV cache holds the planner's share."""
        from keras_mha.planning.planner.inventory import weight_groups
        from keras_mha.planning.planner.placement import Placement, weights_by_part
        from keras_mha.planning.planner.quantization import dtype_format
        from keras_mha.planning.planner.serving import ServingModel
        from keras_mha.planning.spec import from_config

        check = device_report["tensor_parallel_bytes"][kv_heads]
        assert check["ok"], check.get("error")
        result = check["result"]
        spec = from_config(result["config"])
        measured = result["variable_bytes_on_device_0"]
        gates = sum(size for path, size in measured if path.endswith("head_gates"))
        assert gates == 2 * 2 * 4  # 2 of 4 heads per device, float32, 2 layers
        planned = weights_by_part(weight_groups(spec), dtype_format("float32"), tensor_parallel=2)
        assert sum(size for _, size in measured) - gates == sum(planned.values())
        serving = ServingModel(spec, kv_dtype="float32", placement=Placement(2, 1))
        cache = result["kv_cache"]
        per_layer = serving.kv_bytes(serving.stages[0], cache["batch"], cache["max_length"])
        assert cache["dtype"] == "float32"
        assert cache["bytes_on_device_0"] == per_layer // spec.num_layers
