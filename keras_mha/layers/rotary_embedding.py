"""Rotary position embeddings (RoPE), as Llama, Mistral, Qwen and GPT-NeoX use them.

Rotation follows the "rotate half" convention of Hugging Face transformers:
feature `i` of the rotated part pairs with feature `i + rotary_dim / 2`.
"""

from __future__ import annotations

import functools
import math

import keras
import numpy as np
from keras import ops

from keras_mha import backends
from keras_mha.layers import validation

ROPE_SCALING_TYPES = ("default", "linear", "llama3")

# The fields each scaling type needs, and what each must be. Other keys (for
# example `rope_theta`, which transformers 5 puts in `rope_parameters`) are ignored.
_POSITIVE_NUMBER, _POSITIVE_INTEGER = "a finite number > 0", "a positive integer"
ROPE_SCALING_FIELDS = {
    "default": {},
    "linear": {"factor": _POSITIVE_NUMBER},
    "llama3": {
        "factor": _POSITIVE_NUMBER,
        "low_freq_factor": _POSITIVE_NUMBER,
        "high_freq_factor": _POSITIVE_NUMBER,
        "original_max_position_embeddings": _POSITIVE_INTEGER,
    },
}


def _scaling_type(rope_scaling):
    if rope_scaling is None:
        return "default"
    if not isinstance(rope_scaling, dict):
        raise ValueError(
            f"`rope_scaling` must be None or a dict like {{'rope_type': 'linear', "
            f"'factor': 2.0}}; received {rope_scaling!r}."
        )
    kind = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    legacy = rope_scaling.get("type", kind)
    if legacy != kind:
        raise ValueError(
            f"`rope_scaling` has 'rope_type'={kind!r} and 'type'={legacy!r}; expected one "
            "type (or both the same)."
        )
    if not isinstance(kind, str) or kind not in ROPE_SCALING_TYPES:
        raise ValueError(
            f"`rope_scaling` type {kind!r} is not supported; expected one of {ROPE_SCALING_TYPES}."
        )
    return kind


def check_rope_scaling(rope_scaling):
    """Validate a Hugging Face `rope_scaling` dict; returns `(type, {field: value})`.

    Every field the type needs must be there: factors finite numbers > 0 (not
    bools or strings), `original_max_position_embeddings` a positive integer,
    and for `llama3` `high_freq_factor` > `low_freq_factor` (the smoothing
    divides by their difference).

    Example:
        >>> check_rope_scaling({"rope_type": "linear", "factor": 2})
        ('linear', {'factor': 2.0})
        >>> check_rope_scaling({"rope_type": "linear", "factor": float("nan")})
        Traceback (most recent call last):
        ValueError: `rope_scaling['factor']` must be a finite number > 0; received nan.
    """
    kind = _scaling_type(rope_scaling)
    fields = {}
    for key, expected in ROPE_SCALING_FIELDS[kind].items():
        if key not in rope_scaling:
            raise ValueError(
                f"`rope_scaling` of type {kind!r} needs the key {key!r} ({expected}); "
                f"received {rope_scaling!r}."
            )
        name = f"rope_scaling[{key!r}]"
        if expected == _POSITIVE_INTEGER:
            fields[key] = validation.positive_int(name, rope_scaling[key])
        else:
            fields[key] = validation.finite_number(name, rope_scaling[key], above=0)
    if kind == "llama3" and not fields["high_freq_factor"] > fields["low_freq_factor"]:
        raise ValueError(
            f"`rope_scaling['high_freq_factor']`={rope_scaling['high_freq_factor']!r} must be "
            f"greater than `rope_scaling['low_freq_factor']`={rope_scaling['low_freq_factor']!r}."
        )
    return kind, fields


def inverse_frequencies(rotary_dim, max_wavelength=10000.0, rope_scaling=None):
    """Inverse frequencies `(rotary_dim // 2,)` as float64 NumPy, scaling applied.

    `linear` divides every frequency by `factor` (positions are interpolated);
    `llama3` divides only the low frequencies, blending smoothly between
    `low_freq_factor` and `high_freq_factor` (Llama 3.1).

    Example:
        >>> inverse_frequencies(8, 10000.0).round(4).tolist()
        [1.0, 0.1, 0.01, 0.001]
    """
    kind, fields = check_rope_scaling(rope_scaling)
    exponents = np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim
    inv_freq = 1.0 / (float(max_wavelength) ** exponents)
    if kind == "linear":
        inv_freq = inv_freq / fields["factor"]
    elif kind == "llama3":
        factor = fields["factor"]
        low_freq_factor = fields["low_freq_factor"]
        high_freq_factor = fields["high_freq_factor"]
        original_length = fields["original_max_position_embeddings"]
        low_freq_wavelength = original_length / low_freq_factor
        high_freq_wavelength = original_length / high_freq_factor
        wavelength = 2 * math.pi / inv_freq
        scaled = np.where(wavelength > low_freq_wavelength, inv_freq / factor, inv_freq)
        smooth = (original_length / wavelength - low_freq_factor) / (
            high_freq_factor - low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelength >= high_freq_wavelength) & (wavelength <= low_freq_wavelength)
        inv_freq = np.where(is_medium, smoothed, scaled)
    return inv_freq


@functools.lru_cache(maxsize=16)
def constant_cos_sin(frequencies: tuple, length: int):
    """NumPy `(cos, sin)` of shape `(1, length, 1, 2 * len(frequencies))` for positions
    `0 .. length - 1`, the angles in float32 as the traced computation makes them.

    Example:
        >>> cos, sin = constant_cos_sin((1.0, 0.5), 3)
        >>> cos.shape, round(float(sin[0, 2, 0, 1]), 6)  # sin(2 * 0.5)
        ((1, 3, 1, 4), 0.841471)
    """
    positions = np.arange(length, dtype=np.float32)[:, None]
    angles = positions * np.asarray(frequencies, dtype=np.float32)
    angles = np.concatenate([angles, angles], axis=-1)[None, :, None, :]
    return np.cos(angles), np.sin(angles)


@keras.saving.register_keras_serializable(package="keras_mha")
class RotaryEmbedding(keras.layers.Layer):
    """Rotary position embedding applied to per-head features.

    Args:
        max_wavelength: the base `theta` of the frequencies (`rope_theta` in
            Hugging Face configs), default 10000.
        partial_rotary_factor: fraction of each head's features that rotate
            (Phi-2 and GPT-NeoX rotate only the first part); the rotated width
            is `int(head_dim * partial_rotary_factor)`, rounded down to even.
        rope_scaling: None, `{"rope_type": "linear", "factor": f}` or
            `{"rope_type": "llama3", "factor": f, "low_freq_factor": l,
            "high_freq_factor": h, "original_max_position_embeddings": n}`.

    Call arguments:
        inputs: `(batch, length, num_heads, head_dim)`.
        positions: integer positions `(length,)` or `(batch, length)`; default
            `0 .. length - 1`.

    Returns:
        The rotated tensor, same shape and dtype as `inputs`.

    Example:
        >>> rope = RotaryEmbedding(max_wavelength=10000)
        >>> x = keras.random.normal((2, 6, 4, 16))
        >>> tuple(rope(x, positions=ops.arange(10, 16)).shape)
        (2, 6, 4, 16)
    """

    def __init__(
        self, max_wavelength=10000.0, partial_rotary_factor=1.0, rope_scaling=None, **kwargs
    ):
        super().__init__(**kwargs)
        self.max_wavelength = validation.finite_number("max_wavelength", max_wavelength, above=0)
        self.partial_rotary_factor = validation.finite_number(
            "partial_rotary_factor", partial_rotary_factor, above=0, at_most=1
        )
        check_rope_scaling(rope_scaling)
        self.rope_scaling = dict(rope_scaling) if rope_scaling is not None else None
        self._inv_freq_cache = {}

    def rotary_dim(self, head_dim):
        width = int(head_dim * self.partial_rotary_factor)
        return width - width % 2

    def _inverse_frequencies(self, rotary_dim):
        cached = self._inv_freq_cache.get(rotary_dim)
        if cached is None:
            frequencies = inverse_frequencies(rotary_dim, self.max_wavelength, self.rope_scaling)
            cached = self._inv_freq_cache[rotary_dim] = tuple(float(f) for f in frequencies)
        return cached

    def call(self, inputs, positions=None):
        head_dim = inputs.shape[-1]
        rotary_dim = self.rotary_dim(head_dim)
        if rotary_dim == 0:
            return inputs
        cos, sin = self._cos_sin(positions, ops.shape(inputs)[1], rotary_dim)
        x = ops.cast(inputs, "float32")
        rotating, passing = x[..., :rotary_dim], x[..., rotary_dim:]
        first, second = rotating[..., : rotary_dim // 2], rotating[..., rotary_dim // 2 :]
        rotated = rotating * cos + ops.concatenate([-second, first], axis=-1) * sin
        if rotary_dim < head_dim:
            rotated = ops.concatenate([rotated, passing], axis=-1)
        return ops.cast(rotated, inputs.dtype)

    def _cos_sin(self, positions, length, rotary_dim):
        """`(cos, sin)` broadcastable to `(B, T, heads, rotary_dim)`: one angle per pair."""
        frequencies = self._inverse_frequencies(rotary_dim)
        if (
            positions is None
            and isinstance(length, int)
            and backends.current().constant_rope_tables
        ):
            cos, sin = constant_cos_sin(frequencies, length)
            return ops.convert_to_tensor(cos), ops.convert_to_tensor(sin)
        # A tuple of Python floats: a constant to every tracer (a NumPy array
        # breaks torch.compile's graph).
        inv_freq = ops.convert_to_tensor(frequencies, dtype="float32")
        if positions is None:
            positions = ops.arange(length, dtype="int32")
        positions = ops.cast(positions, "float32")
        if len(positions.shape) == 1:
            positions = positions[None]
        # (B|1, T, rotary_dim / 2) -> (B|1, T, 1, rotary_dim).
        angles = positions[..., None] * inv_freq
        angles = ops.concatenate([angles, angles], axis=-1)[:, :, None, :]
        return ops.cos(angles), ops.sin(angles)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_wavelength": self.max_wavelength,
                "partial_rotary_factor": self.partial_rotary_factor,
                "rope_scaling": self.rope_scaling,
            }
        )
        return config
