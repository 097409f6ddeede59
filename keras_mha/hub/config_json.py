"""Read and parse a `config.json` from anywhere, with caps on size and nesting.

A config comes from strangers, so reading it is bounded: at most `MAX_CONFIG_BYTES`
(10 MB; real configs are a few KB) are read, so `/dev/zero` or a 50 GB file cannot
exhaust memory, and JSON nested deeper than `MAX_JSON_DEPTH` (100) levels is refused
(Python's parser would otherwise recurse until `RecursionError`). Every way a file can
be unreadable becomes one `keras_mha.errors` exception with a one-line message:

- missing file: `ConfigFileNotFoundError` (exit 6);
- a directory, a device (`/dev/zero`, a terminal), no permission, a name too long, a
  symlink loop: `PathError` (exit 14). Pipes are read (`inspect <(curl ...)`), capped;
- not UTF-8, not JSON, HTML, not an object, too big or too deep: `MalformedConfigError`
  (exit 7).

Only the standard library is imported.

Example:
    >>> parse_config_bytes(b'{"model_type": "gpt2"}', described_as="gpt2")
    {'model_type': 'gpt2'}
"""

from __future__ import annotations

import errno
import json
import os
import select
import stat
import time
from pathlib import Path

from keras_mha.errors import ConfigFileNotFoundError, MalformedConfigError, PathError
from keras_mha.safe_text import one_line

#: The name of a model's config file in a Hub repository or a checkpoint folder.
CONFIG_FILENAME = "config.json"
MAX_CONFIG_BYTES = 10 * 1000 * 1000
MAX_JSON_DEPTH = 100
# How long a pipe may stay silent before it is given up on.
PIPE_WAIT_SECONDS = 10.0

_FILE_KINDS = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_config_file(path: Path, *, described_as: str) -> dict:
    """Parse the `config.json` at `path` (at most 10 MB, nested at most 100 levels deep).

    Args:
        path: the file (a regular file, or an anonymous pipe such as `<(cat config.json)`;
            a named pipe is refused: opening one waits for a writer).
        described_as: how messages name the file's origin (model id, revision, path).

    Example:
        >>> from keras_mha.hub.bundled import bundled_config_path
        >>> path = bundled_config_path("openai-community/gpt2")
        >>> read_config_file(path, described_as="gpt2")["model_type"]
        'gpt2'
    """
    path = Path(path)
    where = f"{described_as}: {path}" if str(path) != described_as else str(path)
    try:
        status = os.stat(path)
    except OSError as error:
        raise _path_error(error, where) from None
    if stat.S_ISDIR(status.st_mode):
        raise PathError(f"{where} is a directory; expected a config.json file", path=str(path))
    for is_kind, kind in _FILE_KINDS:
        if is_kind(status.st_mode):
            raise PathError(f"{where} is {kind}, not a config.json file", path=str(path))
    if stat.S_ISREG(status.st_mode) and status.st_size > MAX_CONFIG_BYTES:
        raise MalformedConfigError(
            f"{where} is {status.st_size:,} bytes; a config.json is at most "
            f"{MAX_CONFIG_BYTES:,} bytes",
            path=str(path),
        )
    if stat.S_ISFIFO(status.st_mode) and not _is_anonymous_pipe(path):
        # Opening a named pipe waits for a writer, which may never come.
        raise PathError(f"{where} is a named pipe (FIFO), not a config.json file", path=str(path))
    if stat.S_ISFIFO(status.st_mode):
        return parse_config_bytes(_read_pipe(path, where), described_as=where)
    try:
        with open(path, "rb") as config_file:
            data = config_file.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise _path_error(error, where) from None
    return parse_config_bytes(data, described_as=where)


def _is_anonymous_pipe(path: Path) -> bool:
    """A shell's pipe (`<(cat config.json)`, `/dev/stdin` fed by `|`): it has a writer."""
    return "pipe:[" in os.path.realpath(path)


def _read_pipe(path: Path, where: str) -> bytes:
    """An anonymous pipe's bytes, giving up when it stays silent `PIPE_WAIT_SECONDS`."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise _path_error(error, where) from None
    chunks, size, deadline = [], 0, time.monotonic() + PIPE_WAIT_SECONDS
    try:
        while size <= MAX_CONFIG_BYTES:
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([descriptor], [], [], max(remaining, 0))
            if not ready:
                raise PathError(
                    f"{where} is a pipe that sent nothing for {PIPE_WAIT_SECONDS:g} s; expected "
                    "a config.json",
                    path=str(path),
                )
            try:
                chunk = os.read(descriptor, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(descriptor)
    return b"".join(chunks)


def parse_config_bytes(data: bytes, *, described_as: str) -> dict:
    """Parse `data` as a config: UTF-8 JSON object, at most 10 MB and 100 levels deep.

    Example:
        >>> parse_config_bytes(b'{"n_head": 12}', described_as="x")
        {'n_head': 12}
    """
    if len(data) > MAX_CONFIG_BYTES:
        raise MalformedConfigError(
            f"{described_as} is over {MAX_CONFIG_BYTES:,} bytes; a config.json is a few KB"
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise MalformedConfigError(
            f"{described_as} is not UTF-8 text (byte {error.start}: {error.reason}); "
            "a config.json must be UTF-8 JSON"
        ) from None
    if text.lstrip()[:1] == "<":
        raise MalformedConfigError(
            f"{described_as} is an HTML or XML page, not JSON; point at the model's config.json"
        )
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise MalformedConfigError(
            f"{described_as} is not valid JSON: {error.msg} at line {error.lineno} "
            f"column {error.colno}; fix the file or use another revision"
        ) from None
    except RecursionError:
        raise MalformedConfigError(
            f"{described_as} is nested too deeply to parse; a config.json is nested at most "
            f"{MAX_JSON_DEPTH} levels"
        ) from None
    except ValueError as error:  # e.g. an integer with more than 4300 digits
        raise MalformedConfigError(
            f"{described_as} is not valid JSON: {one_line(str(error))[:200]}"
        ) from None
    if not isinstance(config, dict):
        raise MalformedConfigError(
            f"{described_as} holds a JSON {type(config).__name__}, expected a JSON object "
            "({...}) with the model's configuration"
        )
    depth = json_depth(config)
    if depth > MAX_JSON_DEPTH:
        raise MalformedConfigError(
            f"{described_as} is nested {depth} levels deep; a config.json is nested at most "
            f"{MAX_JSON_DEPTH} levels"
        )
    return config


def json_depth(value) -> int:
    """How many containers deep `value` nests (a scalar is 0, `{}` is 1), without recursion.

    Example:
        >>> json_depth({"a": [1, {"b": 2}]})
        3
    """
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _path_error(error: OSError, where: str) -> Exception:
    if error.errno in (errno.ENOENT, errno.ENOTDIR):
        return ConfigFileNotFoundError(f"{where} does not exist", path=error.filename)
    reason = {
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.ENAMETOOLONG: "the name is too long",
        errno.ELOOP: "too many levels of symbolic links",
        errno.EISDIR: "is a directory; expected a config.json file",
    }.get(error.errno, error.strerror or type(error).__name__)
    return PathError(f"{where}: cannot read: {reason}", path=error.filename)


__all__ = [
    "CONFIG_FILENAME",
    "MAX_CONFIG_BYTES",
    "MAX_JSON_DEPTH",
    "json_depth",
    "parse_config_bytes",
    "read_config_file",
]
