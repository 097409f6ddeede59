"""Read the tensors of a local safetensors checkpoint, single file or sharded, with NumPy.

Only NumPy (and `ml_dtypes`, a Keras dependency, for bfloat16) is used, no keras and no
torch. `SafetensorsCheckpoint.read` copies a tensor's bytes from the file straight into
one new 64-byte-aligned array in its stored dtype (no memory map, no intermediate bytes
object), an array that JAX, TensorFlow and PyTorch can adopt as a variable's buffer
without a further copy (`keras_mha.models.deferred`); `get` widens bfloat16 to float32.

Example:
    >>> from keras_mha.models.safetensors_reader import SafetensorsCheckpoint
    >>> checkpoint = SafetensorsCheckpoint("path/to/all-MiniLM-L6-v2")  # doctest: +SKIP
    >>> checkpoint.get("encoder.layer.0.attention.self.query.weight").shape  # doctest: +SKIP
    (384, 384)
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

from keras_mha.errors import CheckpointError

SINGLE_FILE_NAME = "model.safetensors"
INDEX_FILE_NAME = "model.safetensors.index.json"


# safetensors dtype names -> NumPy dtypes (bfloat16 and float8 from ml_dtypes).
SAFETENSORS_DTYPES = {
    "F64": np.dtype("float64"),
    "F32": np.dtype("float32"),
    "F16": np.dtype("float16"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype("int64"),
    "I32": np.dtype("int32"),
    "I16": np.dtype("int16"),
    "I8": np.dtype("int8"),
    "U64": np.dtype("uint64"),
    "U32": np.dtype("uint32"),
    "U16": np.dtype("uint16"),
    "U8": np.dtype("uint8"),
    "BOOL": np.dtype("bool"),
}

# XLA's CPU client adopts a host buffer without copying only at this alignment; NumPy's
# own allocations guarantee 16 bytes.
BUFFER_ALIGNMENT = 64


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on a 64-byte boundary.

    Example:
        >>> aligned_empty((3, 5), "float32").ctypes.data % BUFFER_ALIGNMENT
        0
    """
    dtype = np.dtype(dtype)
    shape = tuple(int(n) for n in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + BUFFER_ALIGNMENT, dtype=np.uint8)
    start = -raw.ctypes.data % BUFFER_ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def _read_header(path: Path) -> tuple[dict, int]:
    """The JSON header of a safetensors file (name -> dtype, shape, data_offsets), and the
    byte offset where its data section starts."""
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
    except (OSError, struct.error, ValueError) as error:
        raise CheckpointError(f"{path}: not a readable safetensors file ({error})") from error
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: not a safetensors file (its header is not an object)")
    return header, 8 + length


def _read_into(path: Path, offset: int, target: np.ndarray, key: str) -> None:
    """Fill `target` with the file's bytes from `offset` on (reads may return short)."""
    buffer = memoryview(target.reshape(-1).view(np.uint8))
    filled = 0
    with path.open("rb", buffering=0) as handle:
        handle.seek(offset)
        while filled < len(buffer):
            count = handle.readinto(buffer[filled:])
            if not count:
                raise CheckpointError(
                    f"{path}: tensor {key!r} needs {len(buffer)} bytes from byte {offset}, but "
                    f"the file ends after {filled} of them (a truncated download?)",
                    path=str(path),
                    key=key,
                )
            filled += count


class SafetensorsCheckpoint:
    """The tensors of a local safetensors checkpoint, single file or sharded.

    Args:
        path: a directory holding `model.safetensors` or `model.safetensors.index.json`
            (with its shards), or the path of one `.safetensors` file.

    Raises:
        CheckpointError: no such directory or file, or a malformed index.

    Example:
        >>> checkpoint = SafetensorsCheckpoint("/path/to/checkpoint")  # doctest: +SKIP
        >>> "model.layers.0.self_attn.q_proj.weight" in checkpoint.keys()  # doctest: +SKIP
        True
    """

    def __init__(self, path: str | Path):
        path = Path(path)
        self.directory = path if path.is_dir() else path.parent
        self._headers: dict[Path, tuple[dict, int]] = {}
        if path.is_file():
            files = {path}
            self._file_of = {key: path for key in self._header(path)[0] if key != "__metadata__"}
        elif (path / INDEX_FILE_NAME).is_file():
            index_path = path / INDEX_FILE_NAME
            try:
                weight_map = json.loads(index_path.read_text())["weight_map"]
            except (ValueError, KeyError, TypeError) as error:
                raise CheckpointError(
                    f"{index_path}: not a safetensors index with a 'weight_map' object ({error})"
                ) from error
            self._file_of = {key: path / name for key, name in weight_map.items()}
            files = set(self._file_of.values())
        elif (path / SINGLE_FILE_NAME).is_file():
            single = path / SINGLE_FILE_NAME
            files = {single}
            self._file_of = {
                key: single for key in self._header(single)[0] if key != "__metadata__"
            }
        elif path.is_dir():
            present = sorted(p.name for p in path.iterdir())[:10]
            raise CheckpointError(
                f"{path}: no {SINGLE_FILE_NAME} or {INDEX_FILE_NAME} in this directory "
                f"(it holds {present}); pass a directory with a safetensors checkpoint"
            )
        else:
            raise CheckpointError(f"{path}: no such checkpoint directory or safetensors file")
        missing = sorted(str(f) for f in files if not f.is_file())
        if missing:
            raise CheckpointError(
                f"{path}: shard(s) named in {INDEX_FILE_NAME} are missing: {missing}"
            )

    def keys(self) -> list[str]:
        """Every tensor key of the checkpoint, sorted."""
        return sorted(self._file_of)

    def __contains__(self, key: str) -> bool:
        return key in self._file_of

    def file_of(self, key: str) -> Path:
        """The file holding `key`."""
        return self._file_of[key]

    def _header(self, path: Path) -> tuple[dict, int]:
        if path not in self._headers:
            self._headers[path] = _read_header(path)
        return self._headers[path]

    def _entry(self, key: str) -> tuple[Path, dict, int]:
        """(file, header entry, data start) of tensor `key`."""
        if key not in self._file_of:
            raise CheckpointError(f"tensor {key!r} not found in {self.describe()}", key=key)
        path = self._file_of[key]
        header, data_start = self._header(path)
        entry = header.get(key)
        if not isinstance(entry, dict):
            raise CheckpointError(
                f"{path}: {INDEX_FILE_NAME} places tensor {key!r} in this shard, but its "
                f"header has no such tensor",
                path=str(path),
                key=key,
            )
        shape, offsets = entry.get("shape"), entry.get("data_offsets")
        if not (
            isinstance(shape, list)
            and all(isinstance(n, int) and n >= 0 for n in shape)
            and isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(n, int) for n in offsets)
        ):
            raise CheckpointError(
                f"{path}: the header entry of tensor {key!r} is {entry!r}; expected a 'shape' "
                f"list of non-negative integers and 'data_offsets' [start, end]",
                path=str(path),
                key=key,
            )
        return path, entry, data_start

    def shape_of(self, key: str) -> tuple[int, ...]:
        """The shape of tensor `key`, read from its file's header (no data is read)."""
        _, entry, _ = self._entry(key)
        return tuple(int(n) for n in entry["shape"])

    def describe(self) -> str:
        """The checkpoint's file (or index) for messages."""
        if (self.directory / INDEX_FILE_NAME).is_file():
            return str(self.directory / INDEX_FILE_NAME)
        files = sorted({str(f) for f in self._file_of.values()})
        return files[0] if len(files) == 1 else str(self.directory)

    def nbytes_of(self, key: str) -> int:
        """The bytes tensor `key` takes in its file, from the header (no data is read)."""
        _, entry, _ = self._entry(key)
        start, end = entry["data_offsets"]
        return int(end) - int(start)

    def read(self, key: str) -> np.ndarray:
        """Tensor `key` in its stored dtype, read into a new 64-byte-aligned array.

        The file's bytes go straight into the array: one copy, no memory map (whose
        touched pages would count in the process's resident memory too) and no
        intermediate bytes object. bfloat16 comes back as `ml_dtypes.bfloat16`.

        Raises:
            CheckpointError: no tensor `key`, a dtype NumPy cannot hold, offsets that
                disagree with the shape, or a file that ends before the tensor does.

        Example:
            >>> checkpoint.read("model.norm.weight").dtype  # doctest: +SKIP
            dtype(bfloat16)
        """
        path, entry, data_start = self._entry(key)
        dtype = SAFETENSORS_DTYPES.get(entry.get("dtype"))
        if dtype is None:
            raise CheckpointError(
                f"{path}: tensor {key!r} has dtype {entry.get('dtype')!r}; expected one of "
                f"{sorted(SAFETENSORS_DTYPES)}",
                path=str(path),
                key=key,
            )
        shape = tuple(int(n) for n in entry["shape"])
        start, end = (int(n) for n in entry["data_offsets"])
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if start < 0 or end - start != nbytes:
            raise CheckpointError(
                f"{path}: tensor {key!r} has data_offsets {[start, end]} ({end - start} bytes), "
                f"but its shape {list(shape)} of {entry['dtype']} needs {nbytes} bytes",
                path=str(path),
                key=key,
            )
        array = aligned_empty(shape, dtype)
        _read_into(path, data_start + start, array, key)
        return array

    def get(self, key: str) -> np.ndarray:
        """The tensor `key` as a NumPy array (bfloat16 widened to float32, exactly).

        Raises:
            CheckpointError: as `read`.
        """
        array = self.read(key)
        return array.astype(np.float32) if array.dtype == ml_dtypes.bfloat16 else array


__all__ = [
    "BUFFER_ALIGNMENT",
    "INDEX_FILE_NAME",
    "SAFETENSORS_DTYPES",
    "SINGLE_FILE_NAME",
    "SafetensorsCheckpoint",
    "aligned_empty",
]
