"""`from_config`: every spelling, every family, and the errors, on raw config dicts."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from keras_mha.planning.errors import CardError, ConfigError
from keras_mha.planning.spec import ModelSpec, from_config

pytestmark = pytest.mark.backend_independent

CARDS_ROOT = Path(__file__).resolve().parents[2] / "cards"
CARD_IDS = sorted(
    f"{path.parent.parent.name}/{path.parent.name}" for path in CARDS_ROOT.glob("*/*/config.json")
)


def card(card_id: str) -> dict:
    return json.loads((CARDS_ROOT / card_id / "config.json").read_text())


def card_spec(card_id: str) -> ModelSpec:
    return from_config(card(card_id), model_id=card_id)


def unknown(**keys) -> dict:
    """A config of a family keras-mha does not know, with only the given keys."""
    return {"model_type": "brand_new_lm", "vocab_size": 1000, "intermediate_size": 64, **keys}


def read_unknown(config: dict) -> ModelSpec:
    with pytest.warns(UserWarning, match="brand_new_lm"):
        return from_config(config)


# -- the bundled cards --------------------------------------------------------------------------


def test_at_least_32_cards_are_bundled():
    assert len(CARD_IDS) >= 32
    assert "meta-llama/Meta-Llama-3-8B" in CARD_IDS


@pytest.mark.parametrize("card_id", CARD_IDS)
def test_every_card_reads_without_warnings_from_python(card_id):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = card_spec(card_id)
    assert spec.model_id == card_id
    assert spec.raw == card(card_id)
    assert len(spec.layer_kinds) == spec.num_hidden_layers
    assert spec.num_layers == spec.num_hidden_layers - spec.layer_kinds.count("none")
    assert spec.attention.num_attention_heads % spec.attention.num_key_value_heads == 0
    assert spec.attention_kind in ("MHA", "GQA", "MQA", "MLA")
    assert spec.architecture == card(card_id)["architectures"][0]


# (card, kind, layers, heads, kv heads, head_dim, hidden, window, {full, sliding, none})
CARD_FACTS = [
    ("openai-community/gpt2", "MHA", 12, 12, 12, 64, 768, None, (12, 0, 0)),
    ("google-bert/bert-base-uncased", "MHA", 12, 12, 12, 64, 768, None, (12, 0, 0)),
    ("google-t5/t5-small", "MHA", 6, 8, 8, 64, 512, None, (6, 0, 0)),
    ("google/flan-t5-base", "MHA", 12, 12, 12, 64, 768, None, (12, 0, 0)),
    ("meta-llama/Meta-Llama-3-8B", "GQA", 32, 32, 8, 128, 4096, None, (32, 0, 0)),
    ("meta-llama/Llama-3.2-1B", "GQA", 16, 32, 8, 64, 2048, None, (16, 0, 0)),
    ("mistralai/Mistral-7B-v0.1", "GQA", 32, 32, 8, 128, 4096, 4096, (0, 32, 0)),
    ("Qwen/Qwen2.5-7B", "GQA", 28, 28, 4, 128, 3584, None, (28, 0, 0)),
    ("Qwen/Qwen3-30B-A3B", "GQA", 48, 32, 4, 128, 2048, None, (48, 0, 0)),
    ("google/gemma-2b", "MQA", 18, 8, 1, 256, 2048, None, (18, 0, 0)),
    ("google/gemma-2-9b", "GQA", 42, 16, 8, 256, 3584, 4096, (21, 21, 0)),
    ("google/gemma-3-1b-pt", "MQA", 26, 4, 1, 256, 1152, 512, (4, 22, 0)),
    ("google/gemma-3-4b-it", "GQA", 34, 8, 4, 256, 2560, 1024, (5, 29, 0)),
    ("microsoft/phi-2", "MHA", 32, 32, 32, 80, 2560, None, (32, 0, 0)),
    ("microsoft/Phi-3-mini-4k-instruct", "MHA", 32, 32, 32, 96, 3072, 2047, (0, 32, 0)),
    ("tiiuae/falcon-7b", "MQA", 32, 71, 1, 64, 4544, None, (32, 0, 0)),
    ("tiiuae/falcon-40b", "GQA", 60, 128, 8, 64, 8192, None, (60, 0, 0)),
    ("bigcode/starcoder", "MQA", 40, 48, 1, 128, 6144, None, (40, 0, 0)),
    ("EleutherAI/pythia-1b", "MHA", 16, 8, 8, 256, 2048, None, (16, 0, 0)),
    ("facebook/opt-1.3b", "MHA", 24, 32, 32, 64, 2048, None, (24, 0, 0)),
    ("deepseek-ai/DeepSeek-V2-Lite", "MLA", 27, 16, 16, 192, 2048, None, (27, 0, 0)),
    ("deepseek-ai/DeepSeek-V3", "MLA", 61, 128, 128, 192, 7168, None, (61, 0, 0)),
    ("ai21labs/Jamba-v0.1", "GQA", 32, 32, 8, 128, 4096, None, (4, 0, 28)),
    ("facebook/bart-large", "MHA", 12, 16, 16, 64, 1024, None, (12, 0, 0)),
    ("databricks/dbrx-base", "GQA", 40, 48, 8, 128, 6144, None, (40, 0, 0)),
    ("llava-hf/llava-1.5-7b-hf", "MHA", 32, 32, 32, 128, 4096, None, (32, 0, 0)),
    ("google/paligemma-3b-pt-224", "MQA", 18, 8, 1, 256, 2048, None, (18, 0, 0)),
]


@pytest.mark.parametrize(
    ("card_id", "kind", "layers", "heads", "kv_heads", "head_dim", "hidden", "window", "kinds"),
    CARD_FACTS,
)
def test_card_facts(card_id, kind, layers, heads, kv_heads, head_dim, hidden, window, kinds):
    spec = card_spec(card_id)
    assert spec.attention_kind == kind
    assert spec.num_hidden_layers == layers
    assert (spec.attention.num_attention_heads, spec.attention.num_key_value_heads) == (
        heads,
        kv_heads,
    )
    assert (spec.attention.head_dim, spec.hidden_size, spec.attention.sliding_window) == (
        head_dim,
        hidden,
        window,
    )
    counts = spec.layer_kind_counts()
    assert (counts["full"], counts["sliding"], counts["none"]) == kinds


# -- spellings ----------------------------------------------------------------------------------


@pytest.mark.parametrize("heads_key", ["num_attention_heads", "n_head", "num_heads", "n_heads"])
@pytest.mark.parametrize("hidden_key", ["hidden_size", "n_embd", "d_model"])
@pytest.mark.parametrize("layers_key", ["num_hidden_layers", "n_layer", "num_layers", "n_layers"])
def test_generic_spellings_of_heads_hidden_and_layers(heads_key, hidden_key, layers_key):
    spec = read_unknown(unknown(**{heads_key: 8, hidden_key: 512, layers_key: 3}))
    assert (spec.attention.num_attention_heads, spec.hidden_size, spec.num_hidden_layers) == (
        8,
        512,
        3,
    )
    assert (spec.attention.num_key_value_heads, spec.attention.head_dim) == (8, 64)


def test_encoder_attention_heads_is_the_last_resort_for_heads():
    spec = read_unknown(unknown(encoder_attention_heads=4, hidden_size=64, num_hidden_layers=2))
    assert spec.attention.num_attention_heads == 4


@pytest.mark.parametrize("kv_key", ["num_key_value_heads", "num_kv_heads", "n_head_kv"])
def test_generic_spellings_of_kv_heads(kv_key):
    spec = read_unknown(unknown(num_attention_heads=8, hidden_size=256, n_layer=2, **{kv_key: 2}))
    assert (spec.attention.num_key_value_heads, spec.attention_kind) == (2, "GQA")


@pytest.mark.parametrize("head_dim_key", ["head_dim", "d_kv"])
def test_explicit_head_dim_wins_over_hidden_over_heads(head_dim_key):
    spec = read_unknown(
        unknown(num_attention_heads=8, hidden_size=256, n_layer=2, **{head_dim_key: 96})
    )
    assert spec.attention.head_dim == 96


@pytest.mark.parametrize(
    ("keys", "kv_heads", "kind"),
    [
        ({"multi_query": True, "new_decoder_architecture": False}, 1, "MQA"),
        ({"multi_query": False, "new_decoder_architecture": False}, 16, "MHA"),
        ({"new_decoder_architecture": True, "num_kv_heads": 4}, 4, "GQA"),
        ({"new_decoder_architecture": True, "multi_query": True, "num_kv_heads": 2}, 2, "GQA"),
        ({"new_decoder_architecture": True}, 16, "MHA"),
        ({}, 1, "MQA"),  # FalconConfig: multi_query defaults to true
    ],
)
def test_falcon_kv_heads(keys, kv_heads, kind):
    config = {"model_type": "falcon", "hidden_size": 1024, "num_attention_heads": 16}
    spec = from_config({**config, "num_hidden_layers": 2, "vocab_size": 100, **keys})
    assert (spec.attention.num_key_value_heads, spec.attention_kind) == (kv_heads, kind)


def test_old_falcon_refinedweb_configs():
    spec = from_config(
        {
            "model_type": "RefinedWeb",
            "hidden_size": 8192,
            "n_head": 128,
            "n_head_kv": 8,
            "n_layer": 60,
            "vocab_size": 65024,
        }
    )
    assert (
        spec.attention.num_attention_heads,
        spec.attention.num_key_value_heads,
        spec.num_layers,
    ) == (128, 8, 60)
    assert spec.norms.norms_per_layer == 2  # new decoder architecture: ln_attn and ln_mlp


@pytest.mark.parametrize(("multi_query", "kv_heads"), [(True, 1), (False, 12), (None, 1)])
def test_gpt_bigcode_multi_query(multi_query, kv_heads):
    config = {"model_type": "gpt_bigcode", "n_embd": 768, "n_head": 12, "n_layer": 2}
    if multi_query is not None:
        config["multi_query"] = multi_query
    assert from_config({**config, "vocab_size": 100}).attention.num_key_value_heads == kv_heads


def test_dbrx_nested_attn_and_ffn_config():
    spec = card_spec("databricks/dbrx-base")
    assert (
        spec.attention.num_key_value_heads,
        spec.positions.rope_theta,
        spec.attention.qkv_clip,
    ) == (8, 500000.0, 8.0)
    assert (spec.mlp.num_experts, spec.mlp.num_experts_per_tok, spec.mlp.moe_intermediate_size) == (
        16,
        4,
        10752,
    )
    assert spec.norms.norm_type == "layer" and not spec.norms.norm_bias


def test_t5_num_layers_and_num_decoder_layers():
    spec = from_config({**card("google-t5/t5-small"), "num_decoder_layers": 3})
    assert (spec.encoder.num_encoder_layers, spec.num_hidden_layers, spec.num_layers) == (6, 3, 3)
    assert (
        spec.is_encoder_decoder
        and spec.attention.head_dim == 64
        and spec.attention.attention_scale == 1.0
    )
    flan = card_spec("google/flan-t5-base")
    assert (flan.mlp.mlp_kind, flan.mlp.hidden_act, flan.tie_word_embeddings) == (
        "gated",
        "gelu",
        False,
    )


def test_bart_encoder_and_decoder():
    spec = card_spec("facebook/bart-large")
    assert spec.is_encoder_decoder and spec.head_kind == "base"
    assert (spec.encoder.num_encoder_layers, spec.num_hidden_layers) == (12, 12)
    assert (spec.encoder.encoder_attention_heads, spec.attention.num_attention_heads) == (16, 16)
    assert (
        spec.positions.learned_position_rows == 1026 and spec.positions.learned_position_tables == 2
    )


def test_bart_generic_aliases_win_like_in_transformers():
    spec = from_config({**card("facebook/bart-large"), "encoder_layers": 3})
    assert spec.encoder.num_encoder_layers == 12  # num_hidden_layers=12 aliases encoder_layers


# -- sliding windows ----------------------------------------------------------------------------


def mistral(**keys) -> dict:
    config = {
        "model_type": "mistral",
        "hidden_size": 256,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "num_hidden_layers": 4,
        "intermediate_size": 512,
        "vocab_size": 100,
    }
    return {**config, **keys}


def test_mistral_window_applies_to_every_layer_and_defaults_like_transformers():
    assert from_config(mistral(sliding_window=128)).layer_kinds == ("sliding",) * 4
    assert from_config(mistral(sliding_window=None)).attention.sliding_window is None
    # MistralConfig's default window is 4096 when the key is absent.
    assert from_config(mistral()).attention.sliding_window == 4096


def test_qwen2_use_sliding_window_and_max_window_layers():
    config = {**card("Qwen/Qwen2.5-7B"), "num_hidden_layers": 6}
    off = from_config(config)
    assert off.attention.sliding_window is None and off.layer_kinds == ("full",) * 6
    on = from_config({**config, "use_sliding_window": True, "max_window_layers": 4})
    assert on.layer_kinds == ("full",) * 4 + ("sliding",) * 2
    assert on.attention.sliding_window == 131072


def test_layer_types_list_wins():
    layer_types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    spec = from_config(mistral(sliding_window=64, layer_types=layer_types))
    assert spec.layer_kinds == ("sliding", "full", "sliding", "full")


def test_layer_types_with_linear_attention_have_no_attention():
    layer_types = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
    spec = read_unknown(
        unknown(
            num_attention_heads=8, hidden_size=256, num_hidden_layers=4, layer_types=layer_types
        )
    )
    assert spec.layer_kinds == ("none", "none", "none", "full")
    assert (spec.num_layers, spec.num_hidden_layers) == (1, 4)


def test_layer_types_of_the_wrong_length_is_an_error():
    with pytest.raises(ConfigError, match="layer_types"):
        from_config(mistral(layer_types=["full_attention"]))


def test_gemma2_alternates_starting_with_a_sliding_layer():
    kinds = card_spec("google/gemma-2-9b").layer_kinds
    assert kinds[:4] == ("sliding", "full", "sliding", "full")


def test_gemma3_sliding_window_pattern():
    kinds = card_spec("google/gemma-3-1b-pt").layer_kinds
    assert [i for i, kind in enumerate(kinds) if kind == "full"] == [5, 11, 17, 23]
    pattern_3 = from_config({**card("google/gemma-3-1b-pt"), "sliding_window_pattern": 3})
    assert pattern_3.layer_kind_counts()["full"] == 8


def test_sliding_window_on_a_family_without_windows_is_ignored_with_a_note():
    config = {**card("meta-llama/Llama-3.2-1B"), "sliding_window": 1024}
    spec = from_config(config)
    assert spec.attention.sliding_window is None
    assert any("sliding_window=1024 is ignored" in note for note in spec.warnings)


# -- MLA, MoE, hybrids, multimodal --------------------------------------------------------------


def test_deepseek_mla_fields():
    spec = card_spec("deepseek-ai/DeepSeek-V3")
    assert (spec.attention.kv_lora_rank, spec.attention.q_lora_rank) == (512, 1536)
    assert (
        spec.attention.qk_nope_head_dim,
        spec.attention.qk_rope_head_dim,
        spec.attention.value_head_dim,
    ) == (128, 64, 128)
    assert spec.attention.head_dim == 192
    # YaRN with mscale_all_dim=1, factor=40: scale = 192**-0.5 * (0.1 * ln 40 + 1)**2.
    assert spec.attention.attention_scale == pytest.approx(
        192**-0.5 * (0.1 * 3.6888794541 + 1) ** 2
    )
    lite = card_spec("deepseek-ai/DeepSeek-V2-Lite")
    assert lite.attention.q_lora_rank is None and lite.positions.rope_scaling["type"] == "yarn"


def test_moe_fields():
    mixtral = card_spec("mistralai/Mixtral-8x7B-v0.1")
    assert (mixtral.mlp.num_experts, mixtral.mlp.num_experts_per_tok) == (8, 2)
    assert all(mixtral.mlp.moe_layers)
    v3 = card_spec("deepseek-ai/DeepSeek-V3")
    assert v3.mlp.moe_layers[:4] == (False, False, False, True) and sum(v3.mlp.moe_layers) == 58
    assert (v3.mlp.num_shared_experts, v3.mlp.shared_expert_intermediate_size) == (1, 2048)
    qwen = from_config({**card("Qwen/Qwen3-30B-A3B"), "decoder_sparse_step": 2})
    assert qwen.mlp.moe_layers[:4] == (False, True, False, True)


def test_jamba_hybrid_layers():
    spec = card_spec("ai21labs/Jamba-v0.1")
    assert spec.attention_layer_indices == (4, 12, 20, 28)
    assert spec.mlp.moe_layers[:4] == (False, True, False, True)
    assert (spec.mamba.d_state, spec.mamba.dt_rank, spec.mamba.inner_size) == (16, 256, 8192)
    with pytest.raises(ValueError, match="layer_index=0 holds no attention"):
        spec.attention_layer(0)
    assert spec.attention_layer(4).num_key_value_heads == 8


def test_multimodal_text_config():
    spec = card_spec("google/gemma-3-4b-it")
    assert (spec.model_type, spec.text_model_type) == ("gemma3", "gemma3_text")
    assert spec.vocab_size == 262208 and spec.attention.qk_norm == "rms"
    assert spec.vision.num_layers == 27 and spec.vision.num_patches == 4096
    assert spec.positions.rope_scaling == {"factor": 8.0, "rope_type": "linear"}
    # Shape keys the text_config leaves out come from Gemma3TextConfig's defaults, noted.
    noted = " ".join(spec.warnings)
    for key in ("num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size"):
        assert f"text_config.{key} is not in the config" in noted


@pytest.mark.parametrize(
    ("card_id", "vision_type", "layers", "patches", "projector", "tied"),
    [
        ("llava-hf/llava-1.5-7b-hf", "clip_vision_model", 24, 576, "llava", False),
        ("google/paligemma-3b-pt-224", "siglip_vision_model", 27, 256, "paligemma", True),
        ("google/gemma-3-4b-it", "siglip_vision_model", 27, 4096, "gemma3", True),
    ],
)
def test_vision_towers(card_id, vision_type, layers, patches, projector, tied):
    spec = card_spec(card_id)
    assert (spec.vision.model_type, spec.vision.num_layers) == (vision_type, layers)
    assert (spec.vision.num_patches, spec.vision.projector) == (patches, projector)
    assert spec.tie_word_embeddings is tied


def test_llava_takes_the_text_configs_tying_like_llava_config():
    config = card("llava-hf/llava-1.5-7b-hf")
    config["text_config"] = {**config["text_config"], "tie_word_embeddings": True}
    assert from_config(config).tie_word_embeddings  # LlavaConfig.__post_init__


def test_unknown_multimodal_wrapper_notes_the_vision_tower_it_does_not_count():
    config = {**card("llava-hf/llava-1.5-7b-hf"), "model_type": "brand_new_vlm"}
    spec = from_config(config)
    assert spec.vision is None and spec.family == "llama"
    assert any("vision_config" in note and "not counted" in note for note in spec.warnings)


# -- biases, norms, positions, heads, scales ----------------------------------------------------


def test_bias_flags():
    qwen = card_spec("Qwen/Qwen2.5-0.5B")
    assert (
        qwen.attention.q_bias,
        qwen.attention.k_bias,
        qwen.attention.v_bias,
        qwen.attention.o_bias,
    ) == (True, True, True, False)
    llama = from_config({**card("meta-llama/Llama-3.2-1B"), "attention_bias": True})
    assert (llama.attention.q_bias, llama.attention.o_bias) == (True, True)
    gpt2 = card_spec("openai-community/gpt2")
    assert (
        gpt2.attention.q_bias
        and gpt2.attention.o_bias
        and gpt2.mlp.mlp_bias
        and gpt2.norms.norm_bias
    )
    assert not card_spec("tiiuae/falcon-7b").attention.q_bias
    assert card_spec("microsoft/phi-2").lm_head_bias


def test_qk_norms():
    assert card_spec("Qwen/Qwen3-8B").attention.qk_norm == "rms"
    assert card_spec("meta-llama/Meta-Llama-3-8B").attention.qk_norm is None
    phi = from_config({**card("microsoft/phi-2"), "qk_layernorm": True})
    assert phi.attention.qk_norm == "layer"


def test_rope_fields():
    llama = card_spec("meta-llama/Llama-3.1-8B")
    assert (
        llama.positions.rope_theta == 500000.0
        and llama.positions.rope_scaling["rope_type"] == "llama3"
    )
    assert card_spec("microsoft/phi-2").positions.partial_rotary_factor == 0.4
    pythia = card_spec("EleutherAI/pythia-1b")
    assert (pythia.positions.partial_rotary_factor, pythia.positions.rope_theta) == (0.25, 10000.0)
    assert card_spec("openai-community/gpt2").positions.position_embedding == "learned"
    assert card_spec("google-t5/t5-small").positions.position_embedding == "relative"


def test_rope_parameters_written_by_transformers_5():
    config = mistral(rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    assert from_config(config).positions.rope_theta == 1e6


def test_soft_caps_and_query_pre_attn_scalar():
    spec = card_spec("google/gemma-2-9b")
    assert (spec.attention.attn_logit_softcapping, spec.attention.final_logit_softcapping) == (
        50.0,
        30.0,
    )
    assert (
        spec.attention.query_pre_attn_scalar == 256 and spec.attention.attention_scale == 256**-0.5
    )


def test_gemma3_layers_rotate_with_their_own_base():
    spec = card_spec("google/gemma-3-4b-it")
    local, full = spec.attention_layer(0), spec.attention_layer(5)
    assert (local.kind, local.rope_theta, local.rope_scaling) == ("sliding", 10000.0, None)
    assert (full.kind, full.rope_theta, full.rope_scaling["factor"]) == ("full", 1e6, 8.0)
    assert local.sliding_window == 1024 and full.sliding_window is None


def test_tied_embeddings():
    assert card_spec("meta-llama/Llama-3.2-1B").tie_word_embeddings
    assert not card_spec("meta-llama/Meta-Llama-3-8B").tie_word_embeddings
    assert card_spec("google/gemma-7b").tie_word_embeddings  # GemmaConfig's default
    assert card_spec("openai-community/gpt2").tie_word_embeddings  # GPT2Config's default


@pytest.mark.parametrize(
    ("architecture", "head_kind", "pooler"),
    [("BertModel", "base", True), ("BertForMaskedLM", "masked_lm", False)],
)
def test_heads_come_from_architectures(architecture, head_kind, pooler):
    spec = from_config({**card("google-bert/bert-base-uncased"), "architectures": [architecture]})
    assert (spec.head_kind, spec.pooler, spec.is_decoder) == (head_kind, pooler, False)


def test_unknown_task_head_is_noted():
    config = {**card("meta-llama/Llama-3.2-1B"), "architectures": ["LlamaForTokenClassification"]}
    spec = from_config(config)
    assert spec.head_kind == "base"
    assert any("LlamaForTokenClassification" in note for note in spec.warnings)


def test_attention_layer_bounds():
    spec = card_spec("meta-llama/Llama-3.2-1B")
    assert spec.attention_layer(15).layer_index == 15
    with pytest.raises(ValueError, match=r"layer_index=16 must be an integer in \[0, 16\)"):
        spec.attention_layer(16)


# -- unknown families and errors ----------------------------------------------------------------


def test_unknown_model_type_warns_and_reads_generic_keys():
    with pytest.warns(UserWarning, match="model_type='brand_new_lm'"):
        spec = from_config(unknown(hidden_size=256, num_attention_heads=8, num_hidden_layers=2))
    assert spec.family == "generic" and spec.model_type == "brand_new_lm"
    assert any("brand_new_lm" in note for note in spec.warnings)


def test_missing_essential_key_names_the_keys_and_the_model_type():
    config = unknown(hidden_size=256, num_hidden_layers=2)
    with pytest.warns(UserWarning), pytest.raises(ConfigError) as error:
        from_config(config)
    message = str(error.value)
    for key in ("num_attention_heads", "n_head", "num_heads", "n_heads"):
        assert key in message
    assert "brand_new_lm" in message


def test_missing_hidden_size_names_every_spelling():
    with (
        pytest.warns(UserWarning),
        pytest.raises(ConfigError, match="hidden_size, n_embd, d_model"),
    ):
        from_config(unknown(num_attention_heads=8, num_hidden_layers=2))


def test_config_error_is_a_card_error_with_its_exit_code():
    with pytest.raises(CardError) as error:
        from_config(["not", "a", "dict"])
    assert error.value.exit_code == ConfigError.exit_code
    assert "JSON object" in str(error.value)


@pytest.mark.parametrize(
    ("keys", "match"),
    [
        ({"num_attention_heads": "eight"}, "num_attention_heads='eight'.*must be an integer"),
        ({"num_attention_heads": 0}, "num_attention_heads=0.*must be >= 1"),
        ({"num_key_value_heads": 3}, "num_key_value_heads=3 must divide num_attention_heads=8"),
        ({"hidden_size": 250, "head_dim": None}, "hidden_size=250 is not divisible"),
        ({"rope_scaling": "linear"}, "rope_scaling='linear'"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings='yes'.*true or false"),
    ],
)
def test_bad_values_are_named(keys, match):
    with pytest.raises(ConfigError, match=match):
        from_config(mistral(**keys))


def test_model_type_must_be_a_string():
    with pytest.raises(ConfigError, match="model_type=3"):
        from_config({"model_type": 3})


def test_the_spec_is_frozen():
    spec = card_spec("openai-community/gpt2")
    with pytest.raises(AttributeError):
        spec.num_layers = 3


def test_each_record_field_has_one_home():
    # from_config files the flat fields of a family module by name: a name in two records, or
    # in a record and on ModelSpec itself, would be filed in one place and lost in the other.
    from dataclasses import fields

    from keras_mha.planning.spec import RECORD_OF_FIELD, RECORDS

    names = [item.name for cls in RECORDS.values() for item in fields(cls)]
    assert len(names) == len(set(names)) == len(RECORD_OF_FIELD)
    assert not set(names) & {item.name for item in fields(ModelSpec)}
    spec = card_spec("meta-llama/Meta-Llama-3-8B")
    assert (spec.attention.num_key_value_heads, spec.positions.rope_theta) == (8, 500000.0)
    assert (spec.mlp.intermediate_size, spec.norms.norm_type) == (14336, "rms")
    assert spec.encoder.num_encoder_layers == 0
