"""Files of an exported checkpoint: safetensors shards, their index, and the output folder.

- `write_safetensors(tensors, directory, max_shard_size)`: writes `model.safetensors`, or
  `model-0000i-of-0000n.safetensors` shards plus `model.safetensors.index.json` when the
  tensors exceed `max_shard_size`, with the names and index layout transformers writes.
  Tensors are produced one at a time (`LazyTensor`), so a model is never held twice in
  memory; bfloat16 is written from float32 with round-to-nearest-even (exact for values
  that were bfloat16), since NumPy has no bfloat16 type.
- `check_output_folder` / `output_folder`: refuse an `--out` that is not writable, not
  empty (without `overwrite`) or the source itself, before any work; then write
  everything into a hidden temporary folder beside it and move it into place only once
  complete, so a failure (or Ctrl-C) leaves no half-written checkpoint.

Example:
    >>> with output_folder("pruned", overwrite=False) as staging:  # doctest: +SKIP
    ...     write_safetensors({"w": LazyTensor((2, 2), "F32", lambda: np.ones((2, 2)))},
    ...                       staging, max_shard_size="5GB")
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from keras_mha.errors import ExportError, PathError
from keras_mha.planning.config_values import shown as shown_value

SINGLE_FILE_NAME = "model.safetensors"
INDEX_FILE_NAME = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_SIZE = "5GB"

# safetensors dtype name -> (NumPy dtype of the stored bits, bytes per element).
_DTYPES = {
    "F64": ("<f8", 8),
    "F32": ("<f4", 4),
    "F16": ("<f2", 2),
    "BF16": ("<u2", 2),
    "I64": ("<i8", 8),
    "I32": ("<i4", 4),
    "BOOL": ("|b1", 1),
}
KERAS_TO_SAFETENSORS_DTYPE = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "bool": "BOOL",
}
SAFETENSORS_TO_TORCH_DTYPE = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
}
_UNITS = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def parse_size(size) -> int:
    """Bytes from an int or a string such as `"5GB"`, `"500MB"`, `"2GiB"` (transformers' units).

    Example:
        >>> parse_size("5GB"), parse_size("1MiB"), parse_size(1000)
        (5000000000, 1048576, 1000)
    """
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        value = int(size)
    elif isinstance(size, str):
        text = size.strip().upper()
        unit = next((u for u in sorted(_UNITS, key=len, reverse=True) if text.endswith(u)), None)
        number = text[: -len(unit)] if unit else text
        try:
            value = int(float(number) * (_UNITS[unit] if unit else 1))
        except (ValueError, OverflowError):  # not a number, or inf / nan
            value = -1
    else:
        value = -1
    if value <= 0:
        raise ExportError(
            f"max_shard_size={size!r} is not a size; expected a positive number of bytes or a "
            "string such as '5GB', '500MB' or '2GiB'",
            key="max_shard_size",
            value=size,
        )
    return value


@dataclass(frozen=True)
class LazyTensor:
    """A tensor to write: its shape and safetensors dtype now, its values when written.

    Args:
        shape: the stored shape.
        dtype: safetensors dtype name (`"F32"`, `"BF16"`, ...).
        produce: returns the values as a NumPy array of that shape (any float type for
            `"BF16"`, which is rounded from float32).
    """

    shape: tuple
    dtype: str
    produce: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * _DTYPES[self.dtype][1]

    def to_bytes(self) -> bytes:
        value = np.asarray(self.produce())
        if tuple(value.shape) != tuple(self.shape):
            raise ExportError(
                f"a tensor produced the shape {tuple(value.shape)}; expected {tuple(self.shape)}"
            )
        if self.dtype == "BF16":
            return float32_to_bfloat16_bits(value).tobytes()
        return np.ascontiguousarray(value.astype(_DTYPES[self.dtype][0])).tobytes()


def float32_to_bfloat16_bits(value) -> np.ndarray:
    """bfloat16 bit patterns (`uint16`) of `value`, rounded to nearest even; NaN stays NaN.

    Example:
        >>> float32_to_bfloat16_bits(np.array([1.0, -2.0], "float32"))
        array([16256, 49152], dtype=uint16)
    """
    bits = np.ascontiguousarray(np.asarray(value, dtype="float32")).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    nan = np.isnan(value)
    result = rounded.astype(np.uint16)
    result[nan] = np.uint16(0x7FC0)
    return result.astype("<u2")


def _shard_plan(tensors: dict[str, LazyTensor], max_bytes: int) -> list[list[str]]:
    """Names per shard, in order; a new shard starts when the next tensor would overflow.

    A tensor bigger than `max_bytes` gets a shard of its own (as transformers does).
    """
    shards: list[list[str]] = [[]]
    size = 0
    for name in tensors:
        nbytes = tensors[name].nbytes
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def _write_file(path: Path, names: list[str], tensors: dict[str, LazyTensor]) -> None:
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in names:
        tensor = tensors[name]
        header[name] = {
            "dtype": tensor.dtype,
            "shape": [int(d) for d in tensor.shape],
            "data_offsets": [offset, offset + tensor.nbytes],
        }
        offset += tensor.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # The data section starts 8-byte aligned.
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)))
        handle.write(encoded)
        for name in names:
            handle.write(tensors[name].to_bytes())


def write_safetensors(
    tensors: dict[str, LazyTensor], directory, max_shard_size=DEFAULT_MAX_SHARD_SIZE
) -> list[str]:
    """Write `tensors` as one `model.safetensors` or as shards with an index.

    Returns:
        The names of the files written, index last when sharded.

    Example:
        >>> write_safetensors({"w": LazyTensor((2,), "F32", lambda: np.zeros(2))},
        ...                   "out")  # doctest: +SKIP
        ['model.safetensors']
    """
    directory = Path(directory)
    shards = _shard_plan(tensors, parse_size(max_shard_size))
    if len(shards) == 1:
        _write_file(directory / SINGLE_FILE_NAME, shards[0], tensors)
        return [SINGLE_FILE_NAME]
    written, weight_map = [], {}
    for number, names in enumerate(shards, start=1):
        file_name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        _write_file(directory / file_name, names, tensors)
        written.append(file_name)
        weight_map.update(dict.fromkeys(names, file_name))
    index = {
        "metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
        "weight_map": dict(sorted(weight_map.items())),
    }
    (directory / INDEX_FILE_NAME).write_text(json.dumps(index, indent=2) + "\n")
    return [*written, INDEX_FILE_NAME]


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of an existing path: the same folder under another name (a bind
    mount, a case-insensitive file system) has the same identity."""
    try:
        status = os.stat(path)
    except (OSError, ValueError):
        return None
    return status.st_dev, status.st_ino


def _is_at_or_under(path: Path, folder: Path) -> bool:
    """Whether resolved `path` is `folder` or lies inside it (both resolved)."""
    folder_identity = _identity(folder)
    for candidate in (path, *path.parents):
        if candidate == folder or (folder_identity and _identity(candidate) == folder_identity):
            return True
    return False


def check_not_in_source(path, sources, *, argument, shown) -> None:
    """Refuse an output `path` that is, contains or lies inside one of the `sources`
    folders (symlinks resolved): writing there could replace the source's own files.

    Raises:
        PathError: naming `argument`, the path and the source folder.

    Example:
        >>> check_not_in_source("pruned", ["llama"], argument="--out", shown="pruned")
    """
    resolved = Path(os.path.abspath(os.path.expanduser(str(path)))).resolve()
    for source in sources:
        if source is None or not Path(source).is_dir():
            continue
        folder = Path(source).resolve()
        if _is_at_or_under(resolved, folder) and _is_at_or_under(folder, resolved):
            relation = "is the source checkpoint folder"
        elif _is_at_or_under(resolved, folder):
            relation = f"lies inside the source checkpoint folder {str(source)!r}"
        elif _is_at_or_under(folder, resolved):
            relation = f"contains the source checkpoint folder {str(source)!r}"
        else:
            continue
        raise PathError(
            f"{argument}: {shown!r} {relation}; expected a path outside it (the source is "
            "never overwritten)",
            path=shown,
        )


def _as_sources(source) -> list:
    if source is None:
        return []
    if isinstance(source, (str, os.PathLike)):
        return [source]
    return list(source)


def check_output_folder(out, *, overwrite=False, source=None, argument="--out") -> Path:
    """Refuse an output folder before any work is done; returns it as an absolute path.

    Refused: a value that is not a path; a path that exists and is not a directory; a
    non-empty directory without `overwrite`; with `overwrite`, a non-empty directory that
    holds no `config.json` (it is not a checkpoint folder); a folder that is, contains or
    lies inside the `source` checkpoint folder (or any of several), symlinks resolved; a
    parent folder that cannot be created or written.

    Raises:
        PathError: with one line naming `argument`, the path and what was expected.

    Example:
        >>> check_output_folder("pruned-model")  # doctest: +SKIP
        PosixPath('/home/me/pruned-model')
    """
    if not isinstance(out, (str, os.PathLike)) or not str(os.fspath(out)).strip():
        raise PathError(
            f"{argument}={shown_value(out)} is not a folder to write; expected a path (a str or "
            "os.PathLike) naming a new or empty folder",
            value=out,
        )
    try:
        return _check_output_folder(out, overwrite, _as_sources(source), argument)
    except PathError:
        raise
    except (OSError, ValueError) as error:  # a NUL character, a name too long, a loop
        reason = getattr(error, "strerror", None) or error
        raise PathError(
            f"{argument}: {shown_value(str(out))} cannot be used as a folder ({reason}); "
            "expected a writable folder path",
            path=str(out),
        ) from None


def _check_output_folder(out, overwrite, sources, argument) -> Path:
    path = Path(os.path.abspath(os.path.expanduser(str(out))))
    shown = str(out)
    if path.exists() and not path.is_dir():
        raise PathError(
            f"{argument}: {shown!r} exists and is not a directory; expected a folder to write "
            "the checkpoint into",
            path=shown,
        )
    check_not_in_source(path, sources, argument=argument, shown=shown)
    if path.is_dir() and any(path.iterdir()):
        if not overwrite:
            raise PathError(
                f"{argument}: {shown!r} exists and is not empty; pass --overwrite to replace it "
                "or choose another folder",
                path=shown,
            )
        if not (path / "config.json").is_file():
            raise PathError(
                f"{argument}: {shown!r} is not empty and holds no config.json; --overwrite only "
                "replaces a folder that holds a checkpoint, so choose an empty or new folder",
                path=shown,
            )
    parent = path.parent
    existing = parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise PathError(
            f"{argument}: cannot write into {str(existing)!r} (no permission or not a "
            f"directory); expected a writable location for {shown!r}",
            path=shown,
        )
    return path


# Weight files of an earlier export that a new export replaces even where it does not
# write that name (a single file after shards, or the reverse): two sets of weights in
# one folder would contradict each other. transformers' save_pretrained removes them too.
_EARLIER_WEIGHTS = re.compile(
    r"model\.safetensors|model-\d{5}-of-\d{5}\.safetensors|model\.safetensors\.index\.json"
    r"|model\.keras"
)


def _files_under(folder: Path) -> list[Path]:
    """Every file under `folder`, as relative paths, sorted."""
    return sorted(
        Path(root, name).relative_to(folder) for root, _, names in os.walk(folder) for name in names
    )


def _placement_plan(staging: Path, path: Path, argument: str, shown: str):
    """(files to place, existing files they or an earlier export's weights replace);
    refused before anything moves when a folder stands where a file goes, or the reverse."""
    files = _files_under(staging)
    for relative in files:
        for folder in reversed(relative.parents[:-1]):
            target = path / folder
            if os.path.islink(target) or (os.path.lexists(target) and not target.is_dir()):
                raise PathError(
                    f"{argument}: {shown!r} holds {str(folder)!r} as a file or a link, where the "
                    "export writes a folder; remove it or choose another folder",
                    path=shown,
                )
        if (path / relative).is_dir() and not os.path.islink(path / relative):
            raise PathError(
                f"{argument}: {shown!r} holds a folder {str(relative)!r}, where the export "
                "writes a file; remove it or choose another folder",
                path=shown,
            )
    written = set(files)
    replaced = [relative for relative in files if os.path.lexists(path / relative)]
    replaced += [
        Path(entry.name)
        for entry in os.scandir(path)
        if _EARLIER_WEIGHTS.fullmatch(entry.name)
        and Path(entry.name) not in written
        and not entry.is_dir(follow_symlinks=False)
    ]
    return files, replaced


def _place_files(staging: Path, path: Path, argument: str, shown: str) -> None:
    """Move the exported files from `staging` into the existing folder `path`.

    Only the files the export wrote (and an earlier export's weight files) are replaced;
    every other file of `path` stays. Replaced files are first moved aside, and put back
    if any move fails, so the folder ends as it was or with the whole export.
    """
    files, replaced = _placement_plan(staging, path, argument, shown)
    aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.replaced-", dir=path.parent))
    moved_aside, placed, made = [], [], []
    try:
        for relative in replaced:
            (aside / relative).parent.mkdir(parents=True, exist_ok=True)
            os.rename(path / relative, aside / relative)
            moved_aside.append(relative)
        for relative in files:
            for folder in reversed(relative.parents[:-1]):
                if not (path / folder).exists():
                    (path / folder).mkdir()
                    made.append(path / folder)
            os.rename(staging / relative, path / relative)
            placed.append(relative)
    except OSError as error:
        restored = _undo(staging, path, aside, placed, made, moved_aside)
        if not restored:
            raise PathError(
                f"{argument}: writing into {shown!r} failed ({error.strerror or error}) and some "
                f"replaced files could not be put back; they are in {str(aside)!r}",
                path=shown,
            ) from None
        shutil.rmtree(aside, ignore_errors=True)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def _undo(staging, path, aside, placed, made, moved_aside) -> bool:
    """Take placed files back out and put replaced ones back; whether all came back."""
    for relative in reversed(placed):
        with contextlib.suppress(OSError):
            os.rename(path / relative, staging / relative)
    for folder in reversed(made):
        with contextlib.suppress(OSError):
            folder.rmdir()
    restored = True
    for relative in reversed(moved_aside):
        try:
            os.rename(aside / relative, path / relative)
        except OSError:
            restored = False
    return restored


@contextlib.contextmanager
def output_folder(out, *, overwrite=False, source=None, argument="--out"):
    """Yield a staging folder beside `out`; move what was written there into `out` when the
    block succeeds.

    The staging folder is hidden (`.<name>.partial-XXXX`) in the same parent, so every
    move is a rename on one file system. A new (or empty) `out` is the staging folder
    renamed. An existing checkpoint folder (`overwrite`) keeps every file the export does
    not write: only the exported files replace theirs (and an earlier export's weight
    files go, as in transformers' `save_pretrained`), all put back if a move fails. On any
    exception in the block, the staging folder is removed and `out` is left as it was.

    Example:
        >>> with output_folder("pruned") as staging:  # doctest: +SKIP
        ...     (staging / "config.json").write_text("{}")
    """
    path = check_output_folder(out, overwrite=overwrite, source=source, argument=argument)
    shown = str(out)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.partial-", dir=path.parent))
    except OSError as error:
        raise PathError(
            f"{argument}: cannot create a folder beside {shown!r} ({error.strerror or error})",
            path=shown,
        ) from None
    try:
        yield staging
        os.chmod(staging, 0o777 & ~_umask())  # mkdtemp makes it private (0700).
        if path.is_dir() and any(path.iterdir()):
            _place_files(staging, path, argument, shown)
        else:
            os.rename(staging, path)  # Replaces an empty folder.
    except OSError as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, PathError):
            raise
        raise PathError(
            f"{argument}: writing {shown!r} failed ({error.strerror or error}); nothing was "
            "left there",
            path=shown,
        ) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(staging, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic_file(path, data: bytes, *, argument) -> None:
    """Write `data` to `path` through a temporary file in the same folder, then rename.

    Example:
        >>> write_atomic_file("heads.png", png_bytes, argument="--heatmap")  # doctest: +SKIP
    """
    path = Path(path)
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.partial-", dir=path.parent)
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    except OSError as error:
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(temporary)
        raise PathError(
            f"{argument}: cannot write {str(path)!r} ({error.strerror or error})", path=str(path)
        ) from None


def check_output_file(path, *, suffix, argument) -> Path:
    """Refuse an output file that cannot be written, before any work is done.

    Example:
        >>> check_output_file("heads.png", suffix=".png", argument="--heatmap")  # doctest: +SKIP
        PosixPath('heads.png')
    """
    path = Path(path)
    if path.suffix.lower() != suffix:
        raise PathError(
            f"{argument}: {str(path)!r} does not end in {suffix}; expected a {suffix} file name",
            path=str(path),
        )
    if path.is_dir():
        raise PathError(
            f"{argument}: {str(path)!r} is a directory; expected a file", path=str(path)
        )
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise PathError(
            f"{argument}: cannot write into {str(parent)!r} (missing, not a folder or no "
            "permission)",
            path=str(path),
        )
    return path
