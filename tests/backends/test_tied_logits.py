"""A tied LM head (`backends.current().tied_logits`): NumPy's values on every backend, and
under XLA on TensorFlow a product that reads the table as it lies (no transpose of it)."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_mha import backends

BACKEND = keras.backend.backend()


def test_tied_logits_match_numpy():
    rng = np.random.default_rng(0)
    hidden = rng.standard_normal((2, 3, 8), dtype="float32")
    table = rng.standard_normal((11, 8), dtype="float32")
    logits = backends.current().tied_logits(
        ops.convert_to_tensor(hidden), ops.convert_to_tensor(table)
    )
    np.testing.assert_allclose(ops.convert_to_numpy(logits), hidden @ table.T, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow's XLA program")
def test_tensorflow_tied_head_never_transposes_the_table():
    import tensorflow as tf

    table = tf.Variable(tf.ones((64, 16)))
    head = tf.function(lambda h: backends.current().tied_logits(h, table), jit_compile=True)
    hidden = tf.ones((1, 1, 16))
    hlo = head.experimental_get_compiler_ir(hidden)(stage="optimized_hlo")
    assert " dot(" in hlo and "transpose(" not in hlo, hlo
