"""Model inputs in keras-hub's convention: `{"token_ids", "padding_mask"}` or bare token ids.

Example:
    >>> token_ids, padding_mask, extra = unpack_inputs({"token_ids": ids, "padding_mask": m})
    ... # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
from keras import ops

INPUT_KEYS = ("token_ids", "padding_mask", "segment_ids")


def unpack_inputs(inputs, *, allow_segments=False):
    """`(token_ids, padding_mask or None, segment_ids or None)` from a dict or a tensor."""
    if isinstance(inputs, dict):
        unknown = sorted(set(inputs) - set(INPUT_KEYS if allow_segments else INPUT_KEYS[:2]))
        if unknown or "token_ids" not in inputs:
            expected = INPUT_KEYS if allow_segments else INPUT_KEYS[:2]
            raise ValueError(
                f"model inputs: a dict needs 'token_ids' and may hold {list(expected[1:])}; "
                f"received keys {sorted(inputs)}"
            )
        token_ids = inputs["token_ids"]
        padding_mask = inputs.get("padding_mask")
        segment_ids = inputs.get("segment_ids")
    else:
        token_ids, padding_mask, segment_ids = inputs, None, None
    if len(token_ids.shape) != 2:
        raise ValueError(
            f"token_ids must have shape (batch, length); received {tuple(token_ids.shape)}"
        )
    if padding_mask is not None and tuple(padding_mask.shape) != tuple(token_ids.shape):
        raise ValueError(
            f"padding_mask has shape {tuple(padding_mask.shape)}; expected the shape of "
            f"token_ids {tuple(token_ids.shape)}"
        )
    return token_ids, padding_mask, segment_ids


def concrete_values(tensor):
    """NumPy values of `tensor`, or None while tracing (jit, tf.function, symbolic)."""
    if tensor is None:
        return None
    if isinstance(tensor, np.ndarray):
        return tensor
    try:
        import keras

        if keras.backend.backend() == "torch":
            import torch

            if torch.compiler.is_compiling():
                return None
        return np.asarray(ops.convert_to_numpy(tensor))
    except Exception:  # A tracer has no value yet: the check is skipped.
        return None


def check_token_ids(token_ids, vocab_size, *, argument="token_ids"):
    """ValueError when a concrete id is outside [0, vocab_size); skipped while tracing.

    Example:
        >>> check_token_ids(np.array([[1, 200]]), 100)
        Traceback (most recent call last):
        ValueError: token_ids holds 200, outside the vocabulary [0, 100) ...
    """
    values = concrete_values(token_ids)
    if values is None or values.size == 0:
        return
    if not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"{argument} must be integers; received dtype {values.dtype}")
    low, high = int(values.min()), int(values.max())
    bad = low if low < 0 else high if high >= vocab_size else None
    if bad is not None:
        raise ValueError(
            f"{argument} holds {bad}, outside the vocabulary [0, {vocab_size}) of this model"
        )
