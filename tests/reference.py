"""A plain NumPy attention reference, written from the formulas, for tests.

Deliberately naive: K/V are repeated per query head, everything is float64,
and every mask is built as an explicit (B, H, T, S) boolean array.
"""

from __future__ import annotations

import numpy as np
from keras import ops


def to_numpy(x, dtype=np.float64):
    """NumPy copy of a NumPy array or any backend tensor, on any device (cuda included)."""
    if x is None or isinstance(x, np.ndarray | np.generic | list | tuple | bool | int | float):
        return np.asarray(x, dtype)
    return np.asarray(ops.convert_to_numpy(x), dtype)


def layer_weights(layer):
    """The layer's variables as float64 NumPy arrays, by attribute name."""
    names = (
        "query_kernel",
        "key_kernel",
        "value_kernel",
        "output_kernel",
        "query_bias",
        "key_bias",
        "value_bias",
        "output_bias",
        "query_norm_scale",
        "key_norm_scale",
        "head_gates",
    )
    weights = {}
    for name in names:
        variable = getattr(layer, name, None)
        if variable is not None:
            weights[name] = ops.convert_to_numpy(variable).astype(np.float64)
    return weights


def rope_numpy(x, positions, theta, rotary_dim, inv_freq=None):
    """Rotate-half RoPE on (B, T, H, D) at integer positions (T,)."""
    if inv_freq is None:
        inv_freq = 1.0 / theta ** (np.arange(0, rotary_dim, 2) / rotary_dim)
    angles = np.asarray(positions, np.float64)[:, None] * inv_freq[None]
    angles = np.concatenate([angles, angles], -1)[None, :, None, :]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated = np.concatenate([-rot[..., half:], rot[..., :half]], -1)
    return np.concatenate([rot * np.cos(angles) + rotated * np.sin(angles), rest], -1)


def rms_norm(x, scale, eps):
    return x / np.sqrt(np.mean(x**2, -1, keepdims=True) + eps) * scale


def attention_numpy(
    layer,
    query,
    value=None,
    *,
    mask=None,
    causal=False,
    sliding_window=None,
    rope_theta=None,
    rotary_dim=None,
    soft_cap=None,
    qk_norm_epsilon=None,
    scale=None,
):
    """Reference output and weights of `layer` (a keras-mha attention layer).

    `mask`: optional boolean (B, T, S), True = attend.
    Returns `(output (B, T, F_out), weights (B, H, T, S))`.
    """
    w = layer_weights(layer)
    query = to_numpy(query)
    value = query if value is None else to_numpy(value)
    q = np.einsum("btf,fhd->bthd", query, w["query_kernel"]) + w.get("query_bias", 0)
    k = np.einsum("bsf,fhd->bshd", value, w["key_kernel"]) + w.get("key_bias", 0)
    v = np.einsum("bsf,fhd->bshd", value, w["value_kernel"]) + w.get("value_bias", 0)
    if qk_norm_epsilon is not None:
        q = rms_norm(q, w["query_norm_scale"], qk_norm_epsilon)
        k = rms_norm(k, w["key_norm_scale"], qk_norm_epsilon)
    batch, query_length, num_heads, head_dim = q.shape
    key_length, num_kv = k.shape[1], k.shape[2]
    if rope_theta is not None:
        q = rope_numpy(q, np.arange(query_length), rope_theta, rotary_dim or head_dim)
        k = rope_numpy(k, np.arange(key_length), rope_theta, rotary_dim or head_dim)
    k = np.repeat(k, num_heads // num_kv, axis=2)
    v = np.repeat(v, num_heads // num_kv, axis=2)
    scale = head_dim**-0.5 if scale is None else scale
    logits = np.einsum("bthd,bshd->bhts", q, k) * scale
    if soft_cap is not None:
        logits = soft_cap * np.tanh(logits / soft_cap)
    allowed = np.ones((batch, num_heads, query_length, key_length), bool)
    if mask is not None:
        allowed &= to_numpy(mask, bool)[:, None]
    i = np.arange(query_length)[:, None]
    j = np.arange(key_length)[None, :]
    if causal or sliding_window:
        allowed &= j <= i
    if sliding_window:
        allowed &= i - j < sliding_window
    logits = np.where(allowed, logits, -np.inf)
    row_any = allowed.any(-1, keepdims=True)
    logits = np.where(row_any, logits, 0.0)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights = np.where(allowed, weights, 0.0)
    weights = weights / np.maximum(weights.sum(-1, keepdims=True), 1e-300)
    weights = np.where(row_any, weights, 0.0)
    heads = np.einsum("bhts,bshd->bthd", weights, v) * w["head_gates"][:, None]
    output = np.einsum("bthd,hdo->bto", heads, w["output_kernel"]) + w.get("output_bias", 0)
    return output, weights
