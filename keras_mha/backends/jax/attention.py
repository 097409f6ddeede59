"""JAX's attention kernels: `keras.ops.dot_product_attention` (cuDNN flash attention where
the GPU allows), blockwise causal attention as one XLA program on the CPU, and the choice
of the cache-reading kernel for a decode step.

Example:
    >>> cache_kernel(ops.ones((1, 1, 8, 64)), ops.ones((1, 2, 2048, 64)))  # doctest: +SKIP
    'two_fusions'
"""

from __future__ import annotations

import functools

import jax
from keras import ops

from keras_mha.backends.common import attention_kernels, decode_attention


def _on_cpu():
    return jax.default_backend() == "cpu"


def fused_attention(query, key, value, mask, *, scale, is_causal, key_heads_first):
    """`keras.ops.dot_product_attention` (Keras picks cuDNN flash attention by itself where
    the GPU, dtype and shapes allow); over a heads-first cache, the grouped einsum."""
    if key_heads_first:
        return attention_kernels.grouped_attention(
            query, key, value, mask, scale=scale, key_heads_first=True
        )
    dtype = value.dtype
    # XLA's CPU dot_general rejects float16 operands with float32 accumulation
    # ('F16_F16_F32') inside jax.jit, i.e. in every `fit`/`predict` under
    # mixed_float16; eager calls happen to work. Attend in float32 there.
    upcast = query.dtype == "float16" and _on_cpu()
    if upcast:
        query, key, value = (ops.cast(x, "float32") for x in (query, key, value))
    output = ops.dot_product_attention(
        query, key, value, mask=mask, scale=scale, is_causal=is_causal and mask is None
    )
    return ops.cast(output, dtype) if upcast else output


def reads_cache_prefix_cheaply():
    """False: under XLA a slice of the cache copies, and a new length per step recompiles."""
    return False


def prefers_blockwise_causal():
    """On the CPU: cuDNN's flash attention skips the masked triangle on a GPU."""
    return _on_cpu()


def blockwise_causal_attention(query, key, value, scale, *, block_size):
    """One XLA program for all the blocks: called eagerly, every block's ops (each with
    its own key length) would compile separately, ~28 programs a block (940 at 4096
    tokens, minutes on a CPU). Inside a jit it is inlined."""
    return _jitted_blockwise()(query, key, value, scale, block_size=block_size)


@functools.cache
def _jitted_blockwise():
    return jax.jit(attention_kernels.causal_attention_in_blocks, static_argnames=("block_size",))


def cache_kernel(query, key):
    """One query token on the CPU: `"two_fusions"` or `"single_query"`
    (`keras_mha.backends.common.decode_attention`, which XLA runs without copying the donated
    cache), else None (the grouped einsum)."""
    if query.shape[1] != 1 or not _on_cpu():
        return None
    return "two_fusions" if decode_attention.prefers_two_fusions(query, key) else "single_query"
