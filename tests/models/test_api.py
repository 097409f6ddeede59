"""keras_mha.models as ordinary Keras models: summary, fit, .keras files, pruning.

A tiny Llama-shaped decoder is built from a config dict (`build_model`, random weights),
so no checkpoint is needed. Pruning and the `.keras` round trip are checked by outputs
against the same model before (gated heads are what `prune_heads` removes).
"""

import json

import keras
import numpy as np
import pytest

from keras_mha.models import DecoderModel, EncoderModel, build_model, generate
from keras_mha.planning.spec import from_config
from keras_mha.pruning import (
    HeadPruning,
    find_attention_layers,
    head_importance,
    prune_heads,
    set_head_gates,
)
from tests.configs import tiny_llama

CONFIG = tiny_llama(head_dim=8)
BERT_CONFIG = {
    "model_type": "bert",
    "architectures": ["BertModel"],
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 48,
    "vocab_size": 50,
    "max_position_embeddings": 16,
    "type_vocab_size": 2,
}


def tiny(config=CONFIG, seed=0):
    keras.utils.set_random_seed(seed)
    return build_model(from_config(config))


def batch(seed=0, size=4, length=6):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 50, (size, length)).astype("int32")


@pytest.fixture(scope="module")
def decoder():
    return tiny()


def test_summary_lists_the_blocks(decoder):
    lines = []
    decoder.summary(print_fn=lambda line, **kwargs: lines.append(line))
    text = "\n".join(lines)
    assert "block_0" in text and "block_1" in text and "lm_head" in text
    assert isinstance(decoder, DecoderModel) and decoder.count_params() > 0


def test_fit_with_head_pruning_then_the_keras_file_round_trips(tmp_path):
    model = tiny(seed=1)
    ids = batch(size=8)
    x = {"token_ids": ids[:, :-1], "padding_mask": np.ones_like(ids[:, :-1])}
    y = ids[:, 1:]
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss)
    pruning = HeadPruning(
        target=0.5,
        data=(x, y),
        method="magnitude",
        start_epoch=2,
        end_epoch=2,
        remove_at_end=True,
    )
    history = model.fit(x, y, epochs=3, batch_size=4, verbose=0, callbacks=[pruning])
    assert history.history["loss"][1] < history.history["loss"][0]
    heads = [layer.num_heads for layer in find_attention_layers(model).values()]
    assert sum(heads) == 4  # half of the 8 query heads are gone
    path = tmp_path / "model.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    assert type(restored) is DecoderModel
    assert [layer.num_heads for layer in find_attention_layers(restored).values()] == heads
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(restored(x)),
        keras.ops.convert_to_numpy(model(x)),
        atol=1e-6,
        rtol=0,
    )


def test_pruning_tools_work_on_a_whole_model():
    model = tiny(seed=2)
    ids = batch(seed=3)
    data = (ids[:, :-1], ids[:, 1:])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    scores = head_importance(model, data, method="taylor", loss=loss)
    layers = find_attention_layers(model)
    assert set(scores) == set(layers) and all(len(s) == 4 for s in scores.values())
    assert all(np.all(np.asarray(s) > 0) for s in scores.values())

    # Gate off the second KV group of the first block, then remove it physically.
    first = next(iter(layers))
    set_head_gates(model, {first: [1, 1, 0, 0]})
    gated = keras.ops.convert_to_numpy(model(data[0]))
    prune_heads(model)
    assert (layers[first].num_heads, layers[first].num_key_value_heads) == (2, 1)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(data[0])), gated, atol=1e-5, rtol=0)
    # Decoding works on the pruned (now non-uniform) model.
    assert generate(model, data[0][:1], 2).shape == (1, 7)


def test_encoder_model_builds_fits_and_saves(tmp_path):
    model = tiny(BERT_CONFIG, seed=6)
    assert isinstance(model, EncoderModel)
    ids = batch(seed=7)
    inputs = {"token_ids": ids, "padding_mask": np.ones_like(ids), "segment_ids": ids % 2}
    out = keras.ops.convert_to_numpy(model(inputs))
    assert out.shape == (4, 6, 32)
    path = tmp_path / "encoder.keras"
    model.save(path)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(keras.saving.load_model(path)(inputs)), out, atol=1e-6, rtol=0
    )


# The block traits the 0.3 families added: LayerNorm with biases, a plain MLP, learned
# positions (GPT-2), a parallel residual (GPT-NeoX), RoBERTa's padding-offset positions.
TRAIT_CONFIGS = {
    "gpt2": {"model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 2, "n_positions": 16},
    "gpt_neox": {
        "model_type": "gpt_neox",
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 48,
    },
    "roberta": {**BERT_CONFIG, "model_type": "roberta", "max_position_embeddings": 18},
}


@pytest.mark.backend_independent  # serialisation; the outputs per backend: test_models_parity
@pytest.mark.parametrize("family", list(TRAIT_CONFIGS))
def test_block_traits_survive_the_keras_file(tmp_path, family):
    config = {"vocab_size": 50, **TRAIT_CONFIGS[family]}
    model = tiny(config, seed=8)
    ids = batch(seed=9)
    mask = np.ones_like(ids)
    mask[1, 4:] = 0
    inputs = {"token_ids": ids, "padding_mask": mask}
    out = keras.ops.convert_to_numpy(model(inputs))
    path = tmp_path / f"{family}.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    assert json.dumps(restored.get_config()) == json.dumps(model.get_config())
    np.testing.assert_allclose(keras.ops.convert_to_numpy(restored(inputs)), out, atol=1e-6, rtol=0)


# The head-parallel sharding of a whole model needs several JAX devices, hence a fresh
# process: it runs in tests/distribution/checks.py (check_whole_model), asserted by
# tests/distribution/test_distribution.py, sharing that subprocess.


def test_direct_calls_only_where_call_equals_dunder_call():
    """Eager decoding skips Keras's __call__ only for built, non-mixed, unquantized models."""
    from keras_mha.models.direct_calls import supports_direct_calls

    layer = keras.layers.Dense(2)
    model = keras.Sequential([keras.Input((3,)), layer])
    assert supports_direct_calls(model)
    mixed = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, dtype="mixed_float16")])
    assert not supports_direct_calls(mixed)
    assert not supports_direct_calls(keras.Sequential([keras.layers.Dense(2)]))  # unbuilt
