"""Model cards: read a Hub `config.json`, normalise it, and report parameter and KV-cache costs.

Nothing here imports keras, a backend or `huggingface_hub` at import time:
`huggingface_hub` is imported only when a Hub model id has to be fetched.

Example:
    >>> from keras_mha.cards import load_config
    >>> load_config("bundled:meta-llama/Meta-Llama-3-8B").source
    'bundled'
"""

from keras_mha.cards.bundled import bundled_config_path, list_bundled
from keras_mha.cards.costs import KVCacheCost, ParameterCounts, kv_cache_cost, parameter_counts
from keras_mha.cards.errors import (
    CardError,
    ConfigError,
    ConfigFileNotFoundError,
    GatedRepositoryError,
    HubUnreachableError,
    MalformedConfigError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from keras_mha.cards.hub import LoadedConfig, load_config
from keras_mha.cards.spec import ModelSpec, from_config

__all__ = [
    "CardError",
    "ConfigError",
    "ConfigFileNotFoundError",
    "GatedRepositoryError",
    "HubUnreachableError",
    "KVCacheCost",
    "LoadedConfig",
    "MalformedConfigError",
    "ModelSpec",
    "ParameterCounts",
    "RepositoryNotFoundError",
    "RevisionNotFoundError",
    "bundled_config_path",
    "from_config",
    "kv_cache_cost",
    "list_bundled",
    "load_config",
    "parameter_counts",
]

# Rebuilding layers moved to keras_mha.models in 0.3; these names still resolve, on first
# use (PEP 562: keras_mha.cards itself never imports keras), with a DeprecationWarning.
_MOVED_TO_MODELS = {
    "build_attention": "keras_mha.models.rebuild",
    "load_attention_weights": "keras_mha.models.checkpoint_weights",
}


def __getattr__(name):
    if name in _MOVED_TO_MODELS:
        import importlib
        import warnings

        warnings.warn(
            f"keras_mha.cards.{name} is deprecated and will be removed in 0.4; import it from "
            f"keras_mha.models ({_MOVED_TO_MODELS[name]})",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(_MOVED_TO_MODELS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
