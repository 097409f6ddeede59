"""Write a fetched `config.json` into the HF cache, in huggingface_hub's own layout.

    <cache>/models--ORG--NAME/blobs/<etag>                       the bytes
    <cache>/models--ORG--NAME/snapshots/<commit>/config.json     -> ../../blobs/<etag>
    <cache>/models--ORG--NAME/refs/<revision>                    the commit hash

so that `huggingface_hub.try_to_load_from_cache`, `hf_hub_download` (offline or not)
and transformers find it exactly as if huggingface_hub had downloaded it. Unlike
`hf_hub_download`, every name that comes from the server is checked first: the ETag
must be a 40- or 64-hex hash, the commit a 40-hex hash, the revision a valid ref
(`inputs.validate_revision`), and every path is checked to lie inside the repo's
cache folder before anything is written. Writes are atomic (a temporary file in the
same folder, then `os.replace`), so a crash or a full disk never leaves a half file.

Example:
    >>> normalize_etag('W/"0123456789abcdef0123456789abcdef01234567"')
    '0123456789abcdef0123456789abcdef01234567'
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from keras_mha.errors import HubResponseError, PathError
from keras_mha.hub.config_json import CONFIG_FILENAME
from keras_mha.hub.inputs import COMMIT_HASH, revision_problem
from keras_mha.safe_text import one_line

_ETAG = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
# A top-level file of a repository (what keras-mha downloads); never a path.
_FILENAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")


def normalize_etag(etag: str | None) -> str | None:
    """The ETag without `W/` and quotes, lower-cased; None when absent.

    Example:
        >>> normalize_etag('"ABC"')
        'abc'
    """
    if etag is None:
        return None
    value = etag.strip()
    if value.startswith("W/"):
        value = value[2:]
    return value.strip('"').lower()


def checked_etag(etag: str | None, *, described_as: str) -> str:
    """`etag` normalised when it is a plain 40- or 64-hex hash; else HubResponseError."""
    value = normalize_etag(etag)
    if value is None or not _ETAG.fullmatch(value):
        shown = "none" if etag is None else one_line(repr(etag[:80]))
        raise HubResponseError(
            f"{described_as}: the endpoint sent ETag {shown}; expected a 40- or 64-character "
            "hex hash (refused: it would name a file in the HF cache)"
        )
    return value


def checked_commit(commit: str | None, *, described_as: str, revision: str | None) -> str:
    """`commit` when it is a 40-hex hash (and the one asked for, if a hash was asked for)."""
    if commit is None or not COMMIT_HASH.fullmatch(commit):
        shown = "none" if commit is None else one_line(repr(commit[:80]))
        raise HubResponseError(
            f"{described_as}: the endpoint sent X-Repo-Commit {shown}; expected a "
            "40-character hex commit hash"
        )
    if revision is not None and COMMIT_HASH.fullmatch(revision) and commit != revision:
        raise HubResponseError(
            f"{described_as}: asked for commit {revision}, the endpoint answered commit {commit}"
        )
    return commit


def repo_folder(cache_dir: str | os.PathLike, repo_id: str) -> Path:
    """`<cache>/models--ORG--NAME`, as huggingface_hub names it.

    Example:
        >>> repo_folder("/cache", "org/name").as_posix()
        '/cache/models--org--name'
    """
    return Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))


def store_config(
    cache_dir: str | os.PathLike,
    repo_id: str,
    *,
    revision: str,
    commit: str,
    etag: str,
    data: bytes,
) -> Path:
    """Write `data` as `config.json` of `commit` (and `revision` -> `commit`); returns the
    snapshot path. `commit` and `etag` must already be checked (`checked_commit`,
    `checked_etag`); they and `revision` are checked again here, as is every path.

    Raises:
        PathError: the cache cannot be written (permission, full disk, read-only).
    """
    folder = repo_folder(cache_dir, repo_id)
    if not COMMIT_HASH.fullmatch(commit) or not _ETAG.fullmatch(etag):
        raise ValueError(f"unchecked commit {commit!r} or etag {etag!r}")
    if revision_problem(revision) is not None:
        raise ValueError(f"unchecked revision {revision!r}")
    blob = folder / "blobs" / etag
    pointer = folder / "snapshots" / commit / CONFIG_FILENAME
    reference = folder / "refs" / revision
    for path in (blob, pointer, reference):
        _require_inside(folder, path)
    try:
        if not _holds(pointer, data):
            _atomic_write(blob, data)
            _atomic_link_or_copy(blob, pointer)
        if revision != commit and not _holds(reference, commit.encode()):
            _atomic_write(reference, commit.encode())
    except OSError as error:
        raise _cache_write_error(error, CONFIG_FILENAME, repo_id, folder) from None
    return pointer


def check_filename(filename: str) -> str:
    """`filename` when it is a plain top-level file name (no '/', no '..'); else ValueError.

    Example:
        >>> check_filename("model-00001-of-00002.safetensors")
        'model-00001-of-00002.safetensors'
    """
    if not isinstance(filename, str) or not _FILENAME.fullmatch(filename) or ".." in filename:
        raise ValueError(f"not a plain file name: {one_line(repr(filename))[:120]}")
    return filename


def blob_temporary(cache_dir: str | os.PathLike, repo_id: str):
    """`(open binary file, its path)`: a private temporary file in the repo's blobs folder,
    where a streamed download goes before `store_file` moves it into place.

    Raises:
        PathError: the cache cannot be written.
    """
    blobs = repo_folder(cache_dir, repo_id) / "blobs"
    _require_inside(repo_folder(cache_dir, repo_id), blobs)
    try:
        blobs.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=blobs, prefix=".", suffix=".incomplete")
    except OSError as error:
        raise PathError(
            f"cannot write into the HF cache {blobs}: {error.strerror or error}; free space, "
            "fix its permissions or set HF_HUB_CACHE",
            path=str(blobs),
        ) from None
    return os.fdopen(descriptor, "wb"), Path(temporary)


def store_file(
    cache_dir: str | os.PathLike,
    repo_id: str,
    *,
    revision: str,
    commit: str,
    etag: str,
    filename: str,
    temporary: Path,
) -> Path:
    """Move the complete, verified download `temporary` (from `blob_temporary`) to
    `blobs/<etag>`, point `snapshots/<commit>/<filename>` at it and `refs/<revision>` at
    `commit`; returns the snapshot path. Every name is checked again here.

    Raises:
        PathError: the cache cannot be written.
    """
    folder = repo_folder(cache_dir, repo_id)
    if not COMMIT_HASH.fullmatch(commit) or not _ETAG.fullmatch(etag):
        raise ValueError(f"unchecked commit {commit!r} or etag {etag!r}")
    if revision_problem(revision) is not None:
        raise ValueError(f"unchecked revision {revision!r}")
    check_filename(filename)
    blob = folder / "blobs" / etag
    pointer = folder / "snapshots" / commit / filename
    reference = folder / "refs" / revision
    for path in (blob, pointer, reference, temporary):
        _require_inside(folder, path)
    try:
        os.chmod(temporary, 0o644)
        os.replace(temporary, blob)
        _atomic_link_or_copy(blob, pointer)
        if revision != commit and not _holds(reference, commit.encode()):
            _atomic_write(reference, commit.encode())
    except OSError as error:
        raise _cache_write_error(error, filename, repo_id, folder) from None
    return pointer


def _require_inside(folder: Path, path: Path) -> None:
    root = os.path.abspath(folder)
    target = os.path.abspath(path)
    if os.path.commonpath([root, target]) != root or target == root:
        raise ValueError(f"{target} is outside {root}")


def _holds(path: Path, data: bytes) -> bool:
    try:
        with open(path, "rb") as existing:
            return existing.read(len(data) + 1) == data
    except OSError:
        return False


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".incomplete")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        _remove_quietly(temporary)
        raise


def _atomic_link_or_copy(blob: Path, pointer: Path) -> None:
    """A relative symlink snapshot -> blob (as huggingface_hub makes), or a copy of the
    blob (in chunks) where symlinks are not supported; either appears atomically."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    temporary = pointer.parent / f".{pointer.name}.{os.getpid()}.link"
    _remove_quietly(temporary)
    try:
        os.symlink(os.path.relpath(blob, pointer.parent), temporary)
    except (OSError, NotImplementedError):
        import shutil

        shutil.copyfile(blob, temporary)
    try:
        os.replace(temporary, pointer)
    except BaseException:
        _remove_quietly(temporary)
        raise


def _remove_quietly(path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


__all__ = [
    "blob_temporary",
    "check_filename",
    "checked_commit",
    "checked_etag",
    "normalize_etag",
    "repo_folder",
    "store_config",
    "store_file",
]


def _cache_write_error(error: OSError, filename: str, repo_id: str, folder: Path) -> PathError:
    """The one-line error for a file that could not be written into the HF cache."""
    return PathError(
        f"cannot write {filename} of {repo_id} into the HF cache {folder.parent}: "
        f"{error.strerror or error}; free space, fix its permissions or set HF_HUB_CACHE",
        path=str(error.filename or folder),
    )
