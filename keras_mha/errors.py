"""Every error keras-mha raises on purpose, with its command-line exit code in one table.

The taxonomy follows huggingface_hub's: names end in `Error`, each class also derives
from the builtin exception a Python caller would naturally catch (`ValueError`,
`ConnectionError`, `FileNotFoundError`, ...), and each carries the attributes that say
what it is about (`model_id`, `revision`, `path`, `key`, `value`), `None` where they do
not apply. Messages are one line that names the argument or config key, the value
received and what was expected. The CLI prints `keras-mha: error: <message>` and exits
with the class's `exit_code`; it never prints a traceback (`--debug` does).

Exit codes (error, builtin base: when):

- 0: success.
- 1: `KerasMHAError`, `CardError`: any other keras-mha error (e.g. an unexpected Hub answer).
- 2: `UsageError` (ValueError): a bad command-line argument (argparse's usage code).
- 3: `RepositoryNotFoundError` (LookupError): no such Hub repository (or private without a
  valid token); an unknown bundled card.
- 4: `GatedRepositoryError` (PermissionError): gated or private; a token with access is needed.
- 5: `RevisionNotFoundError` (LookupError): the revision names no branch, tag or commit.
- 6: `ConfigFileNotFoundError` (FileNotFoundError): no `config.json` where it was looked for.
- 7: `MalformedConfigError` (ValueError): `config.json` is not JSON, not an object, or over
  the size or nesting caps.
- 8: `HubUnreachableError` (ConnectionError): timeout, no connection or offline, and nothing
  cached or bundled.
- 9: `ConfigError` (ValueError): a config key is missing or holds an invalid value.
- 10: `CheckpointError` (ValueError): safetensors missing; tensors missing, unexpected or of
  the wrong shape.
- 11: `InvalidRevisionError` (ValueError): not a branch, tag, `refs/pr/N` or commit hash;
  refused before any request.
- 12: `InvalidTokenError` (ValueError): a malformed Hub token, or one the Hub rejects.
- 13: `HubResponseError` (ConnectionError): the endpoint answered something refused: a bad
  ETag, a body over the cap, a redirect loop, HTML instead of JSON.
- 14: `PathError` (OSError): a path that cannot be read or written as asked (a directory
  where a file is expected, no permission, a name too long, a full disk, a closed stdout,
  an existing non-empty output folder).
- 15: `UnsupportedModelError` (NotImplementedError): a family or feature keras-mha cannot
  build.
- 16: `PruningError` (ValueError): a pruning target, plan or score that cannot be applied.
- 17: `ExportError` (ValueError): a model that cannot be written as a Hub checkpoint that
  loads correctly (e.g. non-uniform heads).
- 18: `MissingDependencyError` (ImportError): an optional package (a Keras backend,
  matplotlib, tokenizers) is not installed.
- 19: `NonFiniteError` (ArithmeticError): a computation gave NaN or infinite values where
  numbers were needed: uptraining that diverged (a smaller learning rate), a model whose
  weights hold NaN or infinite values.
- 70: any other exception: a bug in keras-mha; one line and a hint to rerun with `--debug`.
- 130: interrupted (Ctrl-C).
- 141: the reader of stdout went away (`keras-mha inspect ... | head -1`): the run ends
  quietly, with the status a Unix tool killed by SIGPIPE reports (128 + 13).

Example:
    >>> from keras_mha.errors import ConfigError
    >>> try:
    ...     raise ConfigError("config.json: 'num_key_value_heads'=3 must divide "
    ...                       "'num_attention_heads'=8", key="num_key_value_heads", value=3)
    ... except ValueError as error:
    ...     print(error.exit_code, error.key)
    9 num_key_value_heads
"""

from __future__ import annotations

#: Exit code of an exception keras-mha did not expect (BSD sysexits' EX_SOFTWARE).
INTERNAL_ERROR_EXIT_CODE = 70
#: Exit code after Ctrl-C (128 + SIGINT), as shells report it.
INTERRUPTED_EXIT_CODE = 130
#: Exit code when the reader of stdout closed the pipe (128 + SIGPIPE), printed quietly.
BROKEN_PIPE_EXIT_CODE = 141


class KerasMHAError(Exception):
    """Base class of every error keras-mha raises on purpose.

    Args:
        message: one line naming what was wrong, the value and what was expected.
        model_id: the Hub model id the error is about, where known.
        revision: the revision, where known.
        path: the file or folder, where known.
        key: the config key or argument, where known.
        value: the value received, where known.

    Example:
        >>> KerasMHAError("something went wrong").exit_code
        1
    """

    exit_code = 1

    def __init__(
        self,
        message: str,
        *,
        model_id: str | None = None,
        revision: str | None = None,
        path: str | None = None,
        key: str | None = None,
        value: object = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.model_id = model_id
        self.revision = revision
        self.path = path
        self.key = key
        self.value = value

    def __str__(self) -> str:
        return self.message


class CardError(KerasMHAError):
    """Base class of the errors met while finding, reading and describing a model card."""

    exit_code = 1


class UsageError(KerasMHAError, ValueError):
    """A command-line argument is malformed (the CLI's usage error).

    Example:
        >>> UsageError("--seq-len: '12q' is not a length; expected e.g. 4096 or 32k").exit_code
        2
    """

    exit_code = 2


class RepositoryNotFoundError(CardError, LookupError):
    """The Hub has no repository with this id (or it is private and no valid token was sent).

    Example:
        >>> RepositoryNotFoundError("org/missing: repository not found").exit_code
        3
    """

    exit_code = 3


class GatedRepositoryError(CardError, PermissionError):
    """The repository exists but is gated or private: a token with access is needed.

    Example:
        >>> GatedRepositoryError("meta-llama/Meta-Llama-3-8B: gated, pass --token").exit_code
        4
    """

    exit_code = 4


class RevisionNotFoundError(CardError, LookupError):
    """The repository exists but the branch, tag or commit asked for does not.

    Example:
        >>> RevisionNotFoundError("gpt2: revision 'v9' not found").exit_code
        5
    """

    exit_code = 5


class ConfigFileNotFoundError(CardError, FileNotFoundError):
    """The repository, directory or path holds no `config.json`.

    Example:
        >>> ConfigFileNotFoundError("./my-model: no config.json in this directory").exit_code
        6
    """

    exit_code = 6


class MalformedConfigError(CardError, ValueError):
    """`config.json` is not valid JSON, not a JSON object, or over the size/nesting caps.

    Example:
        >>> MalformedConfigError("config.json: line 3 column 5: Expecting value").exit_code
        7
    """

    exit_code = 7


class HubUnreachableError(CardError, ConnectionError):
    """The Hub could not be reached (timeout, no connection, offline mode), nothing was
    cached and no bundled card answers for this model id.

    Example:
        >>> HubUnreachableError("org/name: the Hub timed out after 10 s").exit_code
        8
    """

    exit_code = 8


class ConfigError(CardError, ValueError):
    """The config was read but lacks a key needed to describe the model, or holds a value
    outside what is valid (the message names the key, the value and what was expected).

    Example:
        >>> ConfigError("config.json: missing 'num_attention_heads'").exit_code
        9
    """

    exit_code = 9


class CheckpointError(KerasMHAError, ValueError):
    """A checkpoint's files or tensors do not match what its config describes.

    Example:
        >>> CheckpointError("model.safetensors: missing tensor 'lm_head.weight'").exit_code
        10
    """

    exit_code = 10


class InvalidRevisionError(CardError, ValueError):
    """A revision that is not a branch, tag, `refs/pr/N` or commit hash; refused before any
    request is made.

    Example:
        >>> InvalidRevisionError("--revision: '../../x' is not a branch, tag or commit").exit_code
        11
    """

    exit_code = 11


class InvalidTokenError(CardError, ValueError):
    """A Hub token that is malformed (refused before any request) or rejected by the Hub.

    Example:
        >>> InvalidTokenError("--token: contains a newline; expected one line").exit_code
        12
    """

    exit_code = 12


class HubResponseError(CardError, ConnectionError):
    """The endpoint answered something keras-mha refuses to use: an ETag that is not a
    plain hash, a body over the size cap, a redirect loop, HTML where JSON was expected.

    Example:
        >>> HubResponseError("gpt2: the endpoint sent 52 MB for config.json").exit_code
        13
    """

    exit_code = 13


class PathError(KerasMHAError, OSError):
    """A path that cannot be read or written as asked.

    Example:
        >>> PathError("--out: 'pruned/' exists and is not empty; pass --overwrite").exit_code
        14
    """

    exit_code = 14


class UnsupportedModelError(KerasMHAError, NotImplementedError):
    """A model family, architecture or feature that keras-mha cannot build (yet).

    Example:
        >>> UnsupportedModelError("model_type 't5': relative position bias").exit_code
        15
    """

    exit_code = 15


class PruningError(KerasMHAError, ValueError):
    """A pruning target, plan or set of scores that cannot be applied.

    Example:
        >>> PruningError("target=40 heads would leave layer 'block_0' with none").exit_code
        16
    """

    exit_code = 16


class ExportError(KerasMHAError, ValueError):
    """A model that cannot be written as a Hub checkpoint that loads correctly.

    Example:
        >>> ExportError("layer 3 keeps 6 heads, layer 0 keeps 8: not uniform").exit_code
        17
    """

    exit_code = 17


class MissingDependencyError(KerasMHAError, ImportError):
    """An optional package needed for this feature is not installed.

    Example:
        >>> MissingDependencyError("--plot needs matplotlib: pip install keras-mha[plot]").exit_code
        18
    """

    exit_code = 18


class NonFiniteError(KerasMHAError, ArithmeticError):
    """A computation gave NaN or infinite values where finite numbers were needed.

    Example:
        >>> NonFiniteError("uptraining diverged at step 2; try a smaller --lr").exit_code
        19
    """

    exit_code = 19


#: Every error class, in exit-code order (the README table is generated from the same list).
ERROR_CLASSES: tuple[type[KerasMHAError], ...] = (
    KerasMHAError,
    CardError,
    UsageError,
    RepositoryNotFoundError,
    GatedRepositoryError,
    RevisionNotFoundError,
    ConfigFileNotFoundError,
    MalformedConfigError,
    HubUnreachableError,
    ConfigError,
    CheckpointError,
    InvalidRevisionError,
    InvalidTokenError,
    HubResponseError,
    PathError,
    UnsupportedModelError,
    PruningError,
    ExportError,
    MissingDependencyError,
    NonFiniteError,
)

__all__ = [cls.__name__ for cls in ERROR_CLASSES] + [
    "BROKEN_PIPE_EXIT_CODE",
    "ERROR_CLASSES",
    "INTERNAL_ERROR_EXIT_CODE",
    "INTERRUPTED_EXIT_CODE",
]
