"""What a Hub answer's HTTP status and `X-Error-Code` mean: a `CardError` naming the
model, revision and the fix (gated, not found, bad token, ...), or a reason to answer
from the HF cache or a bundled card when the Hub is down. Shared by `config.json`
(`keras_mha.hub.config`) and every other file (`keras_mha.hub.files`).

Example:
    >>> from types import SimpleNamespace
    >>> error_for_status(SimpleNamespace(status=200, headers={}), "org/name", None, "", None)
"""

from __future__ import annotations

from keras_mha.errors import (
    CardError,
    ConfigFileNotFoundError,
    GatedRepositoryError,
    InvalidTokenError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from keras_mha.hub import bundled
from keras_mha.hub.config_json import CONFIG_FILENAME
from keras_mha.safe_text import one_line

_INVALID_CREDENTIALS = "Invalid credentials in Authorization header"


def error_for_status(answer, repo_id, revision, token_name, token) -> None | str:
    """None for a 2xx answer; a reason string when the Hub is down (5xx, 408, 429: the
    caller answers from the cache or a bundled card); else raises the CardError the
    Hub's status and `X-Error-Code` mean (as `huggingface_hub.hf_raise_for_status`).

    `answer` is a `keras_mha.hub.fetch.Answer` (its `status` and `headers`); `token_name`
    says how messages name the token (`--token`, `HF_TOKEN`, ...).

    Example:
        >>> from types import SimpleNamespace
        >>> down = SimpleNamespace(status=503, headers={})
        >>> error_for_status(down, "org/name", None, "no token", None)
        'the Hub answered HTTP 503'
    """
    status = answer.status
    if 200 <= status < 300:
        return None
    shown_revision = revision or "main"
    error_code = answer.headers.get("x-error-code")
    server_message = one_line(answer.headers.get("x-error-message", ""), (token,))[:200]
    token_hint = (
        f"check that the token ({token_name}) has access"
        if token
        else "log in with `hf auth login`, set HF_TOKEN or pass --token"
    )
    bundled_hint = ""
    if bundled.bundled_config_path(repo_id) is not None:
        bundled_hint = f" (a bundled snapshot is available: bundled:{repo_id})"
    about = dict(model_id=repo_id, revision=shown_revision)
    if (
        status == 401
        and token
        and (
            error_code not in ("GatedRepo", "RepoNotFound")
            or server_message == _INVALID_CREDENTIALS
        )
    ):
        raise InvalidTokenError(
            f"{repo_id}: the Hub rejected the token ({token_name}) with HTTP 401"
            f"{': ' + server_message if server_message else ''}; it may be revoked or mistyped: "
            "create a new one at https://huggingface.co/settings/tokens",
            **about,
        )
    if error_code == "GatedRepo":
        raise GatedRepositoryError(
            f"{repo_id}: gated repository, access needs a token from an account that accepted "
            f"its conditions on the Hub; {token_hint}{bundled_hint}",
            **about,
        )
    if error_code == "RevisionNotFound":
        raise RevisionNotFoundError(
            f"{repo_id}: revision {shown_revision!r} not found; pass an existing branch, tag or "
            "commit hash with --revision",
            **about,
        )
    if error_code == "EntryNotFound":
        raise ConfigFileNotFoundError(
            f"{repo_id}@{shown_revision}: the repository has no {CONFIG_FILENAME}; "
            "it may hold a non-transformers model (GGUF, adapters, ...) - point at a repo "
            "or local directory that has one",
            **about,
        )
    if error_code == "RepoNotFound" or status == 401:
        raise RepositoryNotFoundError(
            f"{repo_id}: repository not found on the Hub (if it is private, {token_hint}); "
            f"check the model id{bundled_hint}{bundled.did_you_mean(repo_id)}",
            **about,
        )
    if status == 403:
        raise GatedRepositoryError(
            f"{repo_id}: the Hub refused access (HTTP 403); {token_hint}{bundled_hint}", **about
        )
    if status >= 500 or status in (408, 429):
        return f"the Hub answered HTTP {status}"
    if status == 404:
        raise RepositoryNotFoundError(
            f"{repo_id}@{shown_revision}: the endpoint answered HTTP 404 for {CONFIG_FILENAME}"
            f"{': ' + server_message if server_message else ''}{bundled.did_you_mean(repo_id)}",
            **about,
        )
    raise CardError(
        f"{repo_id}@{shown_revision}: the Hub answered HTTP {status} for {CONFIG_FILENAME}"
        f"{': ' + server_message if server_message else ''}",
        **about,
    )
