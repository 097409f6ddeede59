"""The planner beyond one device: weights per tensor (inventory), checkpoint formats checked
against published checkpoint sizes, several devices (tensor and pipeline parallel as vLLM
places them), speed bounds by hand, the verdict and its suggestions, and `keras_mha.plan`."""

import json
import math

import pytest

import keras_mha
from keras_mha import cli
from keras_mha.errors import UsageError
from keras_mha.hub.bundled import list_bundled
from keras_mha.hub.config import load_config
from keras_mha.planning.costs import KV_DTYPE_BITS, kv_cache_cost, parameter_counts
from keras_mha.planning.planner import memory
from keras_mha.planning.planner.devices import DeviceSet, parse_devices
from keras_mha.planning.planner.gpus import GPUS, find_gpu
from keras_mha.planning.planner.inventory import weight_groups
from keras_mha.planning.planner.placement import (
    Placement,
    kv_heads_per_device,
    pipeline_stages,
    tensor_parallel_problem,
    weights_by_part,
)
from keras_mha.planning.planner.quantization import checkpoint_format, dtype_format
from keras_mha.planning.planner.serving import ServingModel
from keras_mha.planning.planner.speed import expected_experts, speed_bounds
from keras_mha.planning.spec import from_config

pytestmark = pytest.mark.backend_independent

GIB = 1024**3


def spec_of(repo_id, **overrides):
    config = {**load_config(f"bundled:{repo_id}").config, **overrides}
    return from_config(config, model_id=repo_id)


@pytest.fixture(scope="module")
def specs():
    return {repo_id: spec_of(repo_id) for repo_id in list_bundled()}


# -- inventory -----------------------------------------------------------------------------------


def test_the_weight_groups_add_up_to_the_parameter_counts_part_by_part(specs):
    for repo_id, spec in specs.items():
        counts, groups = parameter_counts(spec), weight_groups(spec)
        for part in memory.PARTS:
            found = sum(group.elements for group in groups if group.part == part)
            assert found == getattr(counts, part), (repo_id, part)
        # Plain dtypes store every parameter at their width, per tensor as per part.
        assert memory.format_weights(spec, dtype_format("float16")).total == 2 * counts.total


# -- checkpoint formats ---------------------------------------------------------------------

GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
# Published sizes of real checkpoints (decimal GB as the Hub shows them) and what their
# config says; docs/concepts/memory-planner.md gives the sources.
PUBLISHED = [
    # TheBloke/Llama-2-7B-GPTQ, "Provided files" table: main, 4-bit group 128, 3.90 GB.
    ("meta-llama/Llama-2-7b-hf", "float16", GPTQ, 3.90e9),
    # ... its gptq-4bit-32g-actorder_True branch, 4.28 GB, and 8-bit without groups, 7.01 GB.
    ("meta-llama/Llama-2-7b-hf", "float16", {**GPTQ, "group_size": 32, "desc_act": True}, 4.28e9),
    ("meta-llama/Llama-2-7b-hf", "float16", {**GPTQ, "bits": 8, "group_size": -1}, 7.01e9),
    # TheBloke/Llama-2-7B-AWQ: 4-bit, group 128, GEMM, 3.89 GB.
    ("meta-llama/Llama-2-7b-hf", "float16",
     {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
      "version": "gemm"}, 3.89e9),
    # unsloth/llama-3-8b-bnb-4bit: nf4 with double quantization, 5.70 GB.
    ("meta-llama/Meta-Llama-3-8B", "bfloat16",
     {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
      "bnb_4bit_use_double_quant": True}, 5.70e9),
]  # fmt: skip


@pytest.mark.parametrize("repo_id, dtype, quantization, published", PUBLISHED)
def test_quantized_weights_match_published_checkpoint_sizes(
    repo_id, dtype, quantization, published
):
    spec = spec_of(repo_id, torch_dtype=dtype, quantization_config=quantization)
    fmt = checkpoint_format(spec.raw)
    assert fmt.from_checkpoint and fmt.is_quantized and not fmt.notes
    computed = memory.format_weights(spec, fmt).total
    assert abs(computed / published - 1) < 0.005, (fmt.id, computed)


def test_deepseek_v3_fp8_is_its_checkpoint_less_the_multi_token_prediction_layer():
    """DeepSeek-V3's index states 688,586,727,753 bytes of tensors: the 61 layers
    transformers loads in fp8 with 128x128 float32 scales (routers, norms, embeddings and
    head in bfloat16) plus the multi-token-prediction layer: one more MoE layer, its own
    copies of the embedding and head, eh_proj and three norms in bfloat16."""
    spec = spec_of("deepseek-ai/DeepSeek-V3")
    fmt = checkpoint_format(spec.raw)
    assert fmt.id == "fp8-block128x128" and fmt.fp8_compute
    groups = weight_groups(spec)
    total = sum(weights_by_part(groups, fmt).values())
    last_layer = sum(
        weights_by_part(groups, fmt, stage=range(60, 61), first=False, last=False).values()
    )
    hidden, vocab = 7168, 129280
    mtp = last_layer + 2 * vocab * hidden * 2 + 2 * hidden * hidden * 2 + 3 * hidden * 2
    assert abs((total + mtp) / 688_586_727_753 - 1) < 1e-4
    # The bfloat16 plan the issue reported (1.22 TiB) is what it would be without the format.
    assert memory.format_weights(spec, dtype_format("bfloat16")).total > 1.9 * total


def test_matrix_rules_by_hand():
    """One 4096 x 4096 matrix in each format, counted as each library writes it."""
    n = 4096 * 4096
    assert checkpoint_format({"quantization_config": GPTQ}).matrix_bytes(4096, 4096) == (
        n // 2 + 32 * 4096 * 4 // 8 + 32 * 4096 * 2 + 4096 * 4  # qweight, qzeros, scales, g_idx
    )
    awq = checkpoint_format({"quantization_config": {"quant_method": "awq", "bits": 4}})
    assert awq.matrix_bytes(4096, 4096) == n // 2 + 32 * 4096 // 2 + 32 * 4096 * 2
    fp8_config = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    fp8 = checkpoint_format({"quantization_config": fp8_config})
    assert fp8.matrix_bytes(4096, 4096) == n + 32 * 32 * 4
    bnb8 = checkpoint_format({"quantization_config": {"load_in_8bit": True}})
    assert bnb8.id == "bnb-int8" and bnb8.matrix_bytes(4096, 4096) == n + 4 * 4096
    nf4 = checkpoint_format({"quantization_config": {
        "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}})  # fmt: skip
    assert nf4.matrix_bytes(4096, 4096) == n // 2 + n // 64 * 4 + 64
    w4a16 = {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
            "symmetric": True}}},
        "ignore": ["lm_head"],
    }  # fmt: skip
    packed = checkpoint_format({"torch_dtype": "bfloat16", "quantization_config": w4a16})
    assert packed.id == "ct-int4-group128"
    assert packed.matrix_bytes(4096, 4096) == n // 2 + 4096 * 32 * 2 + 16
    fp8_channel = {**w4a16, "format": "float-quantized", "config_groups": {"g": {"weights": {
        "num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
        "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}}}  # fmt: skip
    channel = checkpoint_format({"torch_dtype": "bfloat16", "quantization_config": fp8_channel})
    assert channel.matrix_bytes(4096, 4096) == n + 4096 * 2 and channel.fp8_compute


@pytest.mark.parametrize(
    "config, fallback, note",
    [
        ({"quantization_config": {"quant_method": "aqlm"}}, "bfloat16", "'aqlm' is not one"),
        (
            {"torch_dtype": "float16", "quantization_config": {"quant_method": "gptq", "bits": 5}},
            "float16",
            "bits = 5",
        ),  # fmt: skip
        (
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": "x"}},
            "bfloat16",
            "weight_block_size",
        ),
        ({"quantization_config": ["gptq"]}, "bfloat16", "is not one of the formats"),
        ({"torch_dtype": "float64"}, "float32", "'float64' is not"),
        ({}, "float32", "names no torch_dtype"),
    ],
)
def test_a_format_keras_mha_cannot_count_falls_back_with_a_note(config, fallback, note):
    fmt = checkpoint_format(config)
    assert fmt.id == fallback and not fmt.is_quantized
    assert any(note in line for line in fmt.notes), fmt.notes


def test_the_checkpoint_format_is_the_reports_default_and_the_flag_overrides_it(capsys):
    def report(*flags):
        assert cli.main(["inspect", "bundled:deepseek-ai/DeepSeek-V3", "--format", "json",
                         *flags]) == 0  # fmt: skip
        return json.loads(capsys.readouterr().out)

    default, asked = report(), report("--weights-dtype", "bf16")
    assert default["memory"]["weights_format"]["id"] == "fp8-block128x128"
    assert default["memory"]["serving"]["weights_dtype"] == "fp8-block128x128"
    assert asked["memory"]["serving"]["weights_dtype"] == "bfloat16"
    assert asked["memory"]["serving_bytes"] > 1.9 * default["memory"]["serving_bytes"]


# -- devices -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, count, name",
    [
        ({"gpu": "2xH100"}, 2, "2x H100 80GB SXM"),
        ({"gpu": "H100x2"}, 2, "2x H100 80GB SXM"),
        ({"gpu": "4 x a100-80gb"}, 4, "4x A100 80GB"),
        ({"gpu": "H100", "gpus": 8}, 8, "8x H100 80GB SXM"),
        ({"gpu": "MI300X"}, 1, "MI300X 192GB"),
        ({"memory": "2x80GiB"}, 2, "2x 80.00 GiB"),
        ({"memory": "24GiB", "gpus": 3}, 3, "3x 24.00 GiB"),
    ],
)
def test_device_spellings(flags, count, name):
    devices = parse_devices(**flags)
    assert (devices.count, devices.name) == (count, name)
    assert devices.usable_memory_bytes == math.floor(0.9 * devices.memory_bytes)


@pytest.mark.parametrize(
    "flags, expected",
    [
        ({"gpu": "rtx9090"}, "not an accelerator keras-mha knows"),
        ({"gpu": "0xH100"}, "names 0 devices"),
        ({"gpu": "2xH100", "gpus": 4}, "contradicts"),
        ({"gpu": "H100", "gpus": 3, "pipeline_parallel": 2}, "does not divide the 3 devices"),
        ({"memory": "2x80"}, "not a memory size"),
        ({"gpu": "H100", "memory_utilization": 1.5}, "not a share of memory"),
        ({"gpu": "gh200"}, "ambiguous"),
    ],
)
def test_bad_device_flags_are_one_line(flags, expected):
    with pytest.raises(UsageError) as raised:
        parse_devices(**flags)
    assert expected in str(raised.value) and "\n" not in str(raised.value)


def test_the_accelerator_table_has_every_figure():
    names = [gpu.name for gpu in GPUS]
    wanted_names = "B200 GB200 GH200 H20 MI250X MI325X L40S A10G T4 RTX-3090 RTX-5090 TPU-v4 "
    wanted_names = [
        name.replace("-", " ") for name in (wanted_names + "TPU-v5e TPU-v5p TPU-v6e").split()
    ]
    for wanted in wanted_names:
        assert any(name.startswith(wanted) for name in names), wanted
    for gpu in GPUS:
        assert gpu.memory_bytes > 8 * GIB and gpu.bandwidth_bytes_per_s > 1e11, gpu.name
        assert gpu.dense_16bit_flops > 1e13 and gpu.spec_source, gpu.name
        assert gpu.dense_fp8_flops is None or gpu.dense_fp8_flops >= gpu.dense_16bit_flops


# -- placement --------------------------------------------------------------------------------


def test_pipeline_stages_follow_vllms_get_pp_indices():
    # vLLM gives the remainder, one layer each, to the stages before the last, from the back.
    assert pipeline_stages(32, 4) == [range(0, 8), range(8, 16), range(16, 24), range(24, 32)]
    assert [len(stage) for stage in pipeline_stages(10, 4)] == [2, 3, 3, 2]
    assert [len(stage) for stage in pipeline_stages(61, 8)] == [7, 7, 8, 8, 8, 8, 8, 7]


def test_kv_heads_are_split_and_replicated_below_one_each():
    assert [kv_heads_per_device(8, size) for size in (1, 2, 4, 8, 16)] == [8, 4, 2, 1, 1]
    llama = spec_of("meta-llama/Llama-3.1-70B")
    assert tensor_parallel_problem(llama, 16) is None
    assert "does not divide the 64 query heads" in tensor_parallel_problem(llama, 3)


def test_two_h100s_hold_llama_70b_as_vllm_splits_it_by_hand():
    """Llama-3.1-70B in bfloat16 on 2 devices: every matrix and the vocabulary split in two,
    the 161 norms (80 layers x 2 + final) of 8192 whole on both; 8 KV heads: 4 each."""
    spec = spec_of("meta-llama/Llama-3.1-70B")
    counts = parameter_counts(spec)
    serving = ServingModel(spec, placement=Placement(2, 1))
    norms = 161 * 8192
    assert serving.stages[0].weights_bytes == 2 * ((counts.total - norms) // 2 + norms)
    kv = kv_cache_cost(spec, seq_len=8192).total_bytes
    assert serving.kv_bytes(serving.stages[0], 1, 8192) == kv // 2
    plan = keras_mha.plan("bundled:meta-llama/Llama-3.1-70B", gpu="2xH100", seq_len=8192)
    assert plan.serving_fits and plan.max_seq_len > 8192
    one = keras_mha.plan("bundled:meta-llama/Llama-3.1-70B", gpu="H100", seq_len=8192)
    assert not one.serving_fits
    assert [(s["weights_dtype"], s["devices"]) for s in one.suggestions] == [
        ("float8", 1), ("int8", 1), ("int4", 1), ("bfloat16", 2),
    ]  # fmt: skip
    assert one.verdict == (
        "serving does not fit: the weights need 131.42 GiB per device, 71.68 GiB is usable; "
        "it would fit in float8 (plan only), int8 or int4 weights, or on 2x H100 80GB SXM"
    )


def test_pipeline_stages_hold_their_layers_and_the_ends():
    spec = spec_of("meta-llama/Meta-Llama-3-8B")
    groups, fmt = weight_groups(spec), dtype_format("bfloat16")
    serving = ServingModel(spec, placement=Placement(1, 4), groups=groups)
    layer = (4096 * (4096 + 2 * 1024 + 4096) + 3 * 4096 * 14336 + 2 * 4096) * 2
    table = 128256 * 4096 * 2
    assert [stage.weights_bytes for stage in serving.stages] == [
        table + 8 * layer, 8 * layer, 8 * layer, 8 * layer + 4096 * 2 + table,
    ]  # fmt: skip
    whole = sum(weights_by_part(groups, fmt).values())
    assert sum(stage.weights_bytes for stage in serving.stages) == whole
    # Each stage caches its own layers: a quarter of the KV cache.
    kv = kv_cache_cost(spec, seq_len=1000, batch=2).total_bytes
    assert serving.kv_bytes(serving.stages[1], 2, 1000) == kv // 4
    with pytest.raises(UsageError, match="encoder-decoder"):
        ServingModel(spec_of("google-t5/t5-small"), placement=Placement(1, 2))


def test_mla_keeps_its_whole_latent_cache_on_every_device():
    spec = spec_of("deepseek-ai/DeepSeek-V2-Lite")
    one, eight = ServingModel(spec), ServingModel(spec, placement=Placement(8, 1))
    assert one.kv_bytes(one.stages[0], 1, 4096) == eight.kv_bytes(eight.stages[0], 1, 4096)


def test_training_on_several_devices_is_fully_sharded():
    spec = spec_of("meta-llama/Meta-Llama-3-8B")
    one = memory.training_memory(spec, batch=8, seq_len=1024)
    four = memory.training_memory(spec, batch=8, seq_len=1024, devices=4)
    assert four.optimizer_bytes == -(-one.optimizer_bytes // 4)
    assert four.activation_bytes == memory.training_memory(spec, batch=2, seq_len=1024
                                                            ).activation_bytes  # fmt: skip


# -- speed -----------------------------------------------------------------------------------


def test_decode_bound_by_hand_for_llama_3_on_an_h100():
    """One decode step at batch 1 reads every weight but the embedding table (one row of
    it is looked up) and the 8,192-token KV cache: 3.35 TB/s over those bytes."""
    spec = spec_of("meta-llama/Meta-Llama-3-8B")
    bounds = speed_bounds(ServingModel(spec), find_gpu("H100"), batch=1, seq_len=8192)
    read = 2 * (parameter_counts(spec).total - 128256 * 4096) + 8192 * 131072
    assert bounds.decode_bytes_per_step == read
    assert bounds.decode_tokens_per_s == pytest.approx(3.35e12 / read)
    assert bounds.decode_limited_by == "memory bandwidth"
    # Prefill: 2 FLOPs per weight of the blocks per token, the head once (last token),
    # causal attention 2 * 32 heads * (128 + 128) per key seen, over 32 layers.
    blocks = parameter_counts(spec).total - 2 * 128256 * 4096 - 65 * 4096
    flops = 2 * blocks * 8192 + 2 * 128256 * 4096 + 2 * 32 * 256 * 32 * 8192 * 8193 // 2
    assert bounds.prefill_flops == flops
    assert bounds.prefill_seconds == pytest.approx(flops / 989e12)


def test_moe_decode_reads_the_experts_its_batch_picks():
    assert expected_experts(8, 2, 1) == 2
    assert expected_experts(8, 2, 2) == pytest.approx(8 * (1 - (6 / 8) ** 2))
    spec = spec_of("mistralai/Mixtral-8x7B-v0.1")
    serving = ServingModel(spec, weights_format=dtype_format("int4"))
    one = speed_bounds(serving, find_gpu("H100"), batch=1, seq_len=1)
    stage = serving.stages[0]
    dense = stage.weights_bytes - stage.lookup_bytes - stage.expert_bytes
    kv = kv_cache_cost(spec, seq_len=1).total_bytes
    assert one.decode_bytes_per_step == pytest.approx(dense + stage.expert_bytes / 4 + kv, abs=1)
    many = speed_bounds(serving, find_gpu("H100"), batch=256, seq_len=1)
    assert many.decode_bytes_per_step > 0.99 * (dense + stage.expert_bytes)


def test_fp8_weights_prefill_at_the_fp8_peak_where_there_is_one():
    spec = spec_of("deepseek-ai/DeepSeek-V3")
    serving = ServingModel(spec, weights_format=checkpoint_format(spec.raw),
                           placement=Placement(8, 1))  # fmt: skip
    assert speed_bounds(serving, find_gpu("H200"), batch=1, seq_len=8).peak_dtype == "float8"
    assert speed_bounds(serving, find_gpu("A100-80GB"), batch=1, seq_len=8).peak_dtype == (
        "bfloat16"
    )


# -- the Python API and the CLI agree ------------------------------------------------------


def test_plan_to_dict_is_the_cli_json(capsys):
    argv = ["bundled:mistralai/Mixtral-8x7B-v0.1", "--gpu", "2xL40S", "--seq-len", "16k",
            "--batch", "4", "--kv-dtype", "fp8", "--weights-dtype", "int4"]  # fmt: skip
    assert cli.main(["inspect", *argv, "--format", "json"]) == 0
    from_cli = json.loads(capsys.readouterr().out)
    plan = keras_mha.plan("bundled:mistralai/Mixtral-8x7B-v0.1", gpu="2xL40S", seq_len="16k",
                          batch=4, kv_dtype="fp8", weights_dtype="int4")  # fmt: skip
    assert plan.to_dict() == from_cli
    assert (plan.serving_fits, plan.max_seq_len, plan.max_batch) == (
        from_cli["fits"]["serving_fits"], from_cli["fits"]["max_seq_len"],
        from_cli["fits"]["max_batch"],
    )  # fmt: skip
    assert plan.decode_tokens_per_s == from_cli["speed_bounds"]["decode_tokens_per_s"]
    assert from_cli["speed_bounds"]["upper_bound"] is True


def test_plan_takes_a_config_dict_and_refuses_bad_arguments():
    config = dict(load_config("bundled:openai-community/gpt2").config)
    plan = keras_mha.plan(config, memory="2GiB")
    assert plan.weights_format == "float32" and plan.serving_fits
    assert plan.decode_tokens_per_s is None  # no accelerator, no bandwidth
    for kwargs, expected in (
        ({"gpu": "H100", "kv_dtype": "int3"}, "kv_dtype 'int3'"),
        ({"gpu": "H100", "batch": 0}, "batch=0"),
        ({"gpu": "H100", "memory": "8GiB"}, "one of --gpu"),
    ):
        with pytest.raises(UsageError, match=expected):
            keras_mha.plan(config, **kwargs)
    with pytest.raises(UsageError, match="model=int"):
        keras_mha.plan(3)


def test_memory_budget_is_the_devices_usable_share():
    devices = DeviceSet(2, 10 * GIB, None, memory_utilization=0.5)
    assert devices.usable_memory_bytes == 5 * GIB and devices.tensor_parallel == 2
    spec = spec_of("meta-llama/Llama-3.2-1B")
    plan = memory.plan_fit(spec, memory_bytes=5 * GIB, seq_len=4096, placement=Placement(2, 1))
    serving = ServingModel(spec, placement=Placement(2, 1))
    assert serving(1, plan.max_seq_len) <= 5 * GIB < serving(1, plan.max_seq_len + 1)


@pytest.mark.parametrize("dtype", ["float8", "int4"])
def test_kv_dtype_bits_per_device(dtype):
    spec = spec_of("meta-llama/Meta-Llama-3-8B")
    serving = ServingModel(spec, kv_dtype=dtype, placement=Placement(4, 1))
    # 2 of 8 KV heads, and a bfloat16 scale per token and KV head for keys and values.
    expected = 3 * 100 * 32 * 2 * (2 * 128 * KV_DTYPE_BITS[dtype] + 2 * 16) // 8
    assert serving.kv_bytes(serving.stages[0], 3, 100) == expected
