"""The exact bytes of a checkpoint's tensors, read without downloading the weights: the
`metadata.total_size` of `model.safetensors.index.json` (sharded checkpoints), or the
size of `model.safetensors` less its header (read from its first 8 bytes; on the Hub with
one `Range` request). The planner shows it beside its computed weights.

Anything that goes wrong here (no safetensors, a server that ignores `Range`, offline
without a cached index) gives None and a reason: the exact figure is a bonus, never a
reason for `inspect` to fail.

Example:
    >>> checkpoint_size_of_folder(Path("/nonexistent")) is None
    True
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from keras_mha.errors import KerasMHAError
from keras_mha.hub import settings
from keras_mha.version import __version__

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# A safetensors header is JSON of the tensor names and offsets: megabytes at most.
MAX_HEADER_BYTES = 100 * 1000 * 1000
MAX_INDEX_BYTES = 10 * 1000 * 1000


@dataclass(frozen=True)
class CheckpointSize:
    """Tensor bytes of a checkpoint and where the figure was read.

    Example:
        >>> CheckpointSize(10, "model.safetensors header").as_dict()["bytes"]
        10
    """

    bytes: int
    source: str

    def as_dict(self) -> dict:
        return {"bytes": self.bytes, "source": self.source}


def _index_total(data: bytes) -> int | None:
    """`metadata.total_size` of an index, or None when it holds none that is valid."""
    if len(data) > MAX_INDEX_BYTES:
        return None
    try:
        index = json.loads(data)
    except (ValueError, RecursionError):
        return None
    metadata = index.get("metadata") if isinstance(index, dict) else None
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
        return None
    return total


def _tensor_bytes(file_size: int, prefix: bytes) -> int | None:
    """A safetensors file's tensor bytes from its size and its first 8 bytes."""
    if len(prefix) < 8:
        return None
    (header,) = struct.unpack("<Q", prefix[:8])
    if header > MAX_HEADER_BYTES or 8 + header > file_size:
        return None
    return file_size - 8 - header


def checkpoint_size_of_folder(folder: Path) -> CheckpointSize | None:
    """The tensor bytes of the safetensors checkpoint in `folder`, or None.

    Example:
        >>> checkpoint_size_of_folder(Path(".")) is None
        True
    """
    try:
        index = folder / INDEX_FILE
        if index.is_file():
            with open(index, "rb") as handle:
                total = _index_total(handle.read(MAX_INDEX_BYTES + 1))
            return None if total is None else CheckpointSize(total, f"{INDEX_FILE} total_size")
        single = folder / SINGLE_FILE
        if single.is_file():
            with open(single, "rb") as handle:
                size = _tensor_bytes(os.fstat(handle.fileno()).st_size, handle.read(8))
            return None if size is None else CheckpointSize(size, f"{SINGLE_FILE} header")
    except OSError:
        return None
    return None


def checkpoint_size_on_hub(
    repo_id: str,
    *,
    revision: str | None,
    token=None,
    endpoint: str | None = None,
    offline: bool | None = None,
    timeout: float | None = None,
) -> CheckpointSize | None:
    """The tensor bytes of a Hub checkpoint: its index's `total_size` (the index is fetched
    into the HF cache, a few KB), else `model.safetensors`' size less its header (8 bytes
    fetched with `Range`). None when neither can be read.

    Example:
        >>> checkpoint_size_on_hub("org/name", revision="main", offline=True) is None
        True
    """
    from keras_mha.hub.files import hub_file

    hub = dict(revision=revision, token=token, endpoint=endpoint, offline=offline)
    if timeout is not None:
        hub["timeout"] = timeout
    try:
        index = hub_file(repo_id, INDEX_FILE, **hub)
        if index is not None:
            with open(index, "rb") as handle:
                total = _index_total(handle.read(MAX_INDEX_BYTES + 1))
            return None if total is None else CheckpointSize(total, f"{INDEX_FILE} total_size")
        if offline:
            return None
        return _single_file_on_hub(repo_id, **hub)
    except (KerasMHAError, OSError):
        return None


def _single_file_on_hub(repo_id, *, revision, token, endpoint, offline, timeout=10.0):
    import huggingface_hub
    from huggingface_hub import constants

    from keras_mha.hub.fetch import fetch
    from keras_mha.hub.inputs import validate_endpoint

    del offline
    endpoint = validate_endpoint(endpoint if endpoint is not None else constants.ENDPOINT)
    token_to_send, _ = settings.resolve_token(huggingface_hub, token)
    url = huggingface_hub.hf_hub_url(
        repo_id, SINGLE_FILE, revision=revision or "main", endpoint=endpoint
    )
    headers = huggingface_hub.utils.build_hf_headers(
        token=token_to_send or False, library_name="keras-mha", library_version=__version__
    )
    headers.update({"Accept-Encoding": "identity", "Range": "bytes=0-7"})
    answer = fetch(
        url,
        headers=headers,
        timeout=settings.deadline_seconds(timeout),
        described_as=f"{repo_id} ({SINGLE_FILE})",
        secrets=(token_to_send,) if token_to_send else (),
        max_bytes=64,
    )
    content_range = answer.headers.get("content-range", "")
    if answer.status != 206 or "/" not in content_range:
        return None
    total = content_range.rsplit("/", 1)[1].strip()
    if not total.isdigit():
        return None
    size = _tensor_bytes(int(total), answer.body)
    return None if size is None else CheckpointSize(size, f"{SINGLE_FILE} header")


def checkpoint_size(
    loaded, *, token=None, endpoint=None, offline=None, timeout=None
) -> CheckpointSize | None:
    """The tensor bytes of the checkpoint a `LoadedConfig` came from: its local folder's
    safetensors, or its Hub repository's (at the commit the config came from); None for a
    bundled card, which ships no weights.

    Example:
        >>> from keras_mha.hub.config import load_config
        >>> checkpoint_size(load_config("bundled:openai-community/gpt2")) is None
        True
    """
    if loaded.source == "local":
        path = Path(loaded.path)
        return checkpoint_size_of_folder(path.parent if path.is_file() else path)
    if loaded.source == "hub":
        return checkpoint_size_on_hub(
            loaded.model_id,
            revision=loaded.commit or loaded.revision,
            token=token,
            endpoint=endpoint,
            offline=offline,
            timeout=timeout,
        )
    return None


__all__ = [
    "CheckpointSize",
    "checkpoint_size",
    "checkpoint_size_of_folder",
    "checkpoint_size_on_hub",
]
