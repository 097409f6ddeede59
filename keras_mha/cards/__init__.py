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

# Rebuilding layers imports keras, which `keras-mha inspect` must never do: these two
# names are imported on first use (PEP 562).
_LAZY_REBUILD_NAMES = {
    "build_attention": "keras_mha.cards.rebuild",
    "load_attention_weights": "keras_mha.cards.checkpoint_weights",
}


def __getattr__(name):
    if name in _LAZY_REBUILD_NAMES:
        import importlib

        return getattr(importlib.import_module(_LAZY_REBUILD_NAMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
