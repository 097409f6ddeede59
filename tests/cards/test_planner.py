"""The memory planner: weights per dtype, serving, training and the fit search, against
their written formulas, `kv_cache_cost`, and the published activation formula."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_mha.errors import UsageError
from keras_mha.hub.bundled import list_bundled
from keras_mha.hub.config import load_config
from keras_mha.planning.costs import ParameterCounts, kv_cache_cost, parameter_counts
from keras_mha.planning.planner import memory
from keras_mha.planning.planner.gpus import GPUS, find_gpu, known_gpu_names
from keras_mha.planning.planner.quantization import dtype_format
from keras_mha.planning.planner.units import normalize_dtype, parse_memory_size, parse_seq_lens
from keras_mha.planning.spec import from_config
from tests.configs import tiny_llama

pytestmark = pytest.mark.backend_independent

GIB = 1024**3
BUNDLED = list_bundled()
# One card per way of caching: MHA, GQA, all-sliding GQA, MQA, MLA, Gemma 3's 5:1 local/global
# layers, a Mamba hybrid with MoE, an encoder-decoder, an encoder-only model.
VARIED = [
    "meta-llama/Llama-2-7b-hf",
    "meta-llama/Meta-Llama-3-8B",
    "mistralai/Mistral-7B-v0.1",
    "tiiuae/falcon-7b",
    "deepseek-ai/DeepSeek-V2-Lite",
    "google/gemma-3-4b-it",
    "ai21labs/Jamba-v0.1",
    "google-t5/t5-small",
    "google-bert/bert-base-uncased",
]


def spec_of(repo_id):
    loaded = load_config(f"bundled:{repo_id}")
    return from_config(loaded.config, model_id=repo_id)


SPECS = {repo_id: spec_of(repo_id) for repo_id in BUNDLED}


# -- weights ------------------------------------------------------------------------------------


@pytest.mark.parametrize("repo_id", BUNDLED)
def test_weights_bytes_are_parameters_times_bytes_plus_the_documented_scales(repo_id):
    counts = parameter_counts(SPECS[repo_id])
    by_dtype = memory.weights_bytes_by_dtype(counts)
    assert by_dtype["float32"].total == 4 * counts.total
    assert by_dtype["bfloat16"].total == by_dtype["float16"].total == 2 * counts.total
    for dtype, bits, group, scale in (("int8", 8, 128, 2), ("int4", 4, 128, 2),
                                      ("float8", 8, 16384, 4)):  # fmt: skip
        expected_scales = 0
        for part in memory.PARTS:
            count = getattr(counts, part)
            if part in ("attention", "mlp", "other"):
                scales = math.ceil(count / group) * scale
                expected = math.ceil(count * bits / 8) + scales
                expected_scales += scales
            else:  # embeddings, norms, LM head stay bfloat16
                expected = 2 * count
            assert by_dtype[dtype].by_part[part] == expected, (dtype, part)
        assert by_dtype[dtype].scale_bytes == expected_scales
        assert by_dtype[dtype].total == sum(by_dtype[dtype].by_part.values())
    assert by_dtype["int4"].total < by_dtype["int8"].total < by_dtype["bfloat16"].total


def test_weights_bytes_by_hand():
    counts = ParameterCounts(
        total=1_000_000, attention=300_000, embeddings=200_000, mlp=400_000, norms=1_000,
        lm_head=99_000, other=0, active=None,
    )  # fmt: skip
    int4 = memory.weights_bytes(counts, "int4")
    # attention: 150,000 bytes + ceil(300,000 / 128) = 2,344 scales of 2 bytes.
    assert int4.by_part["attention"] == 150_000 + 2_344 * 2
    assert int4.by_part["mlp"] == 200_000 + 3_125 * 2
    assert int4.by_part["embeddings"] == 400_000
    assert int4.total == 150_000 + 4_688 + 200_000 + 6_250 + 400_000 + 2_000 + 198_000


def test_bad_dtype_is_a_usage_error():
    counts = ParameterCounts(1, 1, 0, 0, 0, 0, 0, None)
    with pytest.raises(UsageError, match="weights_dtype='int3'"):
        memory.weights_bytes(counts, "int3")


# -- serving ------------------------------------------------------------------------------------


@pytest.mark.parametrize("repo_id", VARIED)
@pytest.mark.parametrize("kv_dtype", ["bfloat16", "int4"])
def test_serving_is_weights_plus_kv_cache_plus_state_plus_workspace(repo_id, kv_dtype):
    spec = SPECS[repo_id]
    fast = memory.serving_bytes_function(spec, kv_dtype=kv_dtype, weights_dtype="int8")
    for batch, seq_len in ((1, 1), (1, 1000), (3, 4096), (2, 40_000), (7, 300_001)):
        serving = memory.serving_memory(
            spec, batch=batch, seq_len=seq_len, kv_dtype=kv_dtype, weights_dtype="int8"
        )
        kv = kv_cache_cost(spec, seq_len=seq_len, batch=batch, kv_dtype=kv_dtype)
        assert serving.kv_cache_bytes == kv.total_bytes
        assert serving.weights_bytes == memory.format_weights(spec, dtype_format("int8")).total
        assert serving.total_bytes == (
            serving.weights_bytes + serving.kv_cache_bytes + serving.recurrent_state_bytes
            + serving.activation_bytes
        )  # fmt: skip
        assert fast(batch, seq_len) == serving.total_bytes, (batch, seq_len)


def test_serving_workspace_formula_for_llama_3():
    spec = SPECS["meta-llama/Meta-Llama-3-8B"]
    serving = memory.serving_memory(spec, batch=2, seq_len=8192, prefill_chunk=2048)
    hidden, attention = 4096, 32 * 128 + 8 * 256 + 32 * 128
    widest = max(attention, 3 * 14336)
    assert serving.activation_bytes == 2048 * (2 * hidden + widest) * 2 + 4 * 2 * 128256
    assert serving.recurrent_state_bytes == 0


def test_jamba_counts_the_mamba_state():
    spec = SPECS["ai21labs/Jamba-v0.1"]
    serving = memory.serving_memory(spec, batch=3, seq_len=16)
    mamba_layers = spec.layer_kinds.count("none")
    inner, state = spec.mamba.inner_size, spec.mamba.d_state + spec.mamba.d_conv
    assert serving.recurrent_state_bytes == 3 * mamba_layers * inner * state * 2 > 0


# -- training -----------------------------------------------------------------------------------


def test_activations_match_korthikanti_without_dropout_and_with_flash_attention():
    """Korthikanti et al. 2022: s*b*h*(34 + 5*a*s/h) bytes per GPT layer in 16-bit. Without
    the 2*s*b*h bytes of dropout masks and with flash attention (no s x s terms, a float32
    log-sum-exp per head and token kept instead) that is 32*s*b*h + 4*a*s*b."""
    config = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 256,
              "n_head": 8, "n_layer": 3, "n_positions": 1024, "vocab_size": 1000}  # fmt: skip
    spec = from_config(config)
    seq_len, batch, hidden, heads = 512, 3, 256, 8
    full, checkpointed = memory.activation_bytes(spec, batch=batch, seq_len=seq_len)
    per_layer = 32 * seq_len * batch * hidden + 4 * heads * seq_len * batch
    end = seq_len * batch * (2 * hidden * 2 + 4 * 1000)  # final norm + head inputs, logits
    assert full == 3 * per_layer + end
    # Full checkpointing: every layer's input, one layer recomputed, the end of the model.
    assert checkpointed == 3 * 2 * seq_len * batch * hidden + per_layer + end


def test_gqa_and_gated_mlp_activation_terms():
    config = tiny_llama(hidden_size=64, num_attention_heads=8, intermediate_size=96)
    spec = from_config(config)
    full, _ = memory.activation_bytes(spec, batch=1, seq_len=10, compute_dtype="float32")
    head_dim = 8
    attention = 8 * head_dim + 2 * 2 * head_dim + 8 * head_dim
    per_token = (2 * 64 + 2 * 64 + attention + 3 * 96) * 4 + 4 * 8
    assert full == 10 * (2 * per_token + 2 * 64 * 4 + 4 * 50)


@pytest.mark.parametrize(
    "optimizer,precision,per_parameter",
    [
        ("adamw", "mixed", 2 + 4 + 2 + 8),
        ("adam", "float32", 4 + 4 + 8),
        ("sgd-momentum", "bfloat16", 2 + 2 + 4),
        ("sgd", "float32", 4 + 4),
    ],
)
def test_training_state_bytes_per_parameter(optimizer, precision, per_parameter):
    state = memory.training_state_bytes(1000, optimizer=optimizer, precision=precision)
    assert sum(state.values()) == 1000 * per_parameter + memory.OPTIMIZER_SCALAR_BYTES


@pytest.mark.parametrize("repo_id", VARIED)
def test_training_total_adds_up_and_checkpointing_saves(repo_id):
    spec = SPECS[repo_id]
    training = memory.training_memory(spec, batch=2, seq_len=1024)
    parts = (training.weights_bytes + training.master_weights_bytes + training.gradient_bytes
             + training.optimizer_bytes)  # fmt: skip
    assert training.total_bytes == parts + training.activation_bytes
    assert training.total_bytes_checkpointed == parts + training.activation_bytes_checkpointed
    assert 0 < training.activation_bytes_checkpointed < training.activation_bytes
    assert parts == 16 * parameter_counts(spec).total + memory.OPTIMIZER_SCALAR_BYTES


def test_unknown_optimizer_and_precision_are_refused():
    with pytest.raises(UsageError, match="optimizer='lion'"):
        memory.training_state_bytes(1, optimizer="lion")
    with pytest.raises(UsageError, match="precision='fp8'"):
        memory.training_state_bytes(1, precision="fp8")


# -- fit search ---------------------------------------------------------------------------------


def test_largest_fitting_edges():
    assert memory.largest_fitting(lambda n: 10 * n, 9) == 0
    assert memory.largest_fitting(lambda n: 10 * n, 10) == 1
    assert memory.largest_fitting(lambda n: 10 * n, 10**6) == 10**5
    assert memory.largest_fitting(lambda n: min(n, 7) * 10, 100) is None
    assert memory.largest_fitting(lambda n: n, 2**50, limit=2**40) is None


@pytest.mark.parametrize("repo_id", VARIED)
@pytest.mark.parametrize("gib", [2, 24, 80])
def test_fit_search_inverts_serving_memory(repo_id, gib):
    spec = SPECS[repo_id]
    budget = gib * GIB
    plan = memory.plan_fit(spec, memory_bytes=budget, batch=2, seq_len=4096, weights_dtype="int4")
    for kv_dtype, found in plan.by_kv_dtype.items():

        def serving(batch, seq_len, kv_dtype=kv_dtype):
            return memory.serving_memory(
                spec, batch=batch, seq_len=seq_len, kv_dtype=kv_dtype, weights_dtype="int4"
            ).total_bytes

        length = found["max_seq_len"]
        if length is None:  # unbounded: the cost at the search limit still fits
            assert serving(2, memory.SEARCH_LIMIT) <= budget
        elif length == 0:
            assert serving(2, 1) > budget
        else:
            assert serving(2, length) <= budget < serving(2, length + 1), kv_dtype
        batch = found["max_batch"]
        if batch == 0:
            assert serving(1, 4096) > budget
        else:
            assert serving(batch, 4096) <= budget < serving(batch + 1, 4096), kv_dtype
    training = memory.training_memory(spec, batch=2, seq_len=4096)
    assert plan.training_fits == (training.total_bytes <= budget)
    assert plan.training_fits_checkpointed == (training.total_bytes_checkpointed <= budget)


def test_sliding_window_only_model_is_unbounded_by_memory():
    spec = SPECS["mistralai/Mistral-7B-v0.1"]  # every layer on a 4096-token window
    plan = memory.plan_fit(spec, memory_bytes=80 * GIB, batch=1, seq_len=8192)
    assert plan.max_seq_len is None and plan.max_batch > 0


def test_weights_that_do_not_fit_give_zero():
    spec = SPECS["deepseek-ai/DeepSeek-V3"]
    plan = memory.plan_fit(spec, memory_bytes=80 * GIB, batch=1, seq_len=4096)
    assert not plan.weights_fit and plan.max_seq_len == 0 and plan.max_batch == 0
    assert not plan.training_fits


@settings(max_examples=25, deadline=None)
@given(
    budget=st.integers(min_value=1, max_value=2**42),
    batch=st.integers(min_value=1, max_value=64),
)
def test_fit_search_property_on_gemma_3(budget, batch):
    spec = SPECS["google/gemma-3-4b-it"]
    serving = memory.serving_bytes_function(spec, weights_dtype="int4", kv_dtype="float8")
    length = memory.largest_fitting(lambda n: serving(batch, n), budget)
    if length == 0:
        assert serving(batch, 1) > budget
    else:
        assert serving(batch, length) <= budget < serving(batch, length + 1)


# -- GPUs and units -----------------------------------------------------------------------------


def test_gpu_names_are_case_insensitive_and_unknown_lists_the_known():
    assert find_gpu("h100").memory_bytes == 81559 * 1024**2
    assert find_gpu("NVIDIA H100 80GB HBM3") is find_gpu("H100-SXM")
    assert find_gpu("a100_40gb").name == "A100 40GB"
    assert find_gpu("GeForce RTX 4090").name == "RTX 4090 24GB"
    with pytest.raises(UsageError) as raised:
        find_gpu("rtx9090")
    message = str(raised.value)
    assert "'rtx9090'" in message and all(name in message for name in known_gpu_names())
    with pytest.raises(UsageError, match="ambiguous.*A100 80GB or A100 40GB"):
        find_gpu("A100")
    assert len({gpu.name for gpu in GPUS}) == len(GPUS)


def test_units():
    assert parse_seq_lens("1m,2K, 4096") == [2**20, 2048, 4096]
    for bad in ("0", "-5", "1.5k", "2g", "", "2000m"):
        with pytest.raises(UsageError, match="--seq-len"):
            parse_seq_lens(bad)
    assert [normalize_dtype(alias) for alias in ("bf16", "FP16", "fp8", "fp32", "f32", "half",
                                                  "INT4", "q8")] == [
        "bfloat16", "float16", "float8", "float32", "float32", "float16", "int4", "int8",
    ]  # fmt: skip
    with pytest.raises(UsageError, match="--kv-dtype 'int3'"):
        normalize_dtype("int3")
    assert parse_memory_size("24GiB") == 24 * GIB
    assert parse_memory_size("80 gb") == 80 * 10**9
    assert parse_memory_size("1.1GB") == 1_100_000_000
    assert parse_memory_size("512MiB") == 512 * 1024**2
    assert parse_memory_size("2TB") == 2 * 10**12
    for bad in ("24", "0GB", "-1GiB", "lots", "1e3GB"):
        with pytest.raises(UsageError, match="--memory"):
            parse_memory_size(bad)
