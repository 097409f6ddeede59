"""`generate` reuses TensorFlow's cache variables between calls, zeroed first: a call after
another prompt gives the tokens of the first call, on every backend."""

import keras
import numpy as np

from keras_mha.models import generate
from keras_mha.models.generation import _decoder_for
from tests.models_checkpoints import loaded


def test_a_call_after_another_prompt_gives_the_same_tokens(tmp_path_factory):
    made, model = loaded(tmp_path_factory, "llama")
    # test_loading's sampling prompts: the compiled prefill and step are shared.
    prompt = made.token_ids[:, :4]
    first = generate(model, prompt, 5)
    generate(model, made.token_ids[:, 4:8], 5)  # same cache shape, other keys and values
    np.testing.assert_array_equal(generate(model, prompt, 5), first)
    decoder = _decoder_for(model, compile_torch=False)
    assert list(decoder._spare_caches) == ([(2, 64)] if decoder.variable_caches else [])
    if decoder.variable_caches:
        with decoder.borrowed_caches(2, 64) as caches:  # the last call's variables, zeroed
            for buffer in keras.tree.flatten(caches):
                assert not np.any(keras.ops.convert_to_numpy(buffer))
