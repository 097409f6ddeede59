"""Load a model's `config.json` from the Hugging Face Hub, a local path or a bundled card.

`load_config` accepts

- a Hub model id (`"meta-llama/Meta-Llama-3-8B"`), fetched with
  `huggingface_hub.hf_hub_download`, so the HF cache, `HF_TOKEN`, `HF_ENDPOINT`,
  `HF_HOME` / `HF_HUB_CACHE` and `HF_HUB_OFFLINE` behave as they do everywhere else;
- a local directory holding `config.json`, or the path of a JSON file;
- `"bundled:org/name"`, one of the curated snapshots shipped with keras-mha.

When the Hub cannot be reached (no connection, a timeout, the Hub answering 5xx,
or offline mode) and the HF cache does not hold the file, the bundled card for the
same model id answers instead; `LoadedConfig.source` is then `"bundled"` and
`LoadedConfig.note` says why. A config is data: nothing from a repository is ever
executed (there is no `trust_remote_code`).

`huggingface_hub` is imported only when a Hub id has to be resolved, so loading a
local file or a bundled card imports nothing beyond the standard library.

Example:
    >>> from keras_mha.cards.hub import load_config
    >>> loaded = load_config("bundled:meta-llama/Meta-Llama-3-8B")
    >>> loaded.source, loaded.config["num_key_value_heads"]
    ('bundled', 8)
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from keras_mha.cards import bundled
from keras_mha.cards.errors import (
    CardError,
    ConfigFileNotFoundError,
    GatedRepositoryError,
    HubUnreachableError,
    MalformedConfigError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

CONFIG_FILENAME = "config.json"
BUNDLED_PREFIX = "bundled:"
DEFAULT_TIMEOUT_SECONDS = 10.0

_TRUE_STRINGS = {"1", "on", "yes", "true"}


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
        source: a Hub model id (`"org/name"`), a local directory or JSON file path, or
            `"bundled:org/name"` to read the bundled snapshot without touching the network.
        revision: branch, tag or commit on the Hub (default `"main"`).
        token: Hub token; None lets `huggingface_hub` use `HF_TOKEN` or the stored login.
        endpoint: Hub endpoint; None uses `HF_ENDPOINT` (default `https://huggingface.co`).
        offline: never touch the network: read the HF cache, then the bundled card.
            None follows `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`).
        timeout: seconds to wait for the Hub to answer the metadata request. The
            `HF_HUB_ETAG_TIMEOUT` environment variable, when set, wins (as in
            `huggingface_hub`); the download itself uses `HF_HUB_DOWNLOAD_TIMEOUT`.
        cache_dir: HF cache directory; None uses `HF_HUB_CACHE` / `HF_HOME`.

    Returns:
        A `LoadedConfig`.

    Raises:
        RepositoryNotFoundError, GatedRepositoryError, RevisionNotFoundError,
        ConfigFileNotFoundError, MalformedConfigError, HubUnreachableError (all
        `keras_mha.errors.CardError`).

    Example:
        >>> load_config("bundled:openai-community/gpt2").config["n_head"]
        12
    """
    if not isinstance(source, str) or not source.strip():
        raise ConfigFileNotFoundError(
            f"model source {source!r} is empty; pass a Hub model id (org/name), "
            "a local directory or config.json path, or bundled:org/name"
        )
    source = source.strip()
    if source.startswith(BUNDLED_PREFIX):
        model_id = source[len(BUNDLED_PREFIX) :].strip()
        note = None
        if revision is not None:
            note = f"revision {revision!r} ignored: a bundled card is one fixed snapshot"
        loaded = _load_bundled(model_id, note=note)
        if loaded is None:
            raise RepositoryNotFoundError(_unknown_bundled_message(model_id))
        return loaded

    local_path = Path(source).expanduser()
    if local_path.exists():
        return _load_local(source, local_path, revision)
    if _looks_like_path(source):
        raise ConfigFileNotFoundError(
            f"{source}: no such file or directory; pass a Hub model id (org/name), "
            "an existing directory holding config.json or a config.json path, or bundled:org/name"
        )
    return _load_from_hub(
        source,
        revision=revision,
        token=token,
        endpoint=endpoint,
        offline=_offline_requested() if offline is None else offline,
        timeout=_metadata_timeout(timeout),
        cache_dir=cache_dir,
    )


def read_config_file(path: Path, *, described_as: str) -> dict:
    """Parse a `config.json`, turning every way it can be unreadable into a `CardError`.

    Args:
        path: the file.
        described_as: how the message names the file's origin (model id, revision, path).

    Example:
        >>> from keras_mha.cards.bundled import bundled_config_path
        >>> path = bundled_config_path("openai-community/gpt2")
        >>> read_config_file(path, described_as="gpt2")["model_type"]
        'gpt2'
    """
    try:
        with open(path, encoding="utf-8") as config_file:
            config = json.load(config_file)
    except FileNotFoundError as error:
        raise ConfigFileNotFoundError(f"{described_as}: {path} does not exist") from error
    except IsADirectoryError as error:
        raise ConfigFileNotFoundError(
            f"{described_as}: {path} is a directory, not a file"
        ) from error
    except json.JSONDecodeError as error:
        raise MalformedConfigError(
            f"{described_as}: {path} is not valid JSON: {error.msg} at line {error.lineno} "
            f"column {error.colno}; fix the file or use another revision"
        ) from error
    except UnicodeDecodeError as error:
        raise MalformedConfigError(
            f"{described_as}: {path} is not UTF-8 text (byte {error.start}: {error.reason}); "
            "a config.json must be UTF-8 JSON"
        ) from error
    except OSError as error:
        raise ConfigFileNotFoundError(
            f"{described_as}: cannot read {path}: {error.strerror or error}"
        ) from error
    if not isinstance(config, dict):
        raise MalformedConfigError(
            f"{described_as}: {path} holds a JSON {type(config).__name__}, expected a JSON object "
            "({...}) with the model's configuration"
        )
    return config


def _load_local(source: str, local_path: Path, revision: str | None) -> LoadedConfig:
    if local_path.is_dir():
        config_path = local_path / CONFIG_FILENAME
        if not config_path.is_file():
            raise ConfigFileNotFoundError(
                f"{source}: no {CONFIG_FILENAME} in this directory; point at the directory "
                "that holds the model's config.json, or at the JSON file itself"
            )
    else:
        config_path = local_path
    config = read_config_file(config_path, described_as=source)
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
    import difflib

    available = bundled.list_bundled()
    close = difflib.get_close_matches(model_id, available, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else "run `keras-mha cards` to list them"
    return f"bundled:{model_id}: no bundled card with this id ({len(available)} bundled); {hint}"


def _looks_like_path(source: str) -> bool:
    """True for strings that cannot be a Hub repo id, so a missing path is reported as such."""
    return (
        source.startswith(("/", "./", "../", "~", "\\"))
        or source.endswith(".json")
        or source.count("/") > 1
        or "\\" in source
        or source in (".", "..")
    )


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE_STRINGS


def _offline_requested() -> bool:
    # Read the environment at call time: huggingface_hub reads HF_HUB_OFFLINE once, at import.
    return _env_flag("HF_HUB_OFFLINE") or _env_flag("TRANSFORMERS_OFFLINE")


def _metadata_timeout(timeout: float) -> float:
    """`HF_HUB_ETAG_TIMEOUT` wins over the argument, as it does inside huggingface_hub."""
    from_environment = os.environ.get("HF_HUB_ETAG_TIMEOUT", "").strip()
    if from_environment:
        try:
            return float(from_environment)
        except ValueError:
            pass
    if timeout is None or timeout <= 0:
        raise ValueError(f"timeout={timeout!r} must be a positive number of seconds")
    return float(timeout)


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
    try:
        import huggingface_hub
    except ImportError as error:
        return _fall_back_to_bundled(
            repo_id,
            revision,
            reason=f"huggingface_hub is not installed ({error}), so the Hub cannot be read",
        )
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    requested_revision = revision or "main"
    described_as = f"{repo_id}@{requested_revision}"
    download_arguments = dict(
        repo_id=repo_id,
        filename=CONFIG_FILENAME,
        revision=revision,
        token=token,
        endpoint=endpoint,
        cache_dir=cache_dir,
    )
    try:
        if offline:
            # local_files_only: the cache answers or LocalEntryNotFoundError; no request is made.
            try:
                config_path = huggingface_hub.hf_hub_download(
                    **download_arguments, local_files_only=True
                )
            except LocalEntryNotFoundError:
                return _fall_back_to_bundled(
                    repo_id,
                    revision,
                    reason="offline mode is on and config.json is not in the HF cache",
                )
        else:
            cached = huggingface_hub.try_to_load_from_cache(
                repo_id, CONFIG_FILENAME, cache_dir=cache_dir, revision=revision
            )
            if not isinstance(cached, str):
                # Nothing cached: hf_hub_download would retry a failed metadata request for
                # up to a minute. One request, bounded by `timeout`, fails fast instead.
                network_problem = _probe_hub(
                    huggingface_hub, repo_id, revision, token, endpoint, timeout
                )
                if network_problem is not None:
                    return _fall_back_to_bundled(repo_id, revision, reason=network_problem)
            # With a cached copy, a failed metadata request falls back to that copy, no retry.
            config_path = huggingface_hub.hf_hub_download(
                **download_arguments, etag_timeout=timeout
            )
    except CardError:
        raise
    except HFValidationError as error:
        raise RepositoryNotFoundError(
            f"{repo_id}: not a valid Hub model id and not an existing local path "
            f"({_first_line(error)}); "
            "pass org/name, a directory holding config.json, or bundled:org/name"
        ) from None
    except Exception as error:  # noqa: BLE001 - every huggingface_hub error is translated below
        translated = _translate_hub_error(error, repo_id, revision, token)
        if translated is None:
            raise
        if isinstance(translated, str):
            return _fall_back_to_bundled(repo_id, revision, reason=translated)
        raise translated from None

    config_path = Path(config_path)
    config = read_config_file(config_path, described_as=f"{described_as} ({CONFIG_FILENAME})")
    commit = config_path.parent.name if config_path.parent.parent.name == "snapshots" else None
    return LoadedConfig(config, "hub", repo_id, config_path, requested_revision, None, commit)


def _probe_hub(huggingface_hub, repo_id, revision, token, endpoint, timeout) -> str | None:
    """One metadata request for config.json. Returns why the Hub is unreachable, or None
    when it answered; raises Hub errors (repository / revision / file not found, gated)."""
    url = huggingface_hub.hf_hub_url(repo_id, CONFIG_FILENAME, revision=revision, endpoint=endpoint)
    try:
        huggingface_hub.get_hf_file_metadata(url, token=token, timeout=timeout, endpoint=endpoint)
    except Exception as error:  # noqa: BLE001 - translated, or re-raised when unknown
        translated = _translate_hub_error(error, repo_id, revision, token)
        if isinstance(translated, str):
            return translated
        if translated is None:
            raise
        raise translated from None
    return None


def _translate_hub_error(error: Exception, repo_id: str, revision: str | None, token):
    """Map a huggingface_hub / HTTP-client error to a CardError, or to a string saying why
    the Hub is unreachable (the caller then tries the bundled card), or None if unknown."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
    )
    from huggingface_hub.errors import RepositoryNotFoundError as HfRepositoryNotFoundError
    from huggingface_hub.errors import RevisionNotFoundError as HfRevisionNotFoundError

    shown_revision = revision or "main"
    token_hint = (
        "check that the token has access"
        if token
        else "log in with `hf auth login`, set HF_TOKEN or pass --token"
    )
    bundled_hint = ""
    if bundled.bundled_config_path(repo_id) is not None:
        bundled_hint = f" (a bundled snapshot is available: bundled:{repo_id})"

    # GatedRepoError subclasses RepositoryNotFoundError: test it first.
    if isinstance(error, GatedRepoError):
        return GatedRepositoryError(
            f"{repo_id}: gated repository, access needs a token from an account that accepted "
            f"its conditions on the Hub; {token_hint}{bundled_hint}"
        )
    if isinstance(error, HfRepositoryNotFoundError):
        return RepositoryNotFoundError(
            f"{repo_id}: repository not found on the Hub (if it is private, {token_hint}); "
            f"check the model id{bundled_hint}"
        )
    if isinstance(error, HfRevisionNotFoundError):
        return RevisionNotFoundError(
            f"{repo_id}: revision {shown_revision!r} not found; pass an existing branch, tag or "
            "commit hash with --revision"
        )
    if isinstance(error, LocalEntryNotFoundError):
        # Raised when the metadata request failed for a network reason and nothing is cached.
        cause = error.__cause__
        if isinstance(cause, OfflineModeIsEnabled):
            return "offline mode is on and config.json is not in the HF cache"
        if cause is not None:
            return f"the Hub could not be reached ({_describe_network_error(cause)})"
        return "the Hub could not be reached and config.json is not in the HF cache"
    if isinstance(error, EntryNotFoundError):
        return ConfigFileNotFoundError(
            f"{repo_id}@{shown_revision}: the repository has no {CONFIG_FILENAME}; "
            "it may hold a non-transformers model (GGUF, adapters, ...) - point at a repo "
            "or local directory that has one"
        )
    if isinstance(error, OfflineModeIsEnabled):
        return "offline mode is on (HF_HUB_OFFLINE) and config.json is not in the HF cache"
    if isinstance(error, _network_error_types()):
        return f"the Hub could not be reached ({_describe_network_error(error)})"
    if isinstance(error, HfHubHTTPError):
        status = error.response.status_code if error.response is not None else None
        if status in (401, 403):
            return GatedRepositoryError(
                f"{repo_id}: the Hub refused access (HTTP {status}); {token_hint}{bundled_hint}"
            )
        if status is not None and (status >= 500 or status in (408, 429)):
            return f"the Hub answered HTTP {status}"
        return CardError(
            f"{repo_id}@{shown_revision}: the Hub answered HTTP {status} for {CONFIG_FILENAME}: "
            f"{_first_line(error)}"
        )
    return None


def _network_error_types() -> tuple[type[BaseException], ...]:
    """Connection and timeout errors of whichever HTTP client huggingface_hub uses.

    huggingface_hub 2.x raises httpx2's, 1.x httpx's and 0.x requests' own classes;
    only clients already imported (by huggingface_hub) are looked at.
    """
    types: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module_name, class_names in (
        ("httpx2", ("TransportError",)),
        ("httpx", ("TransportError",)),
        ("requests", ("ConnectionError", "Timeout")),
    ):
        module = sys.modules.get(module_name)
        types += [getattr(module, name) for name in class_names if hasattr(module, name)]
    return tuple(types)


def _describe_network_error(error: BaseException) -> str:
    message = _first_line(error)
    name = type(error).__name__
    return f"{name}: {message}" if message else name


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else ""


def _fall_back_to_bundled(repo_id: str, revision: str | None, *, reason: str) -> LoadedConfig:
    """Answer from the bundled card when the Hub cannot, or raise HubUnreachableError."""
    loaded = _load_bundled(repo_id, note=None)
    if loaded is None:
        raise HubUnreachableError(
            f"{repo_id}: {reason}, and keras-mha bundles no card for it; connect to the Hub "
            "(or set HF_ENDPOINT to a mirror) and retry, or pass a local directory holding "
            "config.json"
        )
    if revision is not None and revision not in ("main", loaded.revision):
        raise HubUnreachableError(
            f"{repo_id}: {reason}; the bundled card is revision {loaded.revision!r}, "
            f"not {revision!r}; retry online, or drop --revision to use the bundled card"
        )
    note = f"{reason}; answered from the bundled snapshot"
    if loaded.revision:
        note += f" (revision {loaded.revision})"
    return LoadedConfig(
        loaded.config, "bundled", loaded.model_id, loaded.path, loaded.revision, note
    )


__all__ = ["CONFIG_FILENAME", "LoadedConfig", "load_config", "read_config_file"]
