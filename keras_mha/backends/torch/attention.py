"""PyTorch's attention kernels: SDPA without repeating K/V, and the one-query decode call.

`fused_attention` hands projected heads to `torch.nn.functional.scaled_dot_product_attention`
(`enable_gqa` for grouped heads); a lone query over grouped heads goes to
`one_query_attention`, which lays the heads out as the device's kernels run fastest.
Both are tested against `keras_mha.backends.common.attention_kernels.grouped_attention`.

Example:
    >>> q, kv = torch.randn(1, 1, 8, 16), torch.randn(1, 2, 32, 16)
    >>> tuple(one_query_attention(q, kv, kv, None, scale=0.25).shape)
    (1, 1, 8, 16)
"""

from __future__ import annotations

import torch

_sdpa = torch.nn.functional.scaled_dot_product_attention


def fused_attention(query, key, value, mask, *, scale, is_causal, key_heads_first):
    """SDPA on `(B, T, H, D)` queries and keys/values `(B, S, Hkv, D)` (or heads first,
    `(B, Hkv, S, D)`, the cache's layout, read as it lies); `mask` has no empty row.

    Example:
        >>> q, kv = torch.randn(2, 5, 8, 16), torch.randn(2, 7, 2, 16)
        >>> out = fused_attention(q, kv, kv, None, scale=0.25, is_causal=True,
        ...                       key_heads_first=False)
        >>> tuple(out.shape)
        (2, 5, 8, 16)
    """
    if not key_heads_first:
        key, value = key.transpose(1, 2), value.transpose(1, 2)
    else:
        is_causal = False  # A cache is attended under its mask, never aligned at 0.
    num_heads, num_key_value_heads = query.shape[2], key.shape[1]
    if query.shape[1] == 1 and num_heads != num_key_value_heads:
        return one_query_attention(query, key, value, mask, scale=scale)
    output = _sdpa(
        query.transpose(1, 2),
        key,
        value,
        attn_mask=mask,
        is_causal=is_causal and mask is None,
        scale=scale,
        enable_gqa=num_heads != num_key_value_heads,
    )
    return output.transpose(1, 2)


# Devices whose SDPA kernels take grouped-query heads natively (`enable_gqa`) when no
# mask is given. On an H200 in bfloat16 (context 8192, 32/8 heads) cuDNN's kernel ran a
# lone query per head 2.7x faster than G queries per KV head; on the CPU the grouped
# layout is the faster. With a mask the grouped layout stays: not every CUDA kernel that
# takes a mask takes `enable_gqa` (the math fallback would copy K/V per query head).
NATIVE_GQA_DEVICES = ("cuda",)


def one_query_attention(query, key, value, mask, *, scale):
    """One query token `(B, 1, H, D)` over a heads-first cache `(B, Hkv, S, D)`.

    On the CPU the query heads of each group become that group's queries:
    `(B, 1, Hkv * G, D)` is viewed as `(B, Hkv, G, D)`, plain multi-head SDPA with `G`
    queries per head, no `enable_gqa` (whose CPU kernel walks each query head
    separately) and no copy. On CUDA without a mask, `enable_gqa` with one query per head.
    `mask`: None or boolean, broadcastable to `(B, 1 | H, 1, S)`, with no empty row.

    Example:
        >>> q, kv = torch.randn(1, 1, 8, 16), torch.randn(1, 2, 32, 16)
        >>> tuple(one_query_attention(q, kv, kv, None, scale=0.25).shape)
        (1, 1, 8, 16)
    """
    batch, _, num_heads, head_dim = query.shape
    num_key_value_heads = key.shape[1]
    if mask is None and query.device.type in NATIVE_GQA_DEVICES:
        output = _sdpa(query.transpose(1, 2), key, value, scale=scale, enable_gqa=True)
        return output.transpose(1, 2)
    groups = num_heads // num_key_value_heads
    grouped = query.reshape(batch, num_key_value_heads, groups, head_dim)
    if mask is not None:
        # (B|1, 1|H, 1, S) -> (B|1, 1|Hkv, 1|G, S), the query axis folded away.
        if mask.shape[1] == 1:
            mask = mask[:, :, 0][:, :, None]
        else:
            mask = mask.reshape(mask.shape[0], num_key_value_heads, groups, mask.shape[-1])
    output = _sdpa(grouped, key, value, attn_mask=mask, scale=scale)
    # (B, Hkv, G, Dv) -> (B, 1, H, Dv): the heads are in order, so this is a view.
    return output.reshape(batch, 1, num_heads, value.shape[-1])


def reads_cache_prefix_cheaply():
    """Slicing a cache's written prefix is a free view in eager PyTorch (not under
    `torch.compile`, where a new length per step would recompile)."""
    return not torch.compiler.is_compiling()
