"""Checks of the attention layers' arguments and input shapes, one line per error.

Every error is a `ValueError` naming the argument, the value received and what
was expected, raised where the mistake is made: constructor arguments at
construction, input shapes at `build`, `compute_output_shape` /
`compute_output_spec` (symbolic calls) and `call` (eager calls and calls traced
by `jax.jit`, `tf.function` or `torch.compile`, where shapes are known when the
function is traced).

Like `keras.layers.MultiHeadAttention`, `key` and `value` must agree in every
dimension but the last; unlike it, the batch of `query` is checked too: a
`(1, S, F)` key would otherwise be broadcast silently over a batch of queries
by some backends' einsum. TensorFlow graphs traced with an unknown batch or
length get a runtime assertion instead (outside XLA, which drops assertions).

Example:
    >>> positive_int("num_heads", 8)
    8
    >>> finite_number("dropout", 0.1, at_least=0.0, below=1.0)
    0.1
    >>> check_input_shapes((2, 5, 8), (2, 6, 8), (2, 7, 8))
    Traceback (most recent call last):
    ValueError: `key` and `value` must have the same batch size and length ...
"""

from __future__ import annotations

import math

import numpy as np

_INTEGER_TYPES = (int, np.integer)
_REAL_TYPES = (int, float, np.integer, np.floating)


def _is_bool(value):
    return isinstance(value, (bool, np.bool_))


def positive_int(name, value, allow_none=False):
    """`value` as an int, refusing bools, floats, strings and values < 1.

    Example:
        >>> positive_int("head_dim", None, allow_none=True) is None
        True
    """
    if value is None and allow_none:
        return None
    if _is_bool(value) or not isinstance(value, _INTEGER_TYPES) or value <= 0:
        expected = "a positive integer or None" if allow_none else "a positive integer"
        raise ValueError(f"`{name}` must be {expected}; received {value!r}.")
    return int(value)


def optional_int(name, value):
    """`value` as an int, or None; refuses bools, floats and strings (any integer passes:
    a seed may be negative). Checked even where it is unused (`seed` without dropout), so
    a bad value never waits in a saved config for the day it is used.

    Example:
        >>> optional_int("seed", 7), optional_int("seed", None)
        (7, None)
    """
    if value is None:
        return None
    if _is_bool(value) or not isinstance(value, _INTEGER_TYPES):
        raise ValueError(f"`{name}` must be an integer or None; received {value!r}.")
    return int(value)


def _range_text(above, at_least, below, at_most):
    low = f"({above}" if above is not None else f"[{at_least}" if at_least is not None else None
    high = f"{below})" if below is not None else f"{at_most}]" if at_most is not None else None
    if low and high:
        return f" in {low}, {high}"
    if above is not None:
        return f" > {above}"
    if at_least is not None:
        return f" >= {at_least}"
    if below is not None:
        return f" < {below}"
    if at_most is not None:
        return f" <= {at_most}"
    return ""


def finite_number(
    name, value, *, above=None, at_least=None, below=None, at_most=None, allow_none=False
):
    """`value` as a float: a real number (not a bool or a string), finite, in range.

    Args:
        name: the argument's name, for the message.
        value: what was received.
        above, at_least, below, at_most: open / closed bounds (None: unbounded).
        allow_none: accept None (returned as None).

    Example:
        >>> finite_number("attention_scale", float("inf"), above=0)
        Traceback (most recent call last):
        ValueError: `attention_scale` must be a finite number > 0; received inf.
    """
    if value is None and allow_none:
        return None
    valid = not _is_bool(value) and isinstance(value, _REAL_TYPES)
    if valid:
        number = float(value)
        valid = (
            math.isfinite(number)
            and (above is None or number > above)
            and (at_least is None or number >= at_least)
            and (below is None or number < below)
            and (at_most is None or number <= at_most)
        )
    if not valid:
        expected = "a finite number" + _range_text(above, at_least, below, at_most)
        if allow_none:
            expected += " or None"
        raise ValueError(f"`{name}` must be {expected}; received {value!r}.")
    return number


def flag(name, value, allow_none=False):
    """`value` as a bool; `"false"`, `0.0` or `None` are refused rather than guessed.

    Example:
        >>> flag("causal", True)
        True
    """
    if value is None and allow_none:
        return None
    if not _is_bool(value):
        expected = "True, False or None" if allow_none else "True or False"
        raise ValueError(f"`{name}` must be {expected}; received {value!r}.")
    return bool(value)


# ------------------------------------------------------------------ shapes
def _dims(shape):
    return tuple(shape)


def _known(dim):
    """A static dimension as an int; None stays None (unknown while tracing).

    A torch `SymInt` (dynamic shapes under `torch.compile`) is returned as is:
    comparing two of them makes torch guard on the equality instead of
    specialising the compiled graph on the sizes.
    """
    if dim is None or not isinstance(dim, _INTEGER_TYPES):
        return dim
    return int(dim)


def check_rank(name, shape):
    """`shape` must be `(batch, length, features)`.

    Example:
        >>> check_rank("query", (2, 5))
        Traceback (most recent call last):
        ValueError: `query` must have rank 3 (batch, length, features); received shape (2, 5).
    """
    if len(shape) != 3:
        raise ValueError(
            f"`{name}` must have rank 3 (batch, length, features); received shape {_dims(shape)}."
        )


def check_input_shapes(query_shape, value_shape=None, key_shape=None):
    """Ranks, a non-empty query, and batch / length agreement of `query`, `value` and `key`,
    where static.

    `value` defaults to `query` and `key` to `value`, as in the layer's call.
    Unknown (None) dimensions are not compared.

    Example:
        >>> check_input_shapes((2, 5, 8), (1, 6, 8))
        Traceback (most recent call last):
        ValueError: `query` and `value` must have the same batch size; ...
    """
    value_shape = query_shape if value_shape is None else value_shape
    key_shape = value_shape if key_shape is None else key_shape
    for name, shape in (("query", query_shape), ("value", value_shape), ("key", key_shape)):
        check_rank(name, shape)
    key_dims = [_known(d) for d in key_shape[:2]]
    value_dims = [_known(d) for d in value_shape[:2]]
    if any(
        k is not None and v is not None and k != v
        for k, v in zip(key_dims, value_dims, strict=True)
    ):
        raise ValueError(
            "`key` and `value` must have the same batch size and length (all dimensions but "
            f"the last); received key shape {_dims(key_shape)} and value shape "
            f"{_dims(value_shape)}."
        )
    check_query_length(query_shape)
    query_batch, value_batch = _known(query_shape[0]), _known(value_shape[0])
    if query_batch is not None and value_batch is not None and query_batch != value_batch:
        raise ValueError(
            "`query` and `value` must have the same batch size; received query shape "
            f"{_dims(query_shape)} and value shape {_dims(value_shape)}."
        )


def check_query_length(query_shape):
    """A query with no positions is refused, where its length is static.

    Example:
        >>> check_query_length((2, 0, 8))
        Traceback (most recent call last):
        ValueError: `query` has no positions (shape (2, 0, 8)); expected a length of at least 1: ...
    """
    if isinstance(_known(query_shape[1]), int) and _known(query_shape[1]) == 0:
        # Every backend alike: TensorFlow's CPU matmul fails on an empty query, JAX and
        # torch would return an empty output.
        raise ValueError(
            f"`query` has no positions (shape {_dims(query_shape)}); expected a length of at "
            "least 1: there is nothing to attend from."
        )


def check_call_inputs(query, value, key):
    """`check_input_shapes` on tensors, plus runtime assertions in TensorFlow graphs.

    Under `tf.function` a batch or length may be unknown (None) while tracing;
    TensorFlow's kernels would then broadcast a size-1 batch silently, so the
    graph asserts the equality when it runs (`tf.function` runs assertions by
    itself: they are stateful ops). They raise `InvalidArgumentError`.

    Example:
        >>> query, keys = keras.ops.ones((2, 3, 8)), keras.ops.ones((2, 5, 8))
        >>> check_call_inputs(query, value=keys, key=keys)
        >>> check_call_inputs(query, value=keys[:1], key=keys[:1])
        Traceback (most recent call last):
        ...
        ValueError: ...
    """
    if value is query and key is query:  # self-attention: nothing to agree with
        check_rank("query", query.shape)
        check_query_length(query.shape)
        return
    check_input_shapes(query.shape, value.shape, key.shape)
    pairs = []
    if key is not value:
        pairs += [("key", key, "value", value, 0), ("key", key, "value", value, 1)]
    if value is not query:
        pairs.append(("query", query, "value", value, 0))
    unknown = [
        pair
        for pair in pairs
        if _known(pair[1].shape[pair[4]]) is None or _known(pair[3].shape[pair[4]]) is None
    ]
    if not unknown:
        return
    from keras_mha import backends

    backends.current().check_lengths_at_run_time(unknown)


def check_cache_use(cache, cache_index, self_attention):
    """Refuse a `cache_index` without a cache, and a cache in a call that cannot use it:
    a read-only (cross-attention) cache beside a `value`, or a cache written at
    `cache_index` in cross-attention.

    Example:
        >>> cache = (np.zeros((1, 2, 4, 8)), np.zeros((1, 2, 4, 8)))
        >>> check_cache_use(cache, cache_index=None, self_attention=False)
        Traceback (most recent call last):
        ValueError: Pass either `value` or a read-only `cache` (cross-attention), not both.
    """
    if cache is None and cache_index is not None:
        raise ValueError(
            f"`cache_index`={cache_index!r:.80} was given without a `cache`; pass the cache "
            "from `init_cache` to decode, or neither."
        )
    if cache is None or self_attention:
        return
    if cache_index is None:
        raise ValueError("Pass either `value` or a read-only `cache` (cross-attention), not both.")
    raise ValueError(
        "A cache with `cache_index` is for self-attention decoding; for cross-attention "
        "build one with `compute_cross_attention_cache` and call without `value` and "
        "without `cache_index`."
    )


def check_cache_index(cache_index):
    """Refuse a `cache_index` that is not an integer scalar: a Python or NumPy int, or a
    0-D integer tensor (traced or not). A float or bool used to be truncated silently
    (`2.5` wrote at 2), and a vector failed deep inside a backend kernel.

    Example:
        >>> check_cache_index(3)
        >>> check_cache_index(2.5)
        Traceback (most recent call last):
        ValueError: `cache_index` must be an integer scalar (...); received 2.5.
    """
    if _is_bool(cache_index):
        _refuse_cache_index(repr(cache_index))
    if isinstance(cache_index, _INTEGER_TYPES):
        return
    dtype, shape = getattr(cache_index, "dtype", None), getattr(cache_index, "shape", None)
    if dtype is None or shape is None:
        _refuse_cache_index(f"{cache_index!r:.80}")
    import keras

    dtype = keras.backend.standardize_dtype(dtype)
    if not dtype.startswith(("int", "uint")) or tuple(shape) != ():
        _refuse_cache_index(f"a tensor of dtype {dtype} and shape {tuple(shape)}")


def _refuse_cache_index(received):
    raise ValueError(
        "`cache_index` must be an integer scalar (a Python int or a 0-D integer tensor); "
        f"received {received}."
    )
