"""TensorFlow's attention kernels: Keras's fused attention for multi-head attention, the
grouped einsum otherwise, blockwise causal attention for long prompts, and the flat
matmuls that read a variable cache in place.

Example:
    >>> cache_kernel(ops.ones((1, 1, 8, 16)), ops.ones((1, 2, 32, 16)))  # doctest: +SKIP
    'flat'
"""

from __future__ import annotations

from keras import ops

from keras_mha.backends.common import attention_kernels


def fused_attention(query, key, value, mask, *, scale, is_causal, key_heads_first):
    """`keras.ops.dot_product_attention` for multi-head attention; for grouped heads (and a
    heads-first cache) the grouped einsum, a batched matmul per KV head."""
    if key_heads_first:
        return attention_kernels.grouped_attention(
            query, key, value, mask, scale=scale, key_heads_first=True
        )
    if key.shape[2] == query.shape[2]:
        return ops.dot_product_attention(
            query, key, value, mask=mask, scale=scale, is_causal=is_causal and mask is None
        )
    if is_causal and mask is None:
        mask = attention_kernels.causal_mask_for(query, key)
    return attention_kernels.grouped_attention(query, key, value, mask, scale=scale)


def reads_cache_prefix_cheaply():
    """False: under XLA a slice of the cache copies, and a new length per step recompiles."""
    return False


def prefers_blockwise_causal():
    """True: Keras's TensorFlow attention always forms the whole logits."""
    return True


def blockwise_causal_attention(query, key, value, scale, *, block_size):
    return attention_kernels.causal_attention_in_blocks(
        query, key, value, scale, block_size=block_size
    )


def cache_kernel(query, key):
    """`"flat"` (`decode_attention.flat_cache_attention`) where the head count is static."""
    return "flat" if query.shape[2] is not None else None
