"""Load a model's `config.json` from the Hugging Face Hub, a local path or a bundled card.

`load_config` accepts

- a Hub model id (`"meta-llama/Meta-Llama-3-8B"`) or a pasted model page URL
  (`https://huggingface.co/org/name`, `.../tree/REV`, `.../blob/REV/config.json`);
- a local directory holding `config.json`, or the path of a JSON file;
- `"bundled:org/name"`, one of the curated snapshots shipped with keras-mha.

A Hub id is read the way huggingface_hub reads it (the HF cache, `HF_TOKEN`,
`HF_ENDPOINT`, `HF_HOME` / `HF_HUB_CACHE`, `HF_HUB_OFFLINE`, huggingface_hub's own HTTP
session), but keras-mha fetches the few KB itself (`fetch`: one GET under one
deadline, a 10 MB cap, checked redirects) and writes them into the HF cache only after
checking every name the server sent (`cache`): a hostile endpoint cannot make it
write outside the cache. The revision, token and endpoint are checked before any
request (`inputs`, `settings`).

When the Hub cannot be reached (no connection, a timeout, the Hub answering 5xx, or
offline mode), a cached copy answers; with nothing cached, the bundled card for the
same model id answers instead; `LoadedConfig.source` is then `"bundled"` and
`LoadedConfig.note` says why. A config is data: nothing from a repository is ever
executed (there is no `trust_remote_code`).

`huggingface_hub` is imported only when a Hub id has to be resolved, so loading a
local file or a bundled card imports nothing beyond the standard library.

Example:
    >>> from keras_mha.hub.config import load_config
    >>> loaded = load_config("bundled:meta-llama/Meta-Llama-3-8B")
    >>> loaded.source, loaded.config["num_key_value_heads"]
    ('bundled', 8)
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

from keras_mha.errors import (
    ConfigFileNotFoundError,
    HubResponseError,
    HubUnreachableError,
    PathError,
    RepositoryNotFoundError,
    UsageError,
)
from keras_mha.hub import bundled, settings
from keras_mha.hub.config_json import CONFIG_FILENAME, parse_config_bytes, read_config_file
from keras_mha.hub.inputs import (
    looks_like_hub_url,
    parse_hub_url,
    validate_endpoint,
    validate_revision,
    validate_token,
)
from keras_mha.hub.responses import error_for_status
from keras_mha.hub.settings import DEFAULT_TIMEOUT_SECONDS, MAX_TIMEOUT_SECONDS
from keras_mha.safe_text import one_line
from keras_mha.version import __version__

BUNDLED_PREFIX = "bundled:"


@dataclass(frozen=True)
class LoadedConfig:
    """A raw `config.json` and where it came from.

    Attributes:
        config: the parsed JSON object, untouched.
        source: `"hub"` (downloaded or read from the HF cache), `"local"` or `"bundled"`.
        model_id: the Hub repo id, or the local path as given.
        path: the file that was read.
        revision: the revision asked for (`"main"` when none was), the bundled
            snapshot's revision, or None for a local file.
        note: why this source answered, when that is worth saying (for example the
            Hub was unreachable and the bundled card answered), else None.
        commit: the commit hash the file belongs to, when known.

    Example:
        >>> config = {"model_type": "gpt2"}
        >>> loaded = LoadedConfig(config, "local", "./gpt2", Path("gpt2/config.json"), None)
        >>> loaded.source
        'local'
    """

    config: dict
    source: str
    model_id: str
    path: Path
    revision: str | None
    note: str | None = None
    commit: str | None = None


def load_config(
    source: str,
    revision: str | None = None,
    token: str | bool | None = None,
    *,
    endpoint: str | None = None,
    offline: bool | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    cache_dir: str | os.PathLike | None = None,
) -> LoadedConfig:
    """Read the `config.json` of a Hub model, a local directory / file or a bundled card.

    Args:
        source: a Hub model id (`"org/name"`) or model page URL, a local directory or JSON
            file path, or `"bundled:org/name"` to read the bundled snapshot without touching
            the network.
        revision: branch, tag, `refs/pr/N` or commit on the Hub (default `"main"`, or the
            revision in a pasted URL); anything else is refused before any request.
        token: Hub token; None lets `huggingface_hub` find `HF_TOKEN` or the stored login;
            False sends none. A malformed token is refused before any request.
        endpoint: Hub endpoint; None uses `HF_ENDPOINT` (default `https://huggingface.co`).
        offline: never touch the network: read the HF cache, then the bundled card.
            None follows `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`).
        timeout: seconds the whole exchange with the Hub may take (connecting, redirects,
            the body), at most a day. `HF_HUB_ETAG_TIMEOUT`, when set, wins (as in
            huggingface_hub).
        cache_dir: HF cache directory; None uses `HF_HUB_CACHE` / `HF_HOME`.

    Returns:
        A `LoadedConfig`.

    Raises:
        CardError: a subclass naming what went wrong: `RepositoryNotFoundError`,
            `GatedRepositoryError`, `RevisionNotFoundError`, `ConfigFileNotFoundError`,
            `MalformedConfigError`, `HubUnreachableError`, `InvalidRevisionError`,
            `InvalidTokenError` or `HubResponseError`.
        PathError: a local path that cannot be read as asked.
        UsageError: a malformed argument.

    Example:
        >>> load_config("bundled:openai-community/gpt2").config["n_head"]
        12
    """
    if not isinstance(source, str) or not source.strip():
        raise ConfigFileNotFoundError(
            f"model source {one_line(repr(source))[:80]} is empty; pass a Hub model id "
            "(org/name), a local directory or config.json path, or bundled:org/name"
        )
    source = source.strip()
    if revision is not None:
        validate_revision(revision)
    if token is not None and not isinstance(token, bool):
        validate_token(token)
    if source.startswith(BUNDLED_PREFIX):
        model_id = source[len(BUNDLED_PREFIX) :].strip()
        note = None
        if revision is not None:
            note = f"revision {revision!r} ignored: a bundled card is one fixed snapshot"
        loaded = _load_bundled(model_id, note=note)
        if loaded is None:
            raise RepositoryNotFoundError(_unknown_bundled_message(model_id), model_id=model_id)
        return loaded

    hub_options = dict(
        token=token,
        endpoint=endpoint,
        offline=settings.offline_requested() if offline is None else offline,
        timeout=settings.deadline_seconds(timeout),
        cache_dir=cache_dir,
    )
    local_path = _expand_user(source)
    # A folder that happens to be named like a URL without a scheme (`hf.co/org/name`, as
    # some mirroring tools lay them out) is read as the local folder it is.
    if "://" not in source and _local_path_exists(source, local_path):
        return _load_local(source, local_path, revision)
    if looks_like_hub_url(source):
        configured = endpoint or settings.configured_endpoint()
        repo_id, url_revision = parse_hub_url(source, endpoint=configured)
        if url_revision is not None and revision is not None and url_revision != revision:
            raise UsageError(
                f"--revision {revision!r} conflicts with revision {url_revision!r} in the URL "
                f"{one_line(source)}; pass one of them",
                revision=revision,
            )
        return _load_from_hub(repo_id, revision=url_revision or revision, **hub_options)

    if _looks_like_path(source):
        raise ConfigFileNotFoundError(
            f"{_shorten(source)}: no such file or directory; pass a Hub model id (org/name), "
            "an existing directory holding config.json or a config.json path, or bundled:org/name",
            path=source,
        )
    return _load_from_hub(source, revision=revision, **hub_options)


def _expand_user(source: str) -> Path:
    """`~/x` and `~user/x` expanded; a `~name` naming no user stays as typed."""
    try:
        return Path(source).expanduser()
    except RuntimeError:  # "Could not determine home directory" for an unknown ~name
        return Path(source)


def _local_path_exists(source: str, local_path: Path) -> bool:
    """Whether `local_path` exists; a path that cannot even be looked at is a PathError."""
    try:
        os.stat(local_path)
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ENOTDIR):
            return False
        if error.errno == errno.ENAMETOOLONG and not _looks_like_path(source):
            return False  # e.g. a long string with no '/': reported as an invalid model id
        reason = {
            errno.EACCES: "permission denied",
            errno.ENAMETOOLONG: "the name is too long",
            errno.ELOOP: "too many levels of symbolic links",
        }.get(error.errno, error.strerror or type(error).__name__)
        raise PathError(
            f"{_shorten(source)}: cannot look at this path: {reason}", path=source
        ) from None
    except ValueError:  # an embedded NUL byte
        return False
    return True


def _load_local(source: str, local_path: Path, revision: str | None) -> LoadedConfig:
    if local_path.is_dir():
        config_path = local_path / CONFIG_FILENAME
        if not config_path.exists():
            raise ConfigFileNotFoundError(
                f"{source}: no {CONFIG_FILENAME} in this directory; point at the directory "
                "that holds the model's config.json, or at the JSON file itself",
                path=source,
            )
    else:
        config_path = local_path
    config = read_config_file(config_path, described_as=_shorten(source))
    note = None
    if revision is not None:
        note = f"revision {revision!r} ignored for a local path"
    return LoadedConfig(config, "local", source, config_path, None, note)


def _load_bundled(model_id: str, *, note: str | None) -> LoadedConfig | None:
    """The bundled card for `model_id` as a LoadedConfig, or None if there is none."""
    config_path = bundled.bundled_config_path(model_id)
    if config_path is None:
        return None
    provenance = bundled.bundled_source(model_id)
    card_directory = config_path.parent
    repo_id = provenance.get("repo_id") or f"{card_directory.parent.name}/{card_directory.name}"
    config = read_config_file(config_path, described_as=f"bundled card {repo_id}")
    bundled_revision = provenance.get("revision")
    return LoadedConfig(config, "bundled", repo_id, config_path, bundled_revision, note)


def _unknown_bundled_message(model_id: str) -> str:
    available = bundled.list_bundled()
    close = bundled.close_bundled_ids(model_id)
    hint = (
        f"did you mean {', '.join(f'bundled:{name}' for name in close)}?"
        if close
        else "run `keras-mha cards` to list them"
    )
    return (
        f"bundled:{_shorten(model_id)}: no bundled card with this id ({len(available)} bundled); "
        f"{hint}"
    )


def _looks_like_path(source: str) -> bool:
    """True for strings that cannot be a Hub repo id, so a missing path is reported as such."""
    return (
        source.startswith(("/", "./", "../", "~", "\\"))
        or source.endswith(".json")
        or source.count("/") > 1
        or "\\" in source
        or source in (".", "..")
    )


def _shorten(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _load_from_hub(
    repo_id: str,
    *,
    revision: str | None,
    token: str | bool | None,
    endpoint: str | None,
    offline: bool,
    timeout: float,
    cache_dir: str | os.PathLike | None,
) -> LoadedConfig:
    settings.check_hub_environment()
    try:
        import huggingface_hub
    except ImportError as error:
        return _fall_back_to_bundled(
            repo_id,
            revision,
            reason=f"huggingface_hub is not installed ({error}), so the Hub cannot be read",
        )
    from huggingface_hub import constants
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise RepositoryNotFoundError(
            f"{_shorten(repo_id)}: not a valid Hub model id and not an existing local path "
            f"({_shorten(one_line(str(error)), 160)}); "
            f"pass org/name, a directory holding config.json, or bundled:org/name"
            f"{bundled.did_you_mean(repo_id)}",
            model_id=repo_id,
        ) from None

    requested_revision = revision or "main"
    described_as = f"{repo_id}@{requested_revision}"
    cache_dir = os.fspath(cache_dir if cache_dir is not None else constants.HF_HUB_CACHE)
    cached = huggingface_hub.try_to_load_from_cache(
        repo_id, CONFIG_FILENAME, cache_dir=cache_dir, revision=requested_revision
    )
    cached_path = Path(cached) if isinstance(cached, str) else None
    if offline:
        if cached_path is not None:
            return _load_cached(repo_id, requested_revision, cached_path, note=None)
        return _fall_back_to_bundled(
            repo_id, revision, reason="offline mode is on and config.json is not in the HF cache"
        )

    endpoint = validate_endpoint(
        endpoint if endpoint is not None else constants.ENDPOINT,
        argument="--endpoint" if endpoint is not None else "HF_ENDPOINT",
    )
    token_to_send, token_name = settings.resolve_token(huggingface_hub, token)
    from keras_mha.hub import cache as hub_cache
    from keras_mha.hub.fetch import fetch

    url = huggingface_hub.hf_hub_url(
        repo_id, CONFIG_FILENAME, revision=requested_revision, endpoint=endpoint
    )
    headers = huggingface_hub.utils.build_hf_headers(
        token=token_to_send or False, library_name="keras-mha", library_version=__version__
    )
    headers["Accept-Encoding"] = "identity"
    # The token never appears in a message (URL passwords are redacted by safe_text).
    secrets = (token_to_send,) if token_to_send else ()
    try:
        answer = fetch(
            url, headers=headers, timeout=timeout, described_as=described_as, secrets=secrets
        )
        unreachable = error_for_status(answer, repo_id, revision, token_name, token_to_send)
    except HubUnreachableError as reason:
        unreachable = f"the Hub could not be reached ({one_line(str(reason), secrets)})"
    if isinstance(unreachable, str):
        if cached_path is not None:
            return _load_cached(
                repo_id,
                requested_revision,
                cached_path,
                note=f"{unreachable}; answered from the HF cache",
            )
        return _fall_back_to_bundled(repo_id, revision, reason=unreachable)

    content_type = answer.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type in ("text/html", "application/xhtml+xml"):
        raise HubResponseError(
            f"{described_as}: the endpoint answered an HTML page instead of {CONFIG_FILENAME}; "
            "check HF_ENDPOINT / --endpoint (a web page or a proxy login?)",
            model_id=repo_id,
            revision=requested_revision,
        )
    commit = hub_cache.checked_commit(answer.commit, described_as=described_as, revision=revision)
    etag = hub_cache.checked_etag(answer.etag, described_as=described_as)
    config = parse_config_bytes(answer.body, described_as=f"{described_as} ({CONFIG_FILENAME})")
    snapshot = hub_cache.store_config(
        cache_dir,
        repo_id,
        revision=requested_revision,
        commit=commit,
        etag=etag,
        data=answer.body,
    )
    return LoadedConfig(config, "hub", repo_id, snapshot, requested_revision, None, commit)


def _load_cached(repo_id: str, revision: str, path: Path, *, note: str | None) -> LoadedConfig:
    config = read_config_file(path, described_as=f"{repo_id}@{revision} (HF cache)")
    commit = path.parent.name if path.parent.parent.name == "snapshots" else None
    return LoadedConfig(config, "hub", repo_id, path, revision, note, commit)


def _fall_back_to_bundled(repo_id: str, revision: str | None, *, reason: str) -> LoadedConfig:
    """Answer from the bundled card when the Hub cannot, or raise HubUnreachableError."""
    loaded = _load_bundled(repo_id, note=None)
    if loaded is None:
        raise HubUnreachableError(
            f"{repo_id}: {reason}, and keras-mha bundles no card for it; connect to the Hub "
            "(or set HF_ENDPOINT to a mirror) and retry, or pass a local directory holding "
            f"config.json{bundled.did_you_mean(repo_id)}",
            model_id=repo_id,
            revision=revision,
        )
    if revision is not None and revision not in ("main", loaded.revision):
        raise HubUnreachableError(
            f"{repo_id}: {reason}; the bundled card is revision {loaded.revision!r}, "
            f"not {revision!r}; retry online, or ask for no revision (drop --revision, or the "
            "URL's /tree/...) to use the bundled card",
            model_id=repo_id,
            revision=revision,
        )
    note = f"{reason}; answered from the bundled snapshot"
    if loaded.revision:
        note += f" (revision {loaded.revision})"
    return LoadedConfig(
        loaded.config, "bundled", loaded.model_id, loaded.path, loaded.revision, note
    )


__all__ = [
    "CONFIG_FILENAME",
    "DEFAULT_TIMEOUT_SECONDS",
    "MAX_TIMEOUT_SECONDS",
    "LoadedConfig",
    "load_config",
    "read_config_file",
]
