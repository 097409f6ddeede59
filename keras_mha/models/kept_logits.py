"""`logits_to_keep`: which positions of a causal LM's output get logits.

The LM head is a `(hidden_size, vocab_size)` matmul per position, often the largest in
the model; generation needs only the last position's logits, a perplexity all of them.
As in transformers: an int `n` keeps the last `n` positions (0 keeps all), a 1-D list or
array of positions keeps those, in that order, for every row. The hidden states are
sliced before the final norm and the LM head, so the other positions cost nothing there.

Example:
    >>> import numpy as np
    >>> tuple(keep_positions(np.zeros((2, 9, 4)), 1).shape)
    (2, 1, 4)
    >>> tuple(keep_positions(np.zeros((2, 9, 4)), check_logits_to_keep([0, -1], 9)).shape)
    (2, 2, 4)
"""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_mha.errors import UsageError
from keras_mha.planning.config_values import shown


def check_logits_to_keep(logits_to_keep, length):
    """`logits_to_keep` as an int >= 0 or a NumPy int32 vector of positions in
    `[-length, length)`; a UsageError naming it otherwise. `length` may be None (unknown
    while tracing), then positions are not range-checked.

    Example:
        >>> check_logits_to_keep(None, 9)
        0
        >>> check_logits_to_keep([0, -1], 9)
        array([ 0, -1], dtype=int32)
    """
    if logits_to_keep is None:
        return 0
    if isinstance(logits_to_keep, (int, np.integer)) and not isinstance(logits_to_keep, bool):
        if logits_to_keep < 0 or (length is not None and logits_to_keep > length):
            most = "" if length is None else f" and <= the {length} positions"
            raise UsageError(
                f"logits_to_keep={logits_to_keep}; expected an int >= 0{most} (0 keeps "
                f"every position) or a list of positions",
                key="logits_to_keep",
            )
        return int(logits_to_keep)
    try:
        positions = np.asarray(logits_to_keep)
    except (TypeError, ValueError):  # a ragged list
        positions = np.asarray([], dtype=object)
    if positions.ndim != 1 or positions.size == 0 or not np.issubdtype(positions.dtype, np.integer):
        raise UsageError(
            f"logits_to_keep={shown(logits_to_keep)}; expected an int >= 0 or a non-empty "
            f"1-D list of integer positions",
            key="logits_to_keep",
        )
    if length is not None and ((positions < -length) | (positions >= length)).any():
        raise UsageError(
            f"logits_to_keep={shown(logits_to_keep)}: positions must be in "
            f"[-{length}, {length}) for {length} tokens",
            key="logits_to_keep",
        )
    return positions.astype(np.int32)


def keep_positions(hidden, logits_to_keep):
    """`hidden` `(B, T, ...)` at the positions `check_logits_to_keep` returned: the last
    `n` for an int `n > 0`, all of them for 0, else the listed positions."""
    if isinstance(logits_to_keep, int):
        return hidden if logits_to_keep == 0 else hidden[:, -logits_to_keep:]
    length = ops.shape(hidden)[1]
    # Negative positions count from the end, as in Python indexing (`take` differs per
    # backend there); a traced length is a tensor.
    where = np.where if isinstance(length, int) else ops.where
    positions = where(logits_to_keep < 0, logits_to_keep + length, logits_to_keep)
    return ops.take(hidden, positions, axis=1)


__all__ = ["check_logits_to_keep", "keep_positions"]
