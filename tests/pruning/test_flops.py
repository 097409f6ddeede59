"""The attention FLOPs estimate: the formula, and XLA's own count on JAX."""

import keras
import numpy as np
import pytest

from keras_mha.layers import GroupedQueryAttention
from keras_mha.pruning import attention_flops


def test_attention_flops_counts_the_five_products():
    layer = GroupedQueryAttention(8, 2, head_dim=4, output_dim=12)
    layer.build((None, None, 16))
    flops = attention_flops(layer, query_length=5, key_length=7)
    expected = (
        2 * 5 * 16 * 8 * 4  # queries
        + 2 * 7 * (16 + 16) * 2 * 4  # keys and values
        + 2 * 2 * 8 * 5 * 7 * 4  # logits and weighted sum
        + 2 * 5 * 8 * 4 * 12  # output projection
    )
    assert flops == expected
    layer.prune_heads([0, 1, 2, 3])
    assert attention_flops(layer, 5, 7) < expected


@pytest.mark.skipif(
    keras.backend.backend() != "jax", reason="XLA's cost analysis is read through jax.jit"
)
def test_attention_flops_agrees_with_xla_cost_analysis():
    import jax

    for heads, kv_heads in ((8, 2), (4, 4), (4, 1)):
        layer = GroupedQueryAttention(heads, kv_heads, head_dim=16, flash_attention=False)
        layer.build((None, None, 64))
        x = np.zeros((1, 32, 64), "float32")

        def forward(trainable, non_trainable, x, layer=layer):
            return layer.stateless_call(trainable, non_trainable, x)[0]

        trainable = [v.value for v in layer.trainable_variables]
        non_trainable = [v.value for v in layer.non_trainable_variables]
        analysis = jax.jit(forward).lower(trainable, non_trainable, x).compile().cost_analysis()
        if isinstance(analysis, list):
            analysis = analysis[0]
        xla_flops = analysis["flops"]
        ours = attention_flops(layer, 32)
        # XLA also counts softmax, biases, gates and masking: a few percent more.
        assert ours <= xla_flops <= 1.1 * ours, (heads, kv_heads, ours, xla_flops)
