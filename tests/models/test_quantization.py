"""Quantized whole models: `from_pretrained(quantize=)`, `model.quantize`, `.keras`, generation.

References: the same checkpoint loaded in float and quantized by Keras's `Model.quantize`
afterwards; transformers-free here (tests/models/test_parity.py ties the float model to
transformers). MiniLM's int8 embeddings are compared with its float ones on real text.
"""

import os

import keras
import numpy as np
import pytest
from keras import ops

from keras_mha.errors import ExportError, UsageError
from keras_mha.models import from_pretrained, generate, generation_stats, save_pretrained
from tests.cards.test_rebuild_minilm import SENTENCES, minilm_directory
from tests.models.test_minilm import sentence_embeddings
from tests.models_checkpoints import checkpoint


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return checkpoint(tmp_path_factory, "llama")


def _inputs(made):
    return {"token_ids": made.token_ids.astype("int32"), "padding_mask": made.padding_mask}


def _block_values(model):
    """`{block/layer/variable: value}` of the blocks' layers' own variables (paths differ:
    Keras names the Dense layers `quantize` makes outside a build scope by their own name)."""
    return {
        f"{index}/{layer.name}/{variable.name}": ops.convert_to_numpy(variable)
        for index, block in enumerate(model.blocks)
        for layer in block._flatten_layers()
        for variable in layer._trainable_variables + layer._non_trainable_variables
    }


# Llama (GQA, q/k/v apart, no biases), GPT-2 (one fused Conv1D q/k/v with biases) and BERT
# (an encoder): each quantized by the same Keras quantizer as after loading in float.
@pytest.mark.parametrize(
    ("case", "mode"),
    [("llama", "int8"), ("llama", "int4"), ("llama", "float8"), ("gpt2", "int4"), ("bert", "int8")],
)
def test_quantize_while_loading_equals_quantize_after(tmp_path_factory, tmp_path, case, mode):
    made = checkpoint(tmp_path_factory, case)
    after = from_pretrained(made.directory)
    after.quantize(mode)
    during = from_pretrained(made.directory, quantize=mode)
    # The same variables, bit for bit: int8 / packed int4 kernels, scales, zero points,
    # float8's scales and amax histories, and everything left in float.
    expected_values = _block_values(after)
    got_values = _block_values(during)
    assert sorted(got_values) == sorted(expected_values)
    for path, value in expected_values.items():
        assert got_values[path].dtype == value.dtype, path
        np.testing.assert_array_equal(got_values[path], value, err_msg=path)
    expected = ops.convert_to_numpy(after(_inputs(made)))
    np.testing.assert_array_equal(ops.convert_to_numpy(during(_inputs(made))), expected)
    block = during.blocks[0]
    mlp = block.down_proj if case != "bert" else block.output_dense
    assert block.attention.quantization_mode == mlp.quantization_mode == mode
    # The planner's generic formats: embeddings, LM head and norms stay in float.
    assert during.token_embedding.quantization_mode is None
    if case == "llama":
        assert during.lm_head.quantization_mode is None
        path = os.path.join(tmp_path, f"{mode}.keras")
        during.save(path)
        loaded = keras.models.load_model(path)
        np.testing.assert_array_equal(ops.convert_to_numpy(loaded(_inputs(made))), expected)


def test_half_quantized_model_loads_back(llama, tmp_path):
    # The 0.3 failure: quantized MLPs, float attention -> "Layer 'down_proj' expected 1
    # variables" on load. Quantized embeddings and LM head (Keras's own choice) too.
    model = from_pretrained(llama.directory)
    model.quantize("int8", filters=["proj", "embedding", "lm_head"])
    assert model.blocks[0].attention.quantization_mode is None
    assert model.token_embedding.quantization_mode == "int8"
    path = os.path.join(tmp_path, "half.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(loaded(_inputs(llama))), ops.convert_to_numpy(model(_inputs(llama)))
    )


def test_quantized_generate_is_its_own_greedy_argmax(llama):
    model = from_pretrained(llama.directory, quantize="int8")
    prompt = llama.token_ids[:1, :5].astype("int32")
    tokens = generate(model, prompt, 4)
    if keras.backend.backend() == "torch":  # Keras's quantized layers: not the whole-model step
        assert generation_stats(model)["step"] == "layers"
    logits = ops.convert_to_numpy(model(tokens[:, :-1]))
    np.testing.assert_array_equal(tokens[0, 5:], logits[0, 4:].argmax(-1))


def test_quantized_models_are_refused_where_float_weights_are_needed(llama, tmp_path):
    model = from_pretrained(llama.directory, quantize="int8")
    with pytest.raises(ExportError, match=r"quantized \(int8\)"):
        save_pretrained(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(UsageError, match="GPTQ and AWQ need calibration data"):
        from_pretrained(llama.directory, quantize="gptq")


def test_minilm_int8_embeddings_keep_cosine_to_float():
    transformers = pytest.importorskip("transformers")
    directory = minilm_directory()
    batch = transformers.AutoTokenizer.from_pretrained(directory)(
        SENTENCES, padding=True, return_tensors="np"
    )
    inputs = {
        "token_ids": batch["input_ids"].astype("int32"),
        "padding_mask": batch["attention_mask"],
    }
    mask = batch["attention_mask"]

    def embeddings(model):
        return sentence_embeddings(ops.convert_to_numpy(model(inputs)), mask)

    float_embeddings = embeddings(from_pretrained(directory))
    int8_embeddings = embeddings(from_pretrained(directory, quantize="int8"))
    cosine = (float_embeddings * int8_embeddings).sum(-1)  # both L2-normalised
    assert cosine.min() >= 0.99
    assert cosine.min() < 1 - 1e-6  # the weights were quantized


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    ("method", "named"),
    [
        ("gptq", "GPTQ"),
        ("awq", "AWQ"),
        ("bitsandbytes", "bitsandbytes"),
        ("compressed-tensors", "compressed-tensors"),
        ("aqlm", "a format keras-mha does not know"),
    ],
)
def test_other_quantized_checkpoints_are_refused_in_one_line(tmp_path, method, named):
    # fp8 blocks load (tests/models/test_fp8_checkpoints.py); the rest say what to do,
    # before any tensor is read.
    import json

    from keras_mha.errors import UnsupportedModelError

    config = {"model_type": "llama", "quantization_config": {"quant_method": method, "bits": 4}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    folder = tmp_path
    with pytest.raises(UnsupportedModelError, match=f"quant_method='{method}' \\({named}") as error:
        from_pretrained(folder)
    assert "load the float release with quantize=" in str(error.value)
    assert "\n" not in str(error.value)


def _variable_bytes(variables):
    # np.dtype does not know "bfloat16" by name.
    return sum(
        int(np.prod(v.shape))
        * (2 if str(v.dtype) == "bfloat16" else np.dtype(str(v.dtype)).itemsize)
        for v in variables
    )


@pytest.mark.parametrize(
    ("mode", "block_size"),
    [("int8", None), ("int4", None), ("int4", -1), ("int4", 64), ("float8", None)],
)
def test_keras_allocates_the_bytes_weight_formats_states(mode, block_size):
    # One description, read by the planner: Keras's Dense (which every quantized attention
    # projection is) against `weight_formats` on a shape whose blocks and columns are uneven.
    from keras_mha.models.quantize import keras_config
    from keras_mha.planning.weight_formats import runtime_format

    dense = keras.layers.Dense(301, use_bias=False, dtype="bfloat16")
    dense.build((None, 260))
    config = keras_config(mode)
    if block_size is not None:
        config = keras.quantizers.Int4QuantizationConfig(block_size=block_size)
    dense.quantize(mode, config=config)
    expected = runtime_format(mode, block_size).matrix_bytes(260, 301, "bfloat16")
    assert _variable_bytes(dense.variables) == expected


# Bundled cards scaled down (`bench model`'s scaling; one block, as every block is alike,
# and a 512-token vocabulary, so that the quantized matrices are most of the bytes): GQA
# with q/k norms and a separate LM head, and an encoder.
PLANNED_CARDS = ("Qwen/Qwen3-8B", "google-bert/bert-base-uncased")


@pytest.mark.parametrize("card", PLANNED_CARDS)
def test_quantized_model_variable_bytes_are_the_plans(card):
    import keras_mha
    from benchmarks.models import scaled_config
    from keras_mha.hub import load_config
    from keras_mha.models import build_model
    from keras_mha.planning.spec import from_config

    config = scaled_config(dict(load_config(f"bundled:{card}").config), 16)
    config.update(vocab_size=512, num_hidden_layers=1)
    pooler = 0
    if config["model_type"] == "bert":  # the planner counts a pooler the encoder does not build
        pooler = 2 * (config["hidden_size"] ** 2 + config["hidden_size"])
    for mode in ("int8", "int4"):
        model = build_model(from_config(config), dtype="bfloat16", initializer="zeros")
        model.quantize(mode)
        planned = keras_mha.plan(config, weights_dtype=mode).to_dict()["memory"]
        assert not planned["weights_format"]["plan_only"]
        assert planned["weights_format"]["runtime_mode"] == mode
        expected = planned["weights_bytes"][mode] - pooler
        assert abs(_variable_bytes(model.variables) / expected - 1) < 0.02, (card, mode)


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch.compile")
def test_quantized_generate_with_compile_torch_runs_eagerly_and_says_so(llama):
    # Keras's quantized Dense calls share one torch.autograd.Function class, whose trace
    # torch.compile replayed for every projection (keys came out at the query's width).
    model = from_pretrained(llama.directory, quantize="int8")
    prompt = llama.token_ids[:1, :5].astype("int32")
    with pytest.warns(UserWarning, match="compile_torch=True: .* has quantized layers"):
        compiled = generate(model, prompt, 4, compile_torch=True)
    np.testing.assert_array_equal(compiled, generate(model, prompt, 4))


TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "num_hidden_layers": 1,
    "intermediate_size": 32,
    "vocab_size": 64,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}
PROJECTIONS = ["down_proj", "gate_proj", "key_dense", "output_dense", "query_dense"]
PROJECTIONS += ["up_proj", "value_dense"]


# Keras's GPTQ and AWQ run their per-column loop op by op; JAX compiles each slice anew
# (one tiny block: 109 s for GPTQ on JAX, 20 s on TensorFlow, 1.2 s on PyTorch, 2-core CPU
# under load). What is tested here (the structure and the filter) is the same Python on
# every backend.
@pytest.mark.skipif(keras.backend.backend() != "torch", reason="Keras's GPTQ/AWQ: minutes")
@pytest.mark.parametrize(("mode", "bits", "tolerance"), [("gptq", 8, 0.05), ("awq", 4, 0.3)])
def test_gptq_and_awq_calibrate_every_projection(mode, bits, tolerance):
    from keras_mha.models.loading import build_model
    from keras_mha.planning.spec import from_config

    model = build_model(from_config(TINY_LLAMA))
    ids = np.random.default_rng(0).integers(0, 64, (1, 12)).astype("int32")
    before = ops.convert_to_numpy(model(ids))
    data = [np.random.default_rng(seed).integers(0, 64, (40,)) for seed in range(2)]
    arguments = {"tokenizer": object(), "num_samples": 2, "sequence_length": 8, "group_size": 16}
    if mode == "gptq":
        config = keras.quantizers.GPTQConfig(data, weight_bits=bits, **arguments)
    else:
        config = keras.quantizers.AWQConfig(data, **arguments)
    model.quantize(mode, config=config)  # under cheap_collections (models/quantize.py)
    block = model.blocks[0]
    dense = {
        layer.name: layer
        for layer in block._flatten_layers()
        if isinstance(layer, keras.layers.Dense)
    }
    assert sorted(dense) == PROJECTIONS
    assert all(getattr(layer, f"is_{mode}_calibrated") for layer in dense.values())
    assert block.attention.quantization_mode == mode
    after = ops.convert_to_numpy(model(ids))
    error = np.abs(after - before).max() / np.abs(before).max()
    assert 1e-6 < error < tolerance
