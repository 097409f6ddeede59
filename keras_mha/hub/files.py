"""Download one file of a Hub repository (weights, index, tokenizer) into the HF cache, safely.

`huggingface_hub.hf_hub_download` names the cached blob after the server's `ETag` and
the ref file after the revision, so a hostile endpoint could make it write outside the
cache. `hub_file` downloads through the same hardened path as `config.json`
(`keras_mha.hub.config`), with the same settings (`settings`) and answers (`responses`):

- the revision, token, endpoint and file name are checked before any request
  (`inputs`, `cache.check_filename`);
- one GET through huggingface_hub's HTTP session (`fetch.fetch`: checked redirects,
  the `Authorization` header only for the endpoint's origin, a deadline);
- the `X-Repo-Commit` (40 hex) and `ETag` (40 or 64 hex) are checked from the headers,
  before a byte of the body is written;
- the body streams in chunks into a private temporary file in the repo's `blobs/`
  folder, capped at the length the server declared (which must match `X-Linked-Size`
  when sent), and is refused unless complete; a 64-hex ETag (an LFS file's sha256) is
  checked against the bytes;
- only then is it moved to `blobs/<etag>`, linked from `snapshots/<commit>/<filename>`
  and `refs/<revision>` written, the layout huggingface_hub itself writes, so offline
  runs, `try_to_load_from_cache` and transformers find it.

Offline (`HF_HUB_OFFLINE`), only the cache answers. A file already cached under a
commit hash is never downloaded again (a commit's files never change).

Example:
    >>> from keras_mha.hub.files import hub_file
    >>> hub_file("org/name", "model.safetensors", revision="main")  # doctest: +SKIP
    PosixPath('.../models--org--name/snapshots/<commit>/model.safetensors')
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from keras_mha.errors import HubResponseError, HubUnreachableError
from keras_mha.hub import cache as hub_cache
from keras_mha.hub import settings
from keras_mha.hub.inputs import (
    COMMIT_HASH,
    validate_endpoint,
    validate_revision,
    validate_token,
)
from keras_mha.hub.responses import error_for_status
from keras_mha.safe_text import one_line
from keras_mha.version import __version__

#: The slowest average rate a streamed download may have before it counts as stalled:
#: a file of N bytes gets `timeout + N * SECONDS_PER_BYTE` seconds in all.
MIN_BYTES_PER_SECOND = 64 * 1024
_SHA256_LENGTH = 64


class _HashingSink:
    """Writes chunks to a file, counting them and hashing them with sha256 when asked."""

    def __init__(self, handle, hashed: bool):
        self.handle = handle
        self.digest = hashlib.sha256() if hashed else None
        self.written = 0

    def write(self, chunk: bytes) -> None:
        self.handle.write(chunk)
        self.written += len(chunk)
        if self.digest is not None:
            self.digest.update(chunk)


def hub_file(
    repo_id: str,
    filename: str,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    endpoint: str | None = None,
    offline: bool | None = None,
    timeout: float | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> Path | None:
    """The cached path of `filename` in `repo_id` at `revision`, downloading it if needed.

    Args:
        repo_id: a Hub model id (`org/name`).
        filename: a top-level file of the repository (no folders).
        revision: branch, tag, `refs/pr/N` or commit (default "main").
        token: as `keras_mha.hub.config.load_config` (None: `HF_TOKEN` / stored login).
        endpoint, offline, cache_dir: as `load_config` (None: the environment).
        timeout: seconds for the answer's headers and for any silence while the body
            arrives; the body as a whole gets `timeout + size / MIN_BYTES_PER_SECOND`.
            None: `load_config`'s default (or `HF_HUB_ETAG_TIMEOUT`).

    Returns:
        The path under `snapshots/<commit>/`, or None when the repository has no such
        file (HTTP 404), or offline with the file not cached.

    Raises:
        InvalidRevisionError, InvalidTokenError, UsageError: bad input, before any request.
        HubResponseError: the endpoint answered something refused (a bad ETag or commit,
            a redirect loop, a short or oversized body, a sha256 mismatch).
        HubUnreachableError: the Hub could not be reached and the file is not cached.
        RepositoryNotFoundError, GatedRepositoryError, ...: as `load_config`.
        PathError: the cache cannot be written.
    """
    settings.check_hub_environment()
    import huggingface_hub
    from huggingface_hub import constants

    requested_revision = validate_revision(revision if revision is not None else "main")
    if token is not None and not isinstance(token, bool):
        validate_token(token)
    try:
        hub_cache.check_filename(filename)
    except ValueError as error:
        raise HubResponseError(f"{repo_id}: refused to download {error}") from None
    described_as = f"{repo_id}@{requested_revision} ({filename})"
    cache_dir = os.fspath(cache_dir if cache_dir is not None else constants.HF_HUB_CACHE)
    offline = settings.offline_requested() if offline is None else offline
    cached = huggingface_hub.try_to_load_from_cache(
        repo_id, filename, cache_dir=cache_dir, revision=requested_revision
    )
    cached_path = Path(cached) if isinstance(cached, str) else None
    if offline or (cached_path is not None and COMMIT_HASH.fullmatch(requested_revision)):
        return cached_path

    endpoint = validate_endpoint(
        endpoint if endpoint is not None else constants.ENDPOINT,
        argument="--endpoint" if endpoint is not None else "HF_ENDPOINT",
    )
    timeout = settings.deadline_seconds(
        settings.DEFAULT_TIMEOUT_SECONDS if timeout is None else timeout
    )
    token_to_send, token_name = settings.resolve_token(huggingface_hub, token)
    secrets = (token_to_send,) if token_to_send else ()
    try:
        return _download(
            repo_id,
            filename,
            requested_revision=requested_revision,
            revision=revision,
            endpoint=endpoint,
            token=(token_to_send, token_name),
            timeout=timeout,
            cache_dir=cache_dir,
            described_as=described_as,
        )
    except HubUnreachableError as reason:  # the bare reason, from _download
        if cached_path is not None:
            return cached_path
        raise HubUnreachableError(
            f"{described_as}: {one_line(str(reason), secrets)}, and the file is not in the HF "
            "cache; connect to the Hub (or set HF_ENDPOINT to a mirror) and retry",
            model_id=repo_id,
            revision=requested_revision,
        ) from None


class _AlreadyCached(Exception):  # noqa: N818 - a signal, not an error
    """The answer's commit and ETag are the cached file's: stop before the body."""

    def __init__(self, path: Path):
        super().__init__(str(path))
        self.path = path


def _download(
    repo_id,
    filename,
    *,
    requested_revision,
    revision,
    endpoint,
    token,
    timeout,
    cache_dir,
    described_as,
) -> Path | None:
    import huggingface_hub

    from keras_mha.hub.fetch import fetch

    token_to_send, token_name = token
    secrets = (token_to_send,) if token_to_send else ()
    url = huggingface_hub.hf_hub_url(
        repo_id, filename, revision=requested_revision, endpoint=endpoint
    )
    headers = huggingface_hub.utils.build_hf_headers(
        token=token_to_send or False, library_name="keras-mha", library_version=__version__
    )
    headers["Accept-Encoding"] = "identity"
    checked: dict = {}
    lock = threading.Lock()

    def open_sink(answer):
        # Every name the server chose is checked before a byte is written.
        checked["commit"] = hub_cache.checked_commit(
            answer.commit, described_as=described_as, revision=revision
        )
        checked["etag"] = hub_cache.checked_etag(answer.etag, described_as=described_as)
        folder = hub_cache.repo_folder(cache_dir, repo_id)
        pointer = folder / "snapshots" / checked["commit"] / filename
        if (folder / "blobs" / checked["etag"]).is_file() and pointer.is_file():
            raise _AlreadyCached(pointer)  # a branch re-checked: the same bytes, not refetched
        declared = answer.headers.get("content-length")
        if answer.linked_size is not None and answer.linked_size.strip() != declared:
            raise HubResponseError(
                f"{described_as}: the endpoint announced X-Linked-Size "
                f"{one_line(answer.linked_size)[:40]!r} but sends Content-Length "
                f"{one_line(str(declared))[:40]!r}"
            )
        with lock:  # the waiting thread may have given up: then leave no temporary file
            if checked.get("abandoned"):
                raise HubUnreachableError("the deadline passed")
            handle, checked["temporary"] = hub_cache.blob_temporary(cache_dir, repo_id)
            checked["sink"] = _HashingSink(handle, len(checked["etag"]) == _SHA256_LENGTH)
        return checked["sink"]

    try:
        try:
            answer = fetch(
                url,
                headers=headers,
                timeout=timeout,
                described_as=described_as,
                secrets=secrets,
                max_bytes=None,
                open_sink=open_sink,
                seconds_per_byte=1.0 / MIN_BYTES_PER_SECOND,
            )
        except HubUnreachableError as reason:
            raise HubUnreachableError(f"the Hub could not be reached ({reason})") from None
        except _AlreadyCached as cached:
            return cached.path
        finally:
            with lock:
                checked["abandoned"] = True
                if "sink" in checked:
                    checked["sink"].handle.close()
        if answer.status == 404 and answer.headers.get("x-error-code") in (None, "EntryNotFound"):
            return None  # the repository has no such file
        if not 200 <= answer.status < 300:
            problem = error_for_status(answer, repo_id, revision, token_name, token_to_send)
            raise HubUnreachableError(problem)
        sink = checked["sink"]
        if sink.digest is not None and sink.digest.hexdigest() != checked["etag"]:
            raise HubResponseError(
                f"{described_as}: the bytes received have sha256 {sink.digest.hexdigest()}, "
                f"not the {checked['etag']} the endpoint announced (ETag); download refused"
            )
        path = hub_cache.store_file(
            cache_dir,
            repo_id,
            revision=requested_revision,
            commit=checked["commit"],
            etag=checked["etag"],
            filename=filename,
            temporary=checked["temporary"],
        )
        checked.pop("temporary")
        return path
    finally:
        if "temporary" in checked:
            hub_cache._remove_quietly(checked["temporary"])


__all__ = ["MIN_BYTES_PER_SECOND", "hub_file"]
