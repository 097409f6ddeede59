"""Named errors for loading and reading model cards, each with its own CLI exit code.

Every error message is one line that names the model id, revision or path involved
and says what to do about it. `keras-mha inspect` prints the message after
`keras-mha: error:` and exits with the error's `exit_code`, never a traceback.

Exit codes (2 is argparse's own usage error):

| code | error |
|---|---|
| 1 | `CardError` (any other card problem) |
| 3 | `RepositoryNotFound` |
| 4 | `GatedRepository` |
| 5 | `RevisionNotFound` |
| 6 | `ConfigFileNotFound` |
| 7 | `MalformedConfig` |
| 8 | `HubUnreachable` |
| 9 | `ConfigError` |

Example:
    >>> from keras_mha.cards.errors import CardError, RevisionNotFound
    >>> try:
    ...     raise RevisionNotFound("gpt2: revision 'v9' not found; pass an existing one")
    ... except CardError as error:
    ...     print(error.exit_code)
    5
"""

from __future__ import annotations


class CardError(Exception):
    """Base class of every model-card error; `exit_code` is what the CLI exits with.

    Example:
        >>> CardError("something went wrong").exit_code
        1
    """

    exit_code = 1


class RepositoryNotFound(CardError):
    """The Hub has no repository with this id (or it is private and no valid token was sent).

    Example:
        >>> RepositoryNotFound("org/missing: repository not found").exit_code
        3
    """

    exit_code = 3


class GatedRepository(CardError):
    """The repository exists but is gated or private: a token with access is needed.

    Example:
        >>> GatedRepository("meta-llama/Meta-Llama-3-8B: gated, pass --token").exit_code
        4
    """

    exit_code = 4


class RevisionNotFound(CardError):
    """The repository exists but the branch, tag or commit asked for does not.

    Example:
        >>> RevisionNotFound("gpt2: revision 'v9' not found").exit_code
        5
    """

    exit_code = 5


class ConfigFileNotFound(CardError):
    """The repository, directory or path holds no `config.json`.

    Example:
        >>> ConfigFileNotFound("./my-model: no config.json in this directory").exit_code
        6
    """

    exit_code = 6


class MalformedConfig(CardError):
    """`config.json` is not valid JSON or not a JSON object; the message gives file, line, column.

    Example:
        >>> MalformedConfig("config.json: line 3 column 5: Expecting value").exit_code
        7
    """

    exit_code = 7


class HubUnreachable(CardError):
    """The Hub could not be reached (timeout, no connection, offline mode), nothing was
    cached and no bundled card answers for this model id.

    Example:
        >>> HubUnreachable("org/name: the Hub timed out after 10 s and nothing is cached").exit_code
        8
    """

    exit_code = 8


class ConfigError(CardError, ValueError):
    """The config was read but lacks a key needed to describe the model (or holds a bad value).

    It is also a `ValueError`, so code that validates configs can catch either.

    Example:
        >>> ConfigError("config.json: missing 'num_attention_heads'").exit_code
        9
    """

    exit_code = 9


__all__ = [
    "CardError",
    "ConfigError",
    "ConfigFileNotFound",
    "GatedRepository",
    "HubUnreachable",
    "MalformedConfig",
    "RepositoryNotFound",
    "RevisionNotFound",
]
