"""keras-mha: multi-head, grouped-query and multi-query attention for Keras 3.

The layers run unchanged on TensorFlow, JAX and PyTorch. Importing this package
is cheap: the layers (and therefore keras and a backend) are only imported when
first used, so that `keras-mha inspect` starts in a fraction of a second.

Example:
    >>> import keras_mha
    >>> layer = keras_mha.GroupedQueryAttention(num_heads=8, num_key_value_heads=2)
    >>> keras_mha.plan("bundled:meta-llama/Meta-Llama-3-8B", gpu="L4").serving_fits
    True
"""

from keras_mha import backend_choice, moved_paths
from keras_mha.version import __version__

# The module paths that moved in 0.3 keep importing, with a DeprecationWarning.
moved_paths.install()
# Before the first `import keras`: a backend that is installed, or one line saying none is.
backend_choice.install()

# Names resolved lazily (PEP 562) so `import keras_mha` never imports keras.
_LAZY_LAYER_EXPORTS = (
    "GroupedQueryAttention",
    "MultiHeadAttention",
    "MultiQueryAttention",
    "RotaryEmbedding",
)


# The memory planner (pure Python: never imports keras).
_LAZY_PLAN_EXPORTS = ("Plan", "plan")

# Model-level functions, by the module that holds them (imported on first use too).
_LAZY_FUNCTION_EXPORTS = {"convert_attention": "keras_mha.conversion.convert"}


def __getattr__(name):
    if name in _LAZY_LAYER_EXPORTS:
        from keras_mha import layers

        return getattr(layers, name)
    if name in _LAZY_PLAN_EXPORTS:
        from keras_mha.planning import plan

        return getattr(plan, name)
    if name in _LAZY_FUNCTION_EXPORTS:
        import importlib

        return getattr(importlib.import_module(_LAZY_FUNCTION_EXPORTS[name]), name)
    raise AttributeError(f"module 'keras_mha' has no attribute {name!r}")


def __dir__():
    return sorted(
        list(globals())
        + list(_LAZY_LAYER_EXPORTS)
        + list(_LAZY_PLAN_EXPORTS)
        + list(_LAZY_FUNCTION_EXPORTS)
    )


__all__ = ["__version__", *_LAZY_LAYER_EXPORTS, *_LAZY_PLAN_EXPORTS, *_LAZY_FUNCTION_EXPORTS]
