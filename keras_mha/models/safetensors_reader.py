"""Read the tensors of a local safetensors checkpoint, single file or sharded, with NumPy.

Only NumPy (and `ml_dtypes`, a Keras dependency, for bfloat16) is used, no keras and no
torch. `SafetensorsCheckpoint.read` copies a tensor's bytes from the file straight into
one new 64-byte-aligned array in its stored dtype (no memory map, no intermediate bytes
object), an array that JAX, TensorFlow and PyTorch can adopt as a variable's buffer
without a further copy (`keras_mha.models.deferred`); `get` widens bfloat16 to float32.

Checkpoints come from strangers, so nothing is trusted before it is checked: every file
is validated when the checkpoint is opened by the `safetensors` library's own `safe_open`
(header length, JSON schema, dtypes, offsets; nothing allocated from the header's
length), the index's shard names must stay inside the folder
(`keras_mha.models.local_files`), and every problem is one `CheckpointError` naming the
file. `count_nonfinite` counts a tensor's NaN and infinite values for the loader's warning.

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
from keras_mha.models.local_files import file_in_folder
from keras_mha.planning.config_values import shown

SINGLE_FILE_NAME = "model.safetensors"
INDEX_FILE_NAME = "model.safetensors.index.json"
# The safetensors library's limit on a header's size.
MAX_HEADER_BYTES = 100_000_000
# Indexes of the largest Hub models are a few MB; anything far beyond is not an index.
MAX_INDEX_BYTES = 64 * 2**20


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


# What the safetensors library's terse reasons mean, for the messages.
_REASONS_EXPLAINED = {
    "header too large": "its first 8 bytes declare a header longer than the file or than "
    "the 100 MB safetensors allows: not a safetensors file",
    "header too small": "shorter than the 8-byte header length: not a safetensors file",
    "file not fully covered": "the tensors' data_offsets do not end where the file does: "
    "a truncated or partial download?",
    "invalid offset": "data_offsets that overlap, leave a gap or run past the file",
}


def _reason(error: Exception) -> str:
    """The library's reason, without its prefix, and what it means where it is terse."""
    text = str(error).split("Error while deserializing header: ", 1)[-1]
    meaning = next((m for words, m in _REASONS_EXPLAINED.items() if words in text), None)
    return text if meaning is None else f"{text}: {meaning}"


def _read_header(path: Path) -> tuple[dict, int]:
    """The JSON header of a safetensors file (name -> dtype, shape, data_offsets), and the
    byte offset where its data section starts.

    The `safetensors` library validates the file first (a header length over 100 MB or
    past the end of the file, JSON that is not its schema, unknown dtypes, offsets that
    overlap, leave gaps, disagree with the shape or run past the file) without
    allocating from the untrusted length; only then is the header read here, for the
    offsets that the library does not expose.
    """
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np"):
            pass
        with path.open("rb") as handle:
            prefix = handle.read(8)
            length = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else 0
            # Bounded again: the file may have changed since the library checked it.
            encoded = handle.read(min(length, MAX_HEADER_BYTES))
    except SafetensorError as error:
        raise CheckpointError(
            f"{path}: not a valid safetensors file ({_reason(error)})",
            path=str(path),
        ) from None
    except OSError as error:
        raise CheckpointError(
            f"{path}: cannot be read ({error.strerror or error})", path=str(path)
        ) from None
    try:
        header = json.loads(encoded)
        if len(encoded) != length or not isinstance(header, dict):
            raise ValueError(f"{len(encoded)} of {length} bytes")
    except (ValueError, RecursionError) as error:
        raise CheckpointError(
            f"{path}: changed while it was read (its header no longer reads: {error})",
            path=str(path),
        ) from None
    return header, 8 + length


def read_weight_map(index: Path) -> dict[str, str]:
    """The `weight_map` of a safetensors index: `{tensor name: shard file name}`.

    Raises:
        CheckpointError: the file is over 64 MB, not JSON, not an object, or its
            `weight_map` is not an object of strings.

    Example:
        >>> read_weight_map(Path("model.safetensors.index.json"))  # doctest: +SKIP
        {'lm_head.weight': 'model-00002-of-00002.safetensors', ...}
    """
    try:
        size = index.stat().st_size
        if size > MAX_INDEX_BYTES:
            raise CheckpointError(
                f"{index}: {size} bytes; a safetensors index is at most {MAX_INDEX_BYTES} bytes "
                "(a few KB per thousand tensors)",
                path=str(index),
            )
        raw = json.loads(index.read_bytes())
    except OSError as error:
        raise CheckpointError(
            f"{index}: cannot be read ({error.strerror or error})", path=str(index)
        ) from None
    except (ValueError, RecursionError) as error:
        reason = "nested too deeply" if isinstance(error, RecursionError) else error
        raise CheckpointError(
            f"{index}: not a safetensors index (not JSON: {reason})", path=str(index)
        ) from None
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict):
        if not isinstance(raw, dict):
            found = shown(raw)
        elif "weight_map" not in raw:
            found = f"an object without 'weight_map' ({len(raw)} other keys)"
        else:
            found = f"'weight_map': {shown(weight_map)}"
        raise CheckpointError(
            f"{index}: not a safetensors index: expected a JSON object whose 'weight_map' maps "
            f"tensor names to shard file names; found {found}",
            path=str(index),
            key="weight_map",
        )
    for key, name in weight_map.items():
        if not isinstance(name, str):
            raise CheckpointError(
                f"{index}: 'weight_map' maps tensor {shown(key)} to {shown(name)}; expected the "
                "file name of a shard (a string)",
                path=str(index),
                key=key,
                value=name,
            )
    return weight_map


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

    Every file is checked when the checkpoint is opened: the index is a JSON object whose
    `weight_map` maps tensor names to shard names; each shard stays inside the folder
    (`keras_mha.models.local_files`: no absolute path, no `..` or symlink leading out)
    and is a valid safetensors file holding the tensors the index places in it. Tensors
    are read only later, one at a time.

    Args:
        path: a directory holding `model.safetensors` or `model.safetensors.index.json`
            (with its shards), or the path of one `.safetensors` file.

    Raises:
        CheckpointError: no such directory or file, a malformed index or safetensors file,
            or a shard outside the folder; the message names the file and what is wrong.

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
            self._file_of = self._tensors_of(path)
        elif path.is_dir():
            index = file_in_folder(path, INDEX_FILE_NAME)
            single = None if index is not None else file_in_folder(path, SINGLE_FILE_NAME)
            if index is not None:
                self._file_of = self._indexed_tensors(path, path / INDEX_FILE_NAME)
            elif single is not None:
                self._file_of = self._tensors_of(path / SINGLE_FILE_NAME)
            else:
                present = sorted(p.name for p in path.iterdir())[:10]
                raise CheckpointError(
                    f"{path}: no {SINGLE_FILE_NAME} or {INDEX_FILE_NAME} in this directory "
                    f"(it holds {present}); pass a directory with a safetensors checkpoint",
                    path=str(path),
                )
        else:
            raise CheckpointError(
                f"{path}: no such checkpoint directory or safetensors file", path=str(path)
            )

    def _tensors_of(self, file: Path) -> dict[str, Path]:
        return {key: file for key in self._header(file)[0] if key != "__metadata__"}

    def _indexed_tensors(self, folder: Path, index: Path) -> dict[str, Path]:
        """`{tensor: shard}` from the index, every shard checked against its header."""
        weight_map = read_weight_map(index)
        shard_of_name: dict[str, Path] = {}
        missing = []
        for name in weight_map.values():
            if name in shard_of_name:
                continue
            if file_in_folder(folder, name, named_in=str(index)) is None:
                missing.append(name)
            shard_of_name[name] = folder / name
        if missing:
            raise CheckpointError(
                f"{folder}: shard(s) named in {INDEX_FILE_NAME} are missing: "
                f"{shown(sorted(missing))}",
                path=str(folder),
            )
        file_of = {}
        for key, name in weight_map.items():
            shard = shard_of_name[name]
            if key not in self._header(shard)[0] or key == "__metadata__":
                raise CheckpointError(
                    f"{shard}: {INDEX_FILE_NAME} places tensor {shown(key)} in this shard, but its "
                    f"header has no such tensor",
                    path=str(shard),
                    key=key,
                )
            file_of[key] = shard
        return file_of

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
        """(file, header entry, data start) of tensor `key` (validated on opening)."""
        if key not in self._file_of:
            raise CheckpointError(f"tensor {key!r} not found in {self.describe()}", key=key)
        path = self._file_of[key]
        header, data_start = self._header(path)
        return path, header[key], data_start

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

    def dtype_of(self, key: str) -> str:
        """The safetensors dtype name of tensor `key` (`"F32"`, `"BF16"`, ...)."""
        _, entry, _ = self._entry(key)
        return entry["dtype"]

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
            CheckpointError: no tensor `key`, a dtype NumPy cannot hold, or a file that
                ends before the tensor does (it changed since it was opened).

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
        start = int(entry["data_offsets"][0])
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


# Bits that are all ones in the exponent of a NaN or an infinity, per float width.
_EXPONENT_BITS = {
    np.dtype("float64"): np.uint64(0x7FF0000000000000),
    np.dtype("float32"): np.uint32(0x7F800000),
    np.dtype("float16"): np.uint16(0x7C00),
    np.dtype(ml_dtypes.bfloat16): np.uint16(0x7F80),
}
_CHUNK_ELEMENTS = 1 << 18


def count_nonfinite(array: np.ndarray) -> int:
    """How many elements of `array` are NaN or infinite (0 for integer arrays).

    A chunk at a time, so no temporary as large as the tensor is made. A chunk of
    float32 or float64 whose sum is finite holds no NaN or inf (they would carry into the
    sum, NumPy's fastest pass); other chunks, and the 16-bit floats (slow to sum, quick
    to mask), are counted on their bits (an all-ones exponent).

    Example:
        >>> count_nonfinite(np.array([1.0, np.nan, -np.inf, 2.0], "float32"))
        2
    """
    flat = np.ascontiguousarray(array).reshape(-1)
    if flat.dtype.kind in "biu":
        return 0
    mask = _EXPONENT_BITS.get(flat.dtype)
    summed = flat.dtype in (np.float32, np.float64)
    count = 0
    for start in range(0, flat.size, _CHUNK_ELEMENTS):
        chunk = flat[start : start + _CHUNK_ELEMENTS]
        if summed:
            with np.errstate(all="ignore"):  # an overflowing sum is merely counted exactly
                if np.isfinite(np.sum(chunk)):
                    continue
        if mask is None:  # float8 and other ml_dtypes
            count += int(np.count_nonzero(~np.isfinite(chunk)))
        else:
            bits = chunk.view(mask.dtype)
            count += int(np.count_nonzero(bits & mask == mask))
    return count


__all__ = [
    "BUFFER_ALIGNMENT",
    "INDEX_FILE_NAME",
    "SAFETENSORS_DTYPES",
    "SINGLE_FILE_NAME",
    "SafetensorsCheckpoint",
    "aligned_empty",
    "count_nonfinite",
    "read_weight_map",
]
