"""`convert_attention` on whole models: user models and Hub checkpoints of every family,
the export that transformers loads, and uptraining on a real text."""

import keras
import numpy as np
import pytest

from keras_mha import convert_attention
from keras_mha.data.text import DecoderData
from keras_mha.errors import ExportError, PruningError
from keras_mha.layers import GroupedQueryAttention, MultiQueryAttention
from keras_mha.pruning import find_attention_layers
from tests.conversion.texts import shipped_text
from tests.models_checkpoints import checkpoint
from tests.pruning.test_models import (
    SEQUENCE_LENGTH,
    all_variables,
    assert_untouched,
    block_model,
    classification_data,
    compiled,
    functional_model,
)

# Families whose transformers config states `num_key_value_heads`, each case with the
# features it brings: RoPE scaling, biases, a sliding window, q/k norms, soft caps,
# Gemma 3's local RoPE, Phi-3's fused qkv projection.
EXPORTABLE = [
    "llama",
    "llama_tied_bias",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "gemma3",
    "phi3",
]


def _numpy(value):
    return keras.ops.convert_to_numpy(value)


@pytest.mark.backend_independent  # each backend runs converted layers in test_kv_conversion
def test_user_model_converts_saves_and_stays_compiled(tmp_path):
    keras.utils.set_random_seed(0)
    model = compiled(block_model())
    optimizer = model.optimizer
    x, _ = classification_data(4, seed=1)
    convert_attention(model, 1)
    layers = find_attention_layers(model)
    # MHA's config cannot state 1 KV head, so that layer becomes MQA; GQA stays GQA.
    assert [(type(layer), layer.num_key_value_heads) for layer in layers.values()] == [
        (MultiQueryAttention, 1),
        (GroupedQueryAttention, 1),
        (MultiQueryAttention, 1),
    ]
    assert model.compiled and model.optimizer is not optimizer  # slots had the old shapes
    output = _numpy(model(x))
    model.save(tmp_path / "converted.keras")
    loaded = keras.saving.load_model(tmp_path / "converted.keras", compile=False)
    np.testing.assert_allclose(_numpy(loaded(x)), output, rtol=1e-5, atol=1e-6)


@pytest.mark.backend_independent
def test_a_layer_that_cannot_convert_leaves_the_whole_model_untouched():
    model = functional_model()  # "mha": 4 KV heads, "gqa": 2
    before = all_variables(model)
    with pytest.raises(PruningError, match=r"layer 'gqa', which has 2 KV heads") as caught:
        convert_attention(model, 4)
    assert "\n" not in str(caught.value)
    assert_untouched(model, before)
    assert [layer.num_key_value_heads for layer in find_attention_layers(model).values()] == [4, 2]
    inputs = keras.Input((SEQUENCE_LENGTH, 4))
    with pytest.raises(PruningError, match="has no keras-mha attention layer"):
        convert_attention(keras.Model(inputs, keras.layers.Dense(2)(inputs)), 1)


@pytest.mark.backend_independent
@pytest.mark.parametrize("case", EXPORTABLE)
def test_export_loads_in_transformers_with_the_converted_logits(tmp_path_factory, tmp_path, case):
    # The conversion is NumPy on the weights and the export writes NumPy: the answer does
    # not depend on the backend (each backend's forward pass is checked against
    # transformers by tests/test_models_parity.py).
    import torch
    import transformers

    from keras_mha.models import from_pretrained, save_pretrained

    source = checkpoint(tmp_path_factory, case, num_key_value_heads=4)
    model = from_pretrained(source.directory)
    convert_attention(model, 2, method="regroup")
    inputs = {
        "token_ids": source.token_ids.astype("int32"),
        "padding_mask": np.ones_like(source.token_ids, dtype=bool),
    }
    logits = _numpy(model(inputs))
    save_pretrained(model, tmp_path / "converted")
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "converted").eval()
    config = exported.config.get_text_config()
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    with torch.no_grad():
        reference = exported(input_ids=torch.from_numpy(source.token_ids)).logits.numpy()
    np.testing.assert_allclose(logits, reference, atol=1e-4, rtol=0)
    # Pooling moved the model: the check above is not comparing two unchanged models.
    assert np.abs(reference - source.reference).max() > 1e-3


@pytest.mark.backend_independent
def test_bert_converts_in_keras_and_export_says_why_not(tmp_path_factory, tmp_path):
    from keras_mha.models import from_pretrained, save_pretrained

    source = checkpoint(tmp_path_factory, "bert")
    model = from_pretrained(source.directory)
    convert_attention(model, 1)
    inputs = {
        "token_ids": source.token_ids.astype("int32"),
        "padding_mask": source.padding_mask.astype(bool),
    }
    hidden = _numpy(model(inputs))
    with pytest.raises(ExportError, match="model_type='bert'.*no num_key_value_heads") as caught:
        save_pretrained(model, tmp_path / "hub")
    assert "\n" not in str(caught.value) and not (tmp_path / "hub").exists()
    model.save(tmp_path / "bert.keras")
    loaded = keras.saving.load_model(tmp_path / "bert.keras")
    assert isinstance(find_attention_layers(loaded)["block_0/attention"], MultiQueryAttention)
    np.testing.assert_allclose(_numpy(loaded(inputs)), hidden, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def shipped_windows():
    """Byte windows of 33 (32 inputs + the next byte) of a shipped text: 90% / 10%."""
    from keras_mha.conversion import held_out_split

    stream = np.frombuffer(shipped_text(24_000).encode(), dtype=np.uint8).astype("int32")
    windows = stream[: (len(stream) - 1) // 33 * 33].reshape(-1, 33)
    return held_out_split(DecoderData(windows[:, :-1], windows[:, 1:], windows[:, 1:].size), 0.1)


TINY_DECODER = {
    "model_type": "llama",
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 1,
    "intermediate_size": 64,
    "vocab_size": 256,
    "max_position_embeddings": 64,
    "tie_word_embeddings": True,
}


def _tiny_decoder(weights=None):
    from keras_mha.models import build_model
    from keras_mha.planning.spec import from_config

    model = build_model(from_config(TINY_DECODER))
    if weights is not None:
        model.set_weights(weights)
    return model


def test_uptraining_lowers_held_out_loss_after_conversion(shipped_windows):
    from keras_mha.commands.prune_report import perplexity
    from keras_mha.conversion import uptrain

    train, held_out = shipped_windows
    keras.utils.set_random_seed(0)
    model = _tiny_decoder()
    uptrain(model, train, steps=12, learning_rate=1e-2, batch_size=16)  # "pre-training"
    convert_attention(model, 1)
    converted = perplexity(model, held_out, 64)
    uptrain(model, train, steps=6, learning_rate=1e-2, batch_size=16)
    assert perplexity(model, held_out, 64) < converted


def test_distillation_loss_is_the_kl_divergence_to_the_frozen_original(shipped_windows):
    from keras_mha.conversion import uptrain

    train, _ = shipped_windows
    keras.utils.set_random_seed(1)
    teacher = _tiny_decoder()
    student = convert_attention(_tiny_decoder(teacher.get_weights()), 1)
    # One batch holding every example: the first step's loss is on these 8 windows,
    # before any update; the reference is NumPy's KL(teacher || student) per token.
    batch = DecoderData(train.inputs[:8], train.targets[:8], 8 * 32)
    inputs = {"token_ids": batch.inputs, "padding_mask": np.ones_like(batch.inputs, bool)}

    def log_softmax(model):
        logits = _numpy(model.predict_on_batch(inputs)).astype("float64")
        logits -= logits.max(axis=-1, keepdims=True)
        return logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))

    teacher_log, student_log = log_softmax(teacher), log_softmax(student)
    expected = np.mean(np.sum(np.exp(teacher_log) * (teacher_log - student_log), axis=-1))
    losses = uptrain(student, batch, steps=2, learning_rate=1e-3, batch_size=8, teacher=teacher)
    assert expected > 1e-4
    np.testing.assert_allclose(losses[0], expected, rtol=1e-4)
    assert losses[1] < losses[0]
    # The teacher stayed frozen.
    np.testing.assert_array_equal(log_softmax(teacher), teacher_log)


@pytest.mark.backend_independent
def test_uptraining_refusals(shipped_windows, tmp_path_factory):
    from keras_mha.conversion import held_out_split, uptrain
    from keras_mha.data.text import DecoderData
    from keras_mha.errors import UnsupportedModelError, UsageError
    from keras_mha.models import from_pretrained

    train, _ = shipped_windows
    one = DecoderData(train.inputs[:1], train.targets[:1], 32)
    with pytest.raises(UsageError, match="gives 1 window, too few to hold some out"):
        held_out_split(one, 0.5)
    with pytest.raises(UsageError, match=r"--held-out 1.0: expected a fraction"):
        held_out_split(train, 1.0)
    encoder = from_pretrained(checkpoint(tmp_path_factory, "bert").directory)
    with pytest.raises(UnsupportedModelError, match="is an encoder: it has no language-modelling"):
        uptrain(encoder, train, steps=1)
    with pytest.raises(UsageError, match="`steps`=0"):
        uptrain(encoder, train, steps=0)


@pytest.mark.backend_independent  # the order comes from `seed`, not from the backend
def test_uptraining_sees_the_same_batches_for_the_same_seed(shipped_windows):
    from keras_mha.conversion import uptrain

    train, _ = shipped_windows
    start = _tiny_decoder().get_weights()
    runs = [
        uptrain(_tiny_decoder(start), train, steps=5, learning_rate=1e-3, batch_size=4, seed=7)
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
