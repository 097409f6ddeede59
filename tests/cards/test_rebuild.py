"""Rebuilt attention layers against transformers, and their sizes against the cost report.

Each parity test writes a tiny random checkpoint with transformers
(`save_pretrained`, safetensors), reads its `config.json` with `from_config`, rebuilds
every attention layer with `build_attention`, loads it with `load_attention_weights`
(through the family's tensor names, the table whole models load with)
and compares the layer's output with what transformers' own attention module (eager)
returns inside a forward pass of the whole model, captured with a forward hook. The
weights are perturbed before saving so that biases, norms and every projection are
non-trivial. Keras runs the rebuilt layer on the current backend; torch only runs
the reference.
"""

import json
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest

from keras_mha.errors import CheckpointError, UnsupportedModelError
from keras_mha.families import family_for
from keras_mha.hub import list_bundled, load_config
from keras_mha.layers import GroupedQueryAttention, MultiHeadAttention, MultiQueryAttention
from keras_mha.models import attention_layer_arguments, build_attention, load_attention_weights
from keras_mha.models.checkpoint_weights import attention_tensors, checkpoint_weight_names
from keras_mha.models.safetensors_reader import SafetensorsCheckpoint
from keras_mha.planning.costs import parameter_counts
from keras_mha.planning.spec import from_config
from tests.configs import tiny_llama

# The tiny models' attention outputs are of order 1-3; float32 round-off stays below 1e-6.
ATOL = 1e-5

NOT_REPRESENTABLE = {
    "databricks/dbrx-base": "clips q, k and v",
    "deepseek-ai/DeepSeek-V2-Lite": "multi-head latent attention",
    "deepseek-ai/DeepSeek-V3": "multi-head latent attention",
    "google-t5/t5-small": "relative position bias",
    "google/flan-t5-base": "relative position bias",
}


def bundled_spec(model_id):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return from_config(load_config(f"bundled:{model_id}").config, model_id=model_id)


def trainable_parameters(layer):
    return sum(int(np.prod(weight.shape)) for weight in layer.trainable_weights)


# -- sizes against the cost report ----------------------------------------------------------


@pytest.mark.parametrize("model_id", list_bundled())
def test_parameters_per_layer_match_the_report(model_id):
    spec = bundled_spec(model_id)
    first = spec.attention_layer_indices[0]
    if model_id in NOT_REPRESENTABLE:
        with pytest.raises(NotImplementedError, match=NOT_REPRESENTABLE[model_id]):
            build_attention(spec, first)
        return
    # Zeros: the count does not depend on the values, and filling 150M weights with
    # random numbers (Llama 3.1 70B) would only cost time.
    layer = build_attention(spec, first, kernel_initializer="zeros")
    assert layer.count_params() == trainable_parameters(layer) + layer.num_heads  # head gates
    report = parameter_counts(spec).attention
    if spec.is_encoder_decoder:
        cross = build_attention(spec, 0, attention="cross", kernel_initializer="zeros")
        encoder = build_attention(spec, 0, attention="encoder", kernel_initializer="zeros")
        assert report == (
            spec.num_layers * trainable_parameters(layer)
            + spec.num_hidden_layers * trainable_parameters(cross)
            + spec.encoder.num_encoder_layers * trainable_parameters(encoder)
        )
    else:
        assert report == spec.num_layers * trainable_parameters(layer)


@pytest.mark.parametrize(
    "model_id,layer_class",
    [
        ("openai-community/gpt2", MultiHeadAttention),
        ("tiiuae/falcon-7b", MultiQueryAttention),
        ("meta-llama/Meta-Llama-3-8B", GroupedQueryAttention),
    ],
)
def test_layer_class_follows_the_attention_kind(model_id, layer_class):
    layer = build_attention(bundled_spec(model_id), 0, build=False)
    assert type(layer) is layer_class


def test_per_layer_configuration_of_gemma_3():
    spec = bundled_spec("google/gemma-3-4b-it")
    sliding = attention_layer_arguments(spec, 0)
    full = attention_layer_arguments(spec, 5)
    assert spec.layer_kinds[0] == "sliding" and spec.layer_kinds[5] == "full"
    assert (
        sliding["sliding_window"] == spec.attention.sliding_window
        and full["sliding_window"] is None
    )
    assert (sliding["rope_theta"], sliding["rope_scaling"]) == (10000.0, None)
    assert full["rope_theta"] == 1e6 and full["rope_scaling"]["rope_type"] == "linear"
    assert sliding["use_qk_norm"] and sliding["attention_scale"] == 256**-0.5
    assert sliding["causal"] and not sliding["use_bias"] and not sliding["use_output_bias"]


def test_qwen2_biases_and_bert_is_bidirectional():
    qwen = attention_layer_arguments(bundled_spec("Qwen/Qwen2.5-0.5B"), 0)
    assert (qwen["use_bias"], qwen["use_output_bias"], qwen["causal"]) == (True, False, True)
    bert = attention_layer_arguments(bundled_spec("google-bert/bert-base-uncased"), 0)
    assert (bert["use_bias"], bert["use_output_bias"], bert["causal"]) == (True, True, False)
    assert not bert["use_rope"]


def test_layers_without_attention_and_bad_arguments_raise():
    jamba = bundled_spec("ai21labs/Jamba-v0.1")
    with pytest.raises(ValueError, match="layer_index=0 holds no attention"):
        build_attention(jamba, 0)
    assert not attention_layer_arguments(jamba, jamba.attention_layer_indices[0])["use_rope"]
    llama = bundled_spec("meta-llama/Llama-3.2-1B")
    with pytest.raises(ValueError, match=r"layer_index=16 must be an integer in \[0, 16\)"):
        build_attention(llama, 16)
    with pytest.raises(ValueError, match="needs an encoder-decoder model"):
        build_attention(llama, 0, attention="cross")
    with pytest.raises(ValueError, match="attention='decoder' must be one of"):
        build_attention(llama, 0, attention="decoder")
    with pytest.raises(ValueError, match=r"\['num_heads'\] come from the model's config"):
        build_attention(llama, 0, num_heads=4)
    with pytest.raises(NotImplementedError, match="layer 3 of this deepseek_v3 model is multi"):
        build_attention(bundled_spec("deepseek-ai/DeepSeek-V3"), 3)


def test_unsupported_rope_scaling_is_named():
    spec = from_config(tiny_llama(rope_scaling={"rope_type": "yarn", "factor": 4.0}))
    with pytest.raises(UnsupportedModelError, match="rope_type='yarn'"):
        build_attention(spec, 0)


@pytest.mark.backend_independent
def test_rebuilding_is_exported_without_importing_keras():
    code = (
        "import sys, keras_mha.models as models\n"
        "assert callable(models.load_attention_weights)\n"
        "assert 'keras' not in sys.modules, 'keras imported by load_attention_weights'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- finding tensors through the family tables (no checkpoint needed) --------------------------


def hub_names(family, keys, layer_index, attention="self"):
    names = family_for(family).weights
    return [t.hub_name for t in attention_tensors(names, keys, layer_index, attention=attention)]


@pytest.mark.backend_independent
def test_attention_tensors_come_from_the_family_table():
    qwen3 = hub_names("qwen3", ["model.embed_tokens.weight"], 1)
    assert "model.layers.1.self_attn.q_proj.weight" in qwen3
    assert "model.layers.1.self_attn.k_norm.weight" in qwen3
    bert = hub_names("bert", ["embeddings.word_embeddings.weight"], 2)
    assert "encoder.layer.2.attention.output.dense.weight" in bert
    neox = hub_names("gpt_neox", ["gpt_neox.embed_in.weight"], 0)
    assert neox[:2] == [
        "gpt_neox.layers.0.attention.query_key_value.weight",
        "gpt_neox.layers.0.attention.query_key_value.bias",
    ]
    bart = ["model.decoder.embed_positions.weight"]
    assert hub_names("bart", bart, 0)[0] == "model.decoder.layers.0.self_attn.q_proj.weight"
    assert hub_names("bart", bart, 0, "cross")[0] == (
        "model.decoder.layers.0.encoder_attn.q_proj.weight"
    )
    assert hub_names("bart", bart, 0, "encoder")[0] == (
        "model.encoder.layers.0.self_attn.q_proj.weight"
    )
    with pytest.raises(CheckpointError, match="have no 'cross' attention"):
        hub_names("llama", ["model.embed_tokens.weight"], 0, "cross")


@pytest.mark.backend_independent
def test_the_language_model_is_picked_over_a_vision_tower():
    keys = [
        "model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight",
        "model.language_model.embed_tokens.weight",
        "model.language_model.layers.0.self_attn.q_proj.weight",
    ]
    assert hub_names("gemma3_text", keys, 0)[0] == (
        "model.language_model.layers.0.self_attn.q_proj.weight"
    )


@pytest.mark.backend_independent
def test_without_a_config_the_family_is_found_from_the_tensor_names():
    def layer_keys(*names):
        return ["model.embed_tokens.weight"] + [f"model.layers.0.self_attn.{n}" for n in names]

    llama = layer_keys("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")
    found = checkpoint_weight_names(llama, 0, family=None, attention="self", where="x")

    # Several families share Llama's names; any of them reads the same tensors the same way.
    def present(names):
        return [t for t in attention_tensors(names, llama, 0) if t.hub_name in llama]

    assert present(found) == present(family_for("llama").weights)
    # q/k norms stored as w (Qwen3) or as 1 + w's w (Gemma 3): the names cannot tell.
    normed = llama + layer_keys("q_norm.weight", "k_norm.weight")
    with pytest.raises(CheckpointError, match=r"several families .*gemma3_text.*qwen3"):
        checkpoint_weight_names(normed, 0, family=None, attention="self", where="x")
    falcon = [
        "transformer.word_embeddings.weight",
        "transformer.h.0.self_attention.query_key_value.weight",
        "transformer.h.0.self_attention.dense.weight",
    ]
    found = checkpoint_weight_names(falcon, 0, family=None, attention="self", where="x")
    assert found is family_for("falcon").weights
    with pytest.raises(CheckpointError, match="no attention tensors of layer_index=3"):
        checkpoint_weight_names(llama, 3, family=None, attention="self", where="x.safetensors")


# -- parity with transformers ------------------------------------------------------------------

SMALL = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "vocab_size": 100,
}
GPT2_SMALL = {"n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 100, "n_positions": 32}
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # Small, so that the 9 test positions see the scaled frequencies.
    "original_max_position_embeddings": 16,
}

# id -> (transformers config class, its arguments, attention module of layer {i})
DECODER_CASES = {
    "llama_gqa_llama3_rope": (
        "LlamaConfig",
        {**SMALL, "num_key_value_heads": 2, "head_dim": 16, "rope_scaling": LLAMA3_SCALING},
        "model.layers.{i}.self_attn",
    ),
    "qwen3_qk_norm": (
        "Qwen3Config",
        {**SMALL, "num_key_value_heads": 2, "head_dim": 16},
        "model.layers.{i}.self_attn",
    ),
    "qwen2_qkv_bias": (
        "Qwen2Config",
        {**SMALL, "num_key_value_heads": 2},
        "model.layers.{i}.self_attn",
    ),
    "mistral_mqa_sliding": (
        "MistralConfig",
        {**SMALL, "num_key_value_heads": 1, "head_dim": 16, "sliding_window": 4},
        "model.layers.{i}.self_attn",
    ),
    "gemma2_soft_cap_sliding": (
        "Gemma2Config",
        {
            **SMALL,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "sliding_window": 4,
            "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": 2.0,
        },
        "model.layers.{i}.self_attn",
    ),
    "gemma3_one_plus_weight_norm_local_rope": (
        "Gemma3TextConfig",
        {
            **SMALL,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "sliding_window": 4,
            "query_pre_attn_scalar": 24,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        },
        "model.layers.{i}.self_attn",
    ),
    "phi3_fused_qkv_sliding": (
        "Phi3Config",
        {
            **SMALL,
            "num_key_value_heads": 2,
            "sliding_window": 5,
            "pad_token_id": 0,
            "eos_token_id": 1,
        },
        "model.layers.{i}.self_attn",
    ),
    "phi2_partial_rotary": (
        "PhiConfig",
        {**SMALL, "partial_rotary_factor": 0.5},
        "model.layers.{i}.self_attn",
    ),
    "gpt_neox_interleaved_qkv": (
        "GPTNeoXConfig",
        {**SMALL, "rotary_pct": 0.25},
        "gpt_neox.layers.{i}.attention",
    ),
    "gpt2_conv1d_c_attn": (
        "GPT2Config",
        {**GPT2_SMALL, "bos_token_id": 0, "eos_token_id": 0},
        "transformer.h.{i}.attn",
    ),
    "gpt2_inverse_layer_scale": (
        "GPT2Config",
        {
            **GPT2_SMALL,
            "bos_token_id": 0,
            "eos_token_id": 0,
            "scale_attn_by_inverse_layer_idx": True,
        },
        "transformer.h.{i}.attn",
    ),
    "gpt_bigcode_mqa": (
        "GPTBigCodeConfig",
        {**GPT2_SMALL, "bos_token_id": 0, "eos_token_id": 0, "multi_query": True},
        "transformer.h.{i}.attn",
    ),
    "gpt_bigcode_mha_interleaved": (
        "GPTBigCodeConfig",
        {**GPT2_SMALL, "bos_token_id": 0, "eos_token_id": 0, "multi_query": False},
        "transformer.h.{i}.attn",
    ),
    "opt_out_proj": (
        "OPTConfig",
        {
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "ffn_dim": 128,
            "vocab_size": 100,
            "max_position_embeddings": 32,
            "word_embed_proj_dim": 64,
        },
        "model.decoder.layers.{i}.self_attn",
    ),
}
BATCH, LENGTH = 2, 9


@pytest.fixture(scope="module")
def transformers():
    pytest.importorskip("torch")
    return pytest.importorskip("transformers")


def perturb_and_save(model, directory, **save_kwargs):
    """Random offsets on every weight (biases and norms start at 0 / 1), then save."""
    import torch

    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    model.save_pretrained(directory, **save_kwargs)
    return from_config(json.loads((directory / "config.json").read_text()))


def capture_attention(model, module_names, **inputs):
    """{module name: (hidden states in, attention output, other kwargs)} of one forward pass."""
    import torch

    modules = dict(model.named_modules())
    captured, hooks = {}, []
    for name in module_names:

        def hook(module, args, kwargs, output, name=name):
            hidden = args[0] if args else kwargs["hidden_states"]
            result = output[0] if isinstance(output, tuple) else output
            extra = {k: v.numpy() for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
            captured[name] = (hidden.numpy(), result.numpy(), extra)

        hooks.append(modules[name].register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in hooks:
            handle.remove()
    return captured


def padded_batch(seed=0):
    """Token ids and a mask whose second row is left-padded by 2."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 100, (BATCH, LENGTH), generator=generator)
    mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
    mask[1, :2] = 0
    return ids, mask


@pytest.fixture(scope="module")
def decoder_checkpoints(transformers, tmp_path_factory):
    """Lazily written tiny checkpoints, with the spec read back and the reference outputs."""
    import torch

    made = {}

    def make(case_id):
        if case_id not in made:
            config_class, arguments, module_pattern = DECODER_CASES[case_id]
            torch.manual_seed(0)
            config = getattr(transformers, config_class)(**arguments)
            model = transformers.AutoModelForCausalLM.from_config(
                config, attn_implementation="eager"
            ).eval()
            directory = tmp_path_factory.mktemp(case_id)
            spec = perturb_and_save(model, directory)
            ids, mask = padded_batch()
            names = [module_pattern.format(i=i) for i in spec.attention_layer_indices]
            captured = capture_attention(model, names, input_ids=ids, attention_mask=mask)
            references = {
                i: captured[module_pattern.format(i=i)] for i in spec.attention_layer_indices
            }
            made[case_id] = (directory, spec, references, mask.numpy().astype(bool), model)
        return made[case_id]

    return make


@pytest.mark.slow
@pytest.mark.parametrize("case_id", list(DECODER_CASES))
def test_rebuilt_decoder_layers_match_transformers(decoder_checkpoints, case_id):
    directory, spec, references, padding, _ = decoder_checkpoints(case_id)
    assert len(references) == spec.num_layers
    for layer_index, (hidden, expected, _) in references.items():
        layer = build_attention(spec, layer_index)
        sources = load_attention_weights(layer, directory, layer_index)
        assert set(sources) == {weight.name for weight in layer.trainable_weights}
        # The padding mask hides the left-padded keys; padded query rows are not compared.
        got = keras.ops.convert_to_numpy(layer(hidden, mask=padding))
        np.testing.assert_allclose(
            got[padding], expected[padding], atol=ATOL, rtol=0, err_msg=f"layer {layer_index}"
        )


@pytest.mark.slow
def test_jamba_attention_layers_match_transformers(transformers, tmp_path):
    """Jamba's attention layers use no RoPE; only layers at attn_layer_offset hold attention."""
    import torch

    torch.manual_seed(0)
    config = transformers.JambaConfig(
        **SMALL,
        num_key_value_heads=2,
        attn_layer_period=2,
        attn_layer_offset=1,
        expert_layer_period=2,
        expert_layer_offset=1,
        num_experts=2,
        mamba_d_state=4,
        mamba_dt_rank=8,
    )
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    spec = perturb_and_save(model.eval(), tmp_path)
    assert spec.attention_layer_indices == (1,)
    ids, mask = padded_batch()
    name = "model.layers.1.self_attn"
    hidden, expected, _ = capture_attention(model, [name], input_ids=ids, attention_mask=mask)[name]
    layer = build_attention(spec, 1)
    load_attention_weights(layer, tmp_path, 1)
    padding = mask.numpy().astype(bool)
    got = keras.ops.convert_to_numpy(layer(hidden, mask=padding))
    np.testing.assert_allclose(got[padding], expected[padding], atol=ATOL, rtol=0)


@pytest.mark.slow
def test_bart_encoder_decoder_and_cross_attention_match_transformers(transformers, tmp_path):
    import torch

    torch.manual_seed(0)
    config = transformers.BartConfig(
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        vocab_size=100,
        max_position_embeddings=32,
    )
    model = transformers.AutoModel.from_config(config, attn_implementation="eager").eval()
    spec = perturb_and_save(model, tmp_path)
    ids, mask = padded_batch()
    decoder_ids, _ = padded_batch(seed=1)
    names = {
        ("encoder", 1): "encoder.layers.1.self_attn",
        ("self", 1): "decoder.layers.1.self_attn",
        ("cross", 1): "decoder.layers.1.encoder_attn",
    }
    captured = capture_attention(
        model,
        list(names.values()),
        input_ids=ids,
        attention_mask=mask,
        decoder_input_ids=decoder_ids,
    )
    padding = mask.numpy().astype(bool)
    for (attention, layer_index), name in names.items():
        hidden, expected, extra = captured[name]
        layer = build_attention(spec, layer_index, attention=attention)
        load_attention_weights(layer, tmp_path, layer_index, attention=attention)
        if attention == "encoder":
            got = keras.ops.convert_to_numpy(layer(hidden, mask=padding))
            got, expected = got[padding], expected[padding]
        elif attention == "cross":
            encoder_states = extra["key_value_states"]
            got = keras.ops.convert_to_numpy(layer(hidden, encoder_states, value_mask=padding))
        else:
            got = keras.ops.convert_to_numpy(layer(hidden))
        np.testing.assert_allclose(got, expected, atol=ATOL, rtol=0, err_msg=attention)


# -- checkpoint formats --------------------------------------------------------------------------


def weights_of(layer):
    return {weight.name: keras.ops.convert_to_numpy(weight) for weight in layer.trainable_weights}


@pytest.mark.slow
def test_sharded_and_bfloat16_checkpoints(decoder_checkpoints, tmp_path):
    import torch

    directory, spec, _, _, model = decoder_checkpoints("llama_gqa_llama3_rope")
    single = build_attention(spec, 1)
    load_attention_weights(single, directory, 1)

    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    sharded = build_attention(spec, 1)
    load_attention_weights(sharded, tmp_path / "sharded", 1)
    for name, value in weights_of(single).items():
        np.testing.assert_array_equal(weights_of(sharded)[name], value, err_msg=name)

    # bfloat16 has no NumPy dtype: the loader widens the raw bits, exactly as torch does.
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    model.to(torch.float32)
    assert SafetensorsCheckpoint(tmp_path / "bf16").get("lm_head.weight").dtype == np.float32
    widened = build_attention(spec, 1)
    load_attention_weights(widened, tmp_path / "bf16", 1)
    bfloat16_layer = build_attention(spec, 1, dtype="bfloat16")
    load_attention_weights(bfloat16_layer, tmp_path / "bf16", 1)
    for name, value in weights_of(single).items():
        rounded = torch.from_numpy(value).to(torch.bfloat16).float().numpy()
        np.testing.assert_array_equal(weights_of(widened)[name], rounded, err_msg=name)
        in_bfloat16 = weights_of(bfloat16_layer)[name].astype(np.float32)
        np.testing.assert_array_equal(in_bfloat16, rounded, err_msg=name)


@pytest.mark.slow
def test_load_errors_name_the_tensor_and_the_file(decoder_checkpoints, tmp_path):
    directory, spec, _, _, _ = decoder_checkpoints("qwen2_qkv_bias")
    file = directory / "model.safetensors"

    wrong_heads = GroupedQueryAttention(num_heads=8, num_key_value_heads=2, head_dim=16)
    wrong_heads.build((None, None, 64))
    with pytest.raises(CheckpointError, match=r"q_proj.weight' has shape \(64, 64\), but"):
        load_attention_weights(wrong_heads, directory, 0)

    no_bias = build_attention(spec, 0, build=False)
    no_bias = GroupedQueryAttention(**{**no_bias.get_config(), "use_bias": False})
    no_bias.build((None, None, 64))
    with pytest.raises(CheckpointError, match=r"holds 'model.layers.0.self_attn.q_proj.bias'"):
        load_attention_weights(no_bias, directory, 0)

    with_output_bias = GroupedQueryAttention(
        **{**build_attention(spec, 0, build=False).get_config(), "use_output_bias": True}
    )
    with_output_bias.build((None, None, 64))
    with pytest.raises(
        CheckpointError,
        match=rf"tensor 'model.layers.0.self_attn.o_proj.bias' not found in {file}",
    ):
        load_attention_weights(with_output_bias, directory, 0)

    layer = build_attention(spec, 0)
    with pytest.raises(CheckpointError, match="no model.safetensors or model.safetensors.index"):
        load_attention_weights(layer, tmp_path, 0)
    with pytest.raises(CheckpointError, match="no attention tensors of layer_index=5"):
        load_attention_weights(layer, directory, 5)
    with pytest.raises(ValueError, match="must be built before loading"):
        load_attention_weights(build_attention(spec, 0, build=False), directory, 0)
