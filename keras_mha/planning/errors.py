"""The model-card errors, re-exported from `keras_mha.errors` (where every error lives).

Example:
    >>> from keras_mha.planning.errors import ConfigError
    >>> ConfigError("config.json: missing 'num_attention_heads'").exit_code
    9
"""

from keras_mha.errors import (
    CardError,
    CheckpointError,
    ConfigError,
    ConfigFileNotFoundError,
    GatedRepositoryError,
    HubResponseError,
    HubUnreachableError,
    InvalidRevisionError,
    InvalidTokenError,
    MalformedConfigError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

__all__ = [
    "CardError",
    "CheckpointError",
    "ConfigError",
    "ConfigFileNotFoundError",
    "GatedRepositoryError",
    "HubResponseError",
    "HubUnreachableError",
    "InvalidRevisionError",
    "InvalidTokenError",
    "MalformedConfigError",
    "RepositoryNotFoundError",
    "RevisionNotFoundError",
]
