"""Model cards: read a Hub `config.json`, normalise it, and report parameter and KV-cache costs.

Nothing here imports keras, a backend or `huggingface_hub` at import time:
`huggingface_hub` is imported only when a Hub model id has to be fetched.

Example:
    >>> from keras_mha.cards import load_config
    >>> load_config("bundled:meta-llama/Meta-Llama-3-8B").source
    'bundled'
"""

from keras_mha.cards.bundled import bundled_config_path, list_bundled
from keras_mha.cards.errors import (
    CardError,
    ConfigError,
    ConfigFileNotFound,
    GatedRepository,
    HubUnreachable,
    MalformedConfig,
    RepositoryNotFound,
    RevisionNotFound,
)
from keras_mha.cards.hub import LoadedConfig, load_config

__all__ = [
    "CardError",
    "ConfigError",
    "ConfigFileNotFound",
    "GatedRepository",
    "HubUnreachable",
    "LoadedConfig",
    "MalformedConfig",
    "RepositoryNotFound",
    "RevisionNotFound",
    "bundled_config_path",
    "list_bundled",
    "load_config",
]
