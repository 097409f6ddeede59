"""`logits_to_keep`: the kept positions' logits equal the full call's rows, on every
backend, in the model call, on the cache and in `generate`'s compiled prefill."""

import keras
import numpy as np
import pytest

from keras_mha.errors import UsageError
from keras_mha.models.generation import _decoder_for
from keras_mha.models.kept_logits import check_logits_to_keep
from tests.models_checkpoints import loaded

# Prompts of test_loading's sampling tests: generate's prefill compiled once for both.
LENGTH = 4


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # The session's Llama checkpoint (loaded once for every test module that uses it).
    return loaded(tmp_path_factory, "llama")[1]


@pytest.fixture(scope="module")
def inputs():
    ids = np.random.default_rng(0).integers(0, 128, (2, LENGTH)).astype("int32")
    mask = np.ones((2, LENGTH), dtype=bool)
    mask[0, :2] = False  # a left-padded row
    return {"token_ids": ids, "padding_mask": mask}


@pytest.fixture(scope="module")
def full_logits(model, inputs):
    return np.asarray(keras.ops.convert_to_numpy(model(inputs)))


def _numpy(tensor):
    return np.asarray(keras.ops.convert_to_numpy(tensor))


@pytest.mark.parametrize("logits_to_keep, rows", [(2, [-2, -1]), ([0, -1], [0, -1])])
def test_kept_logits_are_the_full_calls_rows(model, inputs, full_logits, logits_to_keep, rows):
    kept = _numpy(model(inputs, logits_to_keep=logits_to_keep))
    np.testing.assert_allclose(kept, full_logits[:, rows], rtol=1e-5, atol=1e-6)


def test_prefill_on_the_cache_and_in_generate_keeps_the_last_row(model, inputs, full_logits):
    key_mask = np.ones((2, 64), dtype=bool)
    key_mask[:, :LENGTH] = inputs["padding_mask"]
    ids = keras.ops.convert_to_tensor(inputs["token_ids"])
    caches = model.init_caches(2, 64)
    logits, _ = model.call_with_cache(ids, keras.ops.convert_to_tensor(key_mask), caches, 0, 1)
    np.testing.assert_allclose(_numpy(logits), full_logits[:, -1:], rtol=1e-5, atol=1e-6)
    # generate's prefill, compiled on JAX and TensorFlow.
    decoder = _decoder_for(model, compile_torch=False)
    caches = model.init_caches(2, 64, variables=decoder.variable_caches)
    last, _ = decoder.prefill(ids, keras.ops.convert_to_tensor(key_mask), caches)
    np.testing.assert_allclose(_numpy(last), full_logits[:, -1], rtol=1e-5, atol=1e-6)


def test_a_bad_logits_to_keep_is_refused_before_the_model_runs(model, inputs):
    with pytest.raises(UsageError, match=r"^logits_to_keep=5; expected an int >= 0 and <= the 4"):
        model(inputs, logits_to_keep=5)


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "value, message",
    [
        (-1, r"logits_to_keep=-1; expected an int >= 0"),
        (True, r"logits_to_keep=True; expected an int >= 0 or a non-empty 1-D list"),
        (1.0, r"logits_to_keep=1.0; expected"),
        ([], r"logits_to_keep=\[\]; expected"),
        ([[0]], r"logits_to_keep=\[\[0\]\]; expected"),
        ([0, 4], r"positions must be in \[-4, 4\) for 4 tokens"),
        ([-5], r"positions must be in \[-4, 4\)"),
    ],
)
def test_check_logits_to_keep_names_the_argument_and_the_value(value, message):
    with pytest.raises(UsageError, match=message) as caught:
        check_logits_to_keep(value, LENGTH)
    assert caught.value.key == "logits_to_keep"


@pytest.mark.backend_independent
def test_check_logits_to_keep_normalises():
    assert check_logits_to_keep(None, LENGTH) == 0
    assert check_logits_to_keep(np.int64(2), LENGTH) == 2
    assert check_logits_to_keep((3, -4), LENGTH).tolist() == [3, -4]
    # While tracing the length may be unknown: positions are then not range-checked.
    assert check_logits_to_keep([100], None).tolist() == [100]
