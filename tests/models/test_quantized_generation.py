"""`generate(..., kv_cache_dtype="int8")` against float greedy decoding, on a tiny decoder
trained here to continue repeating patterns (its logits are confident, and the next token
depends on what attention reads from the cache: the token one period back)."""

import keras
import numpy as np
import pytest

from keras_mha.cards.spec import from_config
from keras_mha.errors import UsageError
from keras_mha.models import build_model, generate
from tests.configs import tiny_llama

PERIOD, LENGTH, VOCAB = 5, 40, 24


def patterns(count, seed):
    """Rows of a random `PERIOD`-token pattern repeated: token t equals token t - PERIOD."""
    rng = np.random.default_rng(seed)
    return np.tile(rng.integers(0, VOCAB, (count, PERIOD)), LENGTH // PERIOD).astype("int32")


@pytest.fixture(scope="module")
def trained():
    keras.utils.set_random_seed(0)
    config = tiny_llama(vocab_size=VOCAB, head_dim=16, num_hidden_layers=2)
    model = build_model(from_config(config))
    ids = patterns(512, seed=0)
    x = {"token_ids": ids[:, :-1], "padding_mask": np.ones_like(ids[:, :-1])}
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss)
    model.fit(x, ids[:, 1:], epochs=6, batch_size=32, verbose=0)
    return model


def test_int8_kv_cache_agrees_with_float_greedy_decoding(trained):
    prompts = patterns(8, seed=1)[:, : 2 * PERIOD]
    float_tokens = generate(trained, prompts, 24)[:, 2 * PERIOD :]
    # The model learned the task: the float greedy tokens continue the patterns.
    expected = patterns(8, seed=1)[:, 2 * PERIOD : 2 * PERIOD + 24]
    assert (float_tokens == expected).mean() >= 0.9
    for dtype in ("int8", "float8_e4m3fn"):
        tokens = generate(trained, prompts, 24, kv_cache_dtype=dtype)[:, 2 * PERIOD :]
        assert (tokens == float_tokens).mean() >= 0.9, dtype


def test_a_bad_kv_cache_dtype_is_named(trained):
    with pytest.raises(UsageError, match=r"kv_cache_dtype='int4'; expected None"):
        generate(trained, [[1, 2, 3]], 2, kv_cache_dtype="int4")
