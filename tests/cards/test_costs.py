"""The cost model against numbers worked out by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keras_mha.errors import ConfigError
from keras_mha.planning.costs import (
    KV_DTYPE_BITS,
    ParameterCounts,
    kv_cache_cost,
    parameter_counts,
)
from keras_mha.planning.spec import from_config

pytestmark = pytest.mark.backend_independent

CARDS_ROOT = Path(__file__).resolve().parents[2] / "cards"


def spec_of(card_id: str, **overrides):
    config = json.loads((CARDS_ROOT / card_id / "config.json").read_text())
    return from_config({**config, **overrides}, model_id=card_id)


# -- parameters ---------------------------------------------------------------------------------


def test_llama_3_8b_matches_design_md():
    counts = parameter_counts(spec_of("meta-llama/Meta-Llama-3-8B"))
    # attention per layer: q, o 4096x4096 and k, v 4096x1024 -> 41,943,040; x 32 layers.
    assert counts.attention == 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024) == 1342177280
    assert counts.embeddings == counts.lm_head == 128256 * 4096
    assert counts.mlp == 32 * 3 * 4096 * 14336
    assert counts.norms == 32 * 2 * 4096 + 4096
    assert counts.total == 8030261248
    assert counts.other == 0 and counts.active is None


def test_gpt2_breakdown():
    counts = parameter_counts(spec_of("openai-community/gpt2"))
    assert counts.embeddings == 50257 * 768 + 1024 * 768  # wte + wpe
    # c_attn 768x2304 (+2304), c_proj 768x768 (+768) per layer.
    assert counts.attention == 12 * (768 * 2304 + 2304 + 768 * 768 + 768) == 28348416
    assert counts.mlp == 12 * (768 * 3072 + 3072 + 3072 * 768 + 768)
    assert counts.norms == (12 * 2 + 1) * 2 * 768  # LayerNorms with bias
    assert counts.lm_head == 0  # tied to wte
    assert counts.total == 124439808


def test_qwen2_biases_and_tied_head():
    counts = parameter_counts(spec_of("Qwen/Qwen2.5-0.5B"))
    # q 896x896+896, k and v 896x128+128, o 896x896 (no bias).
    per_layer = (896 * 896 + 896) + 2 * (896 * 128 + 128) + 896 * 896
    assert counts.attention == 24 * per_layer == 44067840
    assert counts.lm_head == 0 and counts.total == 494032768


def test_bert_masked_lm_head_and_pooler():
    masked = parameter_counts(spec_of("google-bert/bert-base-uncased"))
    # transform dense 768x768+768, LayerNorm 2x768, decoder bias 30522; decoder weight tied.
    assert masked.lm_head == 768 * 768 + 768 + 2 * 768 + 30522
    assert masked.embeddings == (30522 + 512 + 2) * 768
    base = parameter_counts(spec_of("sentence-transformers/all-MiniLM-L6-v2"))
    assert base.other == 384 * 384 + 384  # pooler
    assert base.total == 22713216


def test_moe_total_and_active():
    counts = parameter_counts(spec_of("mistralai/Mixtral-8x7B-v0.1"))
    expert = 3 * 4096 * 14336
    assert counts.mlp == 32 * (8 * 4096 + 8 * expert)  # router + 8 experts per layer
    assert counts.active == counts.total - 32 * (8 - 2) * expert == 12879925248
    v3 = parameter_counts(spec_of("deepseek-ai/DeepSeek-V3"))
    assert v3.total == 671026404352
    # The report's "37B activated", here with the input embedding and the LM head included.
    assert 37e9 < v3.active < 38e9


def test_mla_attention_parameters():
    counts = parameter_counts(spec_of("deepseek-ai/DeepSeek-V3", num_hidden_layers=1))
    hidden, heads, q_rank, kv_rank = 7168, 128, 1536, 512
    expected = (
        hidden * q_rank
        + q_rank
        + q_rank * heads * 192  # q_a_proj, q_a_layernorm, q_b_proj
        + hidden * (kv_rank + 64)
        + kv_rank  # kv_a_proj_with_mqa, kv_a_layernorm
        + kv_rank * heads * (128 + 128)  # kv_b_proj
        + heads * 128 * hidden  # o_proj
    )
    assert counts.attention == expected


def test_hybrid_counts_mamba_under_other():
    counts = parameter_counts(spec_of("ai21labs/Jamba-v0.1"))
    assert counts.attention == 4 * (2 * 4096 * 4096 + 2 * 4096 * 1024)
    inner, rank, state = 8192, 256, 16
    mixer = (
        4096 * 2 * inner  # in_proj
        + inner * 4
        + inner  # conv1d with bias
        + inner * (rank + 2 * state)  # x_proj
        + rank * inner
        + inner  # dt_proj
        + inner * state
        + inner  # A_log, D
        + inner * 4096  # out_proj
        + rank
        + 2 * state  # dt/B/C layernorms
    )
    assert counts.other == 28 * mixer


def test_encoder_decoder_counts_both_stacks_and_cross_attention():
    counts = parameter_counts(spec_of("google-t5/t5-small"))
    attention = 512 * 512 * 4  # q, k, v, o without bias
    # encoder self (6) + decoder self (6) + decoder cross (6), and one (32, 8) bias table per stack.
    assert counts.attention == 18 * attention + 2 * 32 * 8
    assert counts.total == 60506624
    flan = parameter_counts(spec_of("google/flan-t5-base"))
    assert flan.lm_head == 32128 * 768 and flan.total == 247577856


def test_parts_add_up_to_the_total():
    with pytest.raises(ValueError, match="must equal the sum of its parts"):
        ParameterCounts(
            total=5, attention=1, embeddings=1, mlp=1, norms=1, lm_head=0, other=0, active=None
        )
    counts = parameter_counts(spec_of("google/gemma-3-4b-it"))
    assert set(counts.as_dict()) == {
        "total",
        "attention",
        "embeddings",
        "mlp",
        "norms",
        "lm_head",
        "other",
        "active",
        "vision",
    }
    assert counts.other == counts.vision > 400_000_000  # the SigLIP vision tower and projector
    with pytest.raises(ValueError, match=r"vision=2 must be in \[0, other=1\]"):
        ParameterCounts(2, 1, 0, 0, 0, 0, 1, None, vision=2)


# -- KV cache -----------------------------------------------------------------------------------


def test_llama_3_8b_kv_cache_matches_design_md():
    cost = kv_cache_cost(spec_of("meta-llama/Meta-Llama-3-8B"), seq_len=8192)
    assert (cost.dtype, cost.batch, cost.seq_len) == ("bfloat16", 1, 8192)
    assert cost.bytes_per_token == 32 * 2 * 8 * 128 * 2 == 131072
    assert cost.total_bytes == 1073741824
    assert cost.mha_equivalent_bytes == 4294967296
    assert cost.cache_format == "kv" and cost.applicable and cost.note is None


@pytest.mark.parametrize(
    ("kv_dtype", "bytes_per_token"),
    [
        ("float32", 262144),
        ("bfloat16", 131072),
        ("float16", 131072),
        # Plus a bfloat16 scale per token and KV head: 32 layers x 16 rows x 2 bytes.
        ("float8", 65536 + 1024),
        ("int8", 65536 + 1024),
        ("int4", 32768 + 1024),  # half a byte per element
    ],
)
def test_kv_dtypes(kv_dtype, bytes_per_token):
    cost = kv_cache_cost(
        spec_of("meta-llama/Meta-Llama-3-8B"), seq_len=100, batch=3, kv_dtype=kv_dtype
    )
    assert cost.bytes_per_token == bytes_per_token
    assert cost.total_bytes == 3 * 100 * bytes_per_token


def test_int4_rounds_up_to_whole_bytes():
    config = {
        "model_type": "llama",
        "hidden_size": 8,
        "num_attention_heads": 1,
        "num_hidden_layers": 1,
        "intermediate_size": 8,
        "vocab_size": 10,
        "head_dim": 1,
    }
    cost = kv_cache_cost(from_config(config), seq_len=1, kv_dtype="int4")
    plain = kv_cache_cost(from_config(config), seq_len=1, kv_dtype="float8")
    # 2 elements x 4 bits and 2 scales of 16 bits: 36 bits, 4.5 bytes.
    assert cost.bytes_per_token == cost.total_bytes == 5
    assert plain.total_bytes == 6


def test_bad_kv_dtype_names_the_argument_the_value_and_the_choices():
    with pytest.raises(ValueError) as error:
        kv_cache_cost(spec_of("openai-community/gpt2"), seq_len=8, kv_dtype="fp8")
    message = str(error.value)
    assert "kv_dtype='fp8'" in message
    for name in KV_DTYPE_BITS:
        assert name in message


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seq_len": 0}, "seq_len=0 must be a positive integer"),
        ({"seq_len": 8, "batch": True}, "batch=True must be a positive integer"),
        ({"seq_len": 8.5}, "seq_len=8.5"),
        ({"seq_len": 8, "encoder_seq_len": -1}, "encoder_seq_len=-1"),
        ({"seq_len": 8, "mla_cache": "dense"}, "mla_cache='dense'"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kv_cache_cost(spec_of("openai-community/gpt2"), **kwargs)


def test_sliding_window_caps_every_sliding_layer():
    spec = spec_of("mistralai/Mistral-7B-v0.1")
    per_token = 32 * 2 * 8 * 128 * 2
    short = kv_cache_cost(spec, seq_len=1000)
    assert short.total_bytes == 1000 * per_token == 1000 * short.bytes_per_token
    long = kv_cache_cost(spec, seq_len=32768)
    assert long.bytes_per_token == per_token
    assert long.total_bytes == 4096 * per_token  # capped at the window
    assert long.bytes_per_token_beyond_window == 0
    assert long.mha_equivalent_bytes == 32768 * 32 * 2 * 32 * 128 * 2  # no window, all heads
    assert "4096" in long.note


def test_gemma3_mixes_sliding_and_full_layers():
    cost = kv_cache_cost(spec_of("google/gemma-3-1b-pt"), seq_len=32768)
    per_layer_token = 2 * 1 * 256 * 2  # one KV head of 256, K and V, bfloat16
    assert cost.bytes_per_token == 26 * per_layer_token
    assert cost.bytes_per_token_beyond_window == 4 * per_layer_token
    assert cost.total_bytes == 22 * 512 * per_layer_token + 4 * 32768 * per_layer_token
    assert [layer.cached_tokens for layer in cost.layers[:6]] == [512] * 5 + [32768]


def test_mqa_saving_against_mha():
    cost = kv_cache_cost(spec_of("tiiuae/falcon-7b"), seq_len=2048)
    assert cost.bytes_per_token == 32 * 2 * 1 * 64 * 2
    assert cost.mha_equivalent_bytes == 71 * cost.total_bytes


def test_mla_caches_the_latent_without_a_factor_two():
    spec = spec_of("deepseek-ai/DeepSeek-V3")
    latent = kv_cache_cost(spec, seq_len=4096)
    assert latent.bytes_per_token == 61 * (512 + 64) * 2
    assert latent.cache_format == "mla_latent"
    assert latent.layers[0].value_elements_per_token == 0
    expanded = kv_cache_cost(spec, seq_len=4096, mla_cache="expanded")
    assert expanded.bytes_per_token == 61 * 128 * (192 + 128) * 2
    assert latent.mha_equivalent_bytes == expanded.mha_equivalent_bytes == expanded.total_bytes


def test_encoder_decoder_includes_the_cross_attention_cache():
    spec = spec_of("google-t5/t5-small")
    per_layer_token = 2 * 8 * 64 * 2  # K and V of 8 heads of 64, bfloat16
    same = kv_cache_cost(spec, seq_len=512)
    assert same.encoder_seq_len == 512
    assert same.bytes_per_token == 12 * per_layer_token  # 6 self + 6 cross layers
    assert same.total_bytes == 512 * same.bytes_per_token
    shorter_encoder = kv_cache_cost(spec, seq_len=512, encoder_seq_len=100)
    assert shorter_encoder.total_bytes == 6 * per_layer_token * (512 + 100)
    assert [layer.kind for layer in shorter_encoder.layers].count("cross") == 6


def test_layers_without_attention_keep_no_cache():
    cost = kv_cache_cost(spec_of("ai21labs/Jamba-v0.1"), seq_len=1000)
    assert [layer.layer_index for layer in cost.layers] == [4, 12, 20, 28]
    assert cost.bytes_per_token == 4 * 2 * 8 * 128 * 2
    assert cost.mha_equivalent_bytes == 1000 * 4 * 2 * 32 * 128 * 2
    assert "no KV cache" in cost.note


def test_encoder_only_models_keep_no_cache():
    cost = kv_cache_cost(spec_of("sentence-transformers/all-MiniLM-L6-v2"), seq_len=256)
    assert not cost.applicable
    assert cost.total_bytes == cost.bytes_per_token == cost.mha_equivalent_bytes == 0
    assert "encoder-only" in cost.note


def test_kv_cost_as_dict_is_json_ready_and_leaves_out_the_layers():
    cost = kv_cache_cost(spec_of("google/gemma-2-9b"), seq_len=8192, batch=2)
    values = cost.as_dict()
    assert "layers" not in values
    assert json.loads(json.dumps(values)) == values
    for key in (
        "dtype",
        "batch",
        "seq_len",
        "bytes_per_token",
        "total_bytes",
        "mha_equivalent_bytes",
    ):
        assert key in values


# -- multimodal and MoE invariants ------------------------------------------------------------


def test_llava_counts_the_clip_tower_and_the_two_layer_projector():
    counts = parameter_counts(spec_of("llava-hf/llava-1.5-7b-hf"))
    width, inner, patches = 1024, 4096, (336 // 14) ** 2
    clip = (
        width * 3 * 14 * 14  # patch convolution, no bias
        + width  # class embedding
        + (patches + 1) * width  # positions, class token included
        + 2 * width  # pre_layrnorm
        + 24 * (4 * (width * width + width) + 2 * 2 * width + 2 * width * inner + inner + width)
        + 2 * width  # post_layernorm
    )
    projector = (width * 4096 + 4096) + (4096 * 4096 + 4096)
    assert clip == 303_507_456 and projector == 20_979_712
    assert counts.other == clip + projector
    assert counts.total == 7_063_427_072  # what transformers instantiates (not 6.74 B)


def test_paligemma_counts_the_siglip_tower_and_its_linear_projector():
    counts = parameter_counts(spec_of("google/paligemma-3b-pt-224"))
    width, inner, patches = 1152, 4304, (224 // 14) ** 2
    siglip = (
        width * 3 * 14 * 14 + width  # patch convolution with bias
        + patches * width
        + 27 * (4 * (width * width + width) + 2 * 2 * width + 2 * width * inner + inner + width)
        + 2 * width  # post_layernorm; no pooling head (vision_use_head=false)
    )  # fmt: skip
    assert counts.other == siglip + (width * 2048 + 2048)
    assert counts.lm_head == 0 and counts.total == 2_923_466_480


@pytest.mark.parametrize(
    "card_id",
    sorted(
        f"{path.parent.parent.name}/{path.parent.name}"
        for path in CARDS_ROOT.glob("*/*/config.json")
    ),
)
def test_moe_active_parameters_never_exceed_the_total(card_id):
    spec = spec_of(card_id)
    counts = parameter_counts(spec)
    if any(spec.mlp.moe_layers):
        assert 0 < counts.active < counts.total
        # Every expert active: nothing is left out.
        everything = from_config({**spec.raw, **_all_experts_active(spec)})
        assert parameter_counts(everything).active == parameter_counts(everything).total
    else:
        assert counts.active is None


def _all_experts_active(spec) -> dict:
    if spec.model_type == "dbrx":
        return {"ffn_config": {**spec.raw["ffn_config"], "moe_top_k": spec.mlp.num_experts}}
    return {"num_experts_per_tok": spec.mlp.num_experts}


def test_active_above_total_is_refused_by_the_counts():
    with pytest.raises(ValueError, match="active=11 must be in"):
        ParameterCounts(10, 10, 0, 0, 0, 0, 0, active=11)


def test_moe_without_experts_per_token_is_refused():
    # DeepseekV2Config defaults num_experts_per_tok to None: such a model cannot route tokens.
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        spec_of("deepseek-ai/DeepSeek-V2-Lite", num_experts_per_tok=None)
