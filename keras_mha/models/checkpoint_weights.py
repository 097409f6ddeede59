"""Fill a rebuilt attention layer with the weights of a local safetensors checkpoint.

A Hugging Face checkpoint stores each attention block under its family's names and
in torch's layouts. The names are the family's table (`Family.weights` in
`keras_mha.families`), the same one whole models load with: its rules under
`blocks.{layer}.attention.` (`cross_attention.` for a decoder's cross-attention,
`encoder_blocks.{layer}.attention.` for an encoder of an encoder-decoder) give each
tensor of one layer and the `keras_mha.layers.GroupedQueryAttention` variables it
fills (`query_kernel (F, H, D)`, `key_kernel`/`value_kernel (F, Hkv, D)`, biases
`(H, D)`/`(Hkv, D)`, `output_kernel (H, D, F_out)`, `output_bias (F_out,)`,
`query_norm_scale`/`key_norm_scale (D,)`), through the named transforms of
`keras_mha.models.weight_names` (split or fused q/k/v, Conv1D or Linear, q/k norms
stored as `w` for families whose norms multiply by `1 + w`).

The family comes from `spec`, else from `config.json` beside the checkpoint; without
either, every family's table is tried and the one the tensors fit is used (an error
names the candidates when several fit differently).

Only NumPy (and `ml_dtypes`, a Keras dependency, for bfloat16) is used, no torch.
`SafetensorsCheckpoint.read` copies a tensor's bytes from the file straight into one new
64-byte-aligned array in its stored dtype (no memory map, no intermediate bytes object),
an array that JAX, TensorFlow and PyTorch can adopt as a variable's buffer without a
further copy (`keras_mha.models.deferred`); `get` widens bfloat16 to float32.

Example:
    >>> from keras_mha.models.checkpoint_weights import SafetensorsCheckpoint
    >>> checkpoint = SafetensorsCheckpoint("path/to/all-MiniLM-L6-v2")  # doctest: +SKIP
    >>> checkpoint.get("encoder.layer.0.attention.self.query.weight").shape  # doctest: +SKIP
    (384, 384)
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from keras_mha.errors import CheckpointError
from keras_mha.families import family_for, unique_families
from keras_mha.families._weights import WeightNames
from keras_mha.models.weight_names import TRANSFORMS

SINGLE_FILE_NAME = "model.safetensors"
INDEX_FILE_NAME = "model.safetensors.index.json"
CONFIG_FILE_NAME = "config.json"
ATTENTION_PARTS = ("self", "cross", "encoder")
# The model variables of each attention part in the family tables.
ATTENTION_STEMS = {
    "self": "blocks.{layer}.attention.",
    "cross": "blocks.{layer}.cross_attention.",
    "encoder": "encoder_blocks.{layer}.attention.",
}


# -- reading tensors ----------------------------------------------------------------------------


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


# -- one layer's attention tensors, through the family's table -----------------------------------


@dataclass(frozen=True)
class AttentionTensor:
    """One checkpoint tensor of a layer's attention block and the layer variables it fills.

    Attributes:
        hub_name: the tensor's key in the checkpoint.
        variables: attribute names of the layer's variables (`query_kernel`, ...).
        transform: a key of `keras_mha.models.weight_names.TRANSFORMS`.
    """

    hub_name: str
    variables: tuple[str, ...]
    transform: str

    @property
    def is_kernel(self) -> bool:
        return any(name.endswith("_kernel") for name in self.variables)


def attention_tensors(
    names: WeightNames,
    keys: Iterable[str],
    layer_index: int,
    *,
    attention: str = "self",
    where: str = "checkpoint",
) -> list[AttentionTensor]:
    """The tensors a table gives one layer's attention block (present in `keys` or not).

    Args:
        names: a family's `WeightNames`.
        keys: the checkpoint's tensor keys (to find the table's stem, e.g. `model.`).
        layer_index: the layer (index within its stack).
        attention: "self", "cross" or "encoder" (see `ATTENTION_STEMS`).
        where: the checkpoint's file, for messages.

    Raises:
        CheckpointError: the table's anchor tensor is under none of its stems, or the
            table has no tensors for that attention part.

    Example:
        >>> from keras_mha.families import family_for
        >>> keys = ["transformer.wte.weight", "transformer.h.1.attn.c_attn.weight"]
        >>> [t.hub_name for t in attention_tensors(family_for("gpt2").weights, keys, 1)][:1]
        ['transformer.h.1.attn.c_attn.weight']
    """
    if attention not in ATTENTION_PARTS:
        raise ValueError(f"attention={attention!r} must be one of {list(ATTENTION_PARTS)}")
    prefix = names.find_prefix(keys)
    if prefix is None:
        raise CheckpointError(
            f"{where}: no {names.anchor.format(prefix='')!r} under any of the stems "
            f"{list(names.prefixes)}: not a checkpoint of this family"
        )
    stem = ATTENTION_STEMS[attention].format(layer=layer_index)
    tensors = []
    for rule in names.rules:
        paths = rule.variable_paths(layer_index)
        if all(path.startswith(stem) for path in paths):
            variables = tuple(path[len(stem) :] for path in paths)
            tensors.append(
                AttentionTensor(rule.hub_name(prefix, layer_index), variables, rule.transform)
            )
    if not tensors:
        raise CheckpointError(f"{where}: this family's checkpoints have no {attention!r} attention")
    return tensors


def _present(tensors: list[AttentionTensor], keys: set) -> tuple | None:
    """What a table reads from these keys, or None unless every kernel tensor is there."""
    if not all(tensor.hub_name in keys for tensor in tensors if tensor.is_kernel):
        return None
    return tuple(tensor for tensor in tensors if tensor.hub_name in keys)


def _family_of_checkpoint(directory: Path, spec):
    """The family's name from `spec`, else from config.json beside the checkpoint, or None."""
    if spec is not None:
        return spec.family
    config_path = directory / CONFIG_FILE_NAME
    if not config_path.is_file():
        return None
    from keras_mha.cards.spec import from_config

    return from_config(json.loads(config_path.read_text())).family


def checkpoint_weight_names(
    keys: Iterable[str], layer_index: int, *, family: str | None, attention: str, where: str
) -> WeightNames:
    """The table to read one layer with: `family`'s, else the one the tensors fit.

    Without a family (or for one whose module names no tensors, such as an unknown
    `model_type`), every family's table is tried; those that find every kernel of the
    layer must read the same tensors the same way, or the choice is refused.
    """
    known = family_for(family) if family is not None else None
    if known is not None and known.weights is not None:
        return known.weights
    keys = set(keys)
    fits: dict[str, tuple] = {}
    tables = {}
    for candidate in unique_families():
        if candidate.weights is None:
            continue
        try:
            tensors = attention_tensors(candidate.weights, keys, layer_index, attention=attention)
        except CheckpointError:
            continue
        present = _present(tensors, keys)
        if present is not None:
            fits[candidate.name], tables[candidate.name] = present, candidate.weights
    if len(set(fits.values())) == 1:
        return tables[next(iter(fits))]
    if fits:
        raise CheckpointError(
            f"{where}: the tensors of layer_index={layer_index} fit the names of several "
            f"families that read them differently ({sorted(fits)}); pass spec= or put the "
            f"model's config.json beside the checkpoint"
        )
    sample = sorted(key for key in keys if re.search(rf"(^|\.){layer_index}\.", key))[:6]
    raise CheckpointError(
        f"{where}: no attention tensors of layer_index={layer_index} (attention={attention!r}) "
        f"under the names of any family keras-mha knows; keys of that layer include {sample}"
    )


def _layer_error(layer, checkpoint, message: str) -> CheckpointError:
    return CheckpointError(
        f"{checkpoint.describe()}: {message} (layer {layer.name!r}: num_heads="
        f"{layer.num_heads}, num_key_value_heads={layer.num_key_value_heads}, "
        f"head_dim={layer.head_dim})"
    )


def _read_layer_tensors(layer, checkpoint, tensors, layer_index, attention) -> dict:
    """`{variable name: (value, hub name)}` for `layer`, every tensor checked first."""
    if not any(tensor.hub_name in checkpoint for tensor in tensors if tensor.is_kernel):
        expected = [tensor.hub_name for tensor in tensors if tensor.is_kernel][:2]
        raise CheckpointError(
            f"{checkpoint.describe()}: no attention tensors of layer_index={layer_index} "
            f"(attention={attention!r}); expected {expected}"
        )
    values = {}
    for tensor in tensors:
        variables = [getattr(layer, name, None) for name in tensor.variables]
        held = all(variable is not None for variable in variables)
        present = tensor.hub_name in checkpoint
        if present and not held:
            absent = [n for n, v in zip(tensor.variables, variables, strict=True) if v is None]
            raise _layer_error(
                layer,
                checkpoint,
                f"holds {tensor.hub_name!r}, but the layer has no {absent[0]}; build it with "
                f"the bias or q/k norm the checkpoint has (use_bias / use_output_bias / "
                f"use_qk_norm)",
            )
        if held and not present:
            raise CheckpointError(
                f"tensor {tensor.hub_name!r} not found in {checkpoint.describe()}, but the "
                f"layer {layer.name!r} has a {tensor.variables[0]}"
            )
        if not present:
            continue
        shapes = [tuple(variable.shape) for variable in variables]
        transform = TRANSFORMS[tensor.transform]
        have, want = checkpoint.shape_of(tensor.hub_name), tuple(transform.hub_shape(shapes))
        if have != want:
            raise _layer_error(
                layer,
                checkpoint,
                f"{tensor.hub_name!r} has shape {have}, but the layer needs {want}",
            )
        parts = transform.to_keras(np.asarray(checkpoint.get(tensor.hub_name)), shapes)
        for name, value in zip(tensor.variables, parts, strict=True):
            values[name] = (value, tensor.hub_name)
    unfilled = [w.name for w in layer.trainable_weights if w.name not in values]
    if unfilled:
        raise _layer_error(
            layer, checkpoint, f"the layer has {unfilled}, which no tensor of this family fills"
        )
    return values


def load_attention_weights(
    layer, checkpoint_dir, layer_index: int, *, spec=None, attention: str = "self"
) -> dict[str, str]:
    """Fill `layer` with the attention weights of layer `layer_index` of a checkpoint.

    The tensors are the family's (`Family.weights`, the table whole models load with).
    Every tensor is checked against the layer's variable shapes before any is assigned,
    so a failed load leaves the layer unchanged. The layer's `head_gates` are left as
    they are.

    Args:
        layer: a built `keras_mha.layers.GroupedQueryAttention` (or MHA / MQA), e.g.
            from `keras_mha.models.build_attention`.
        checkpoint_dir: directory with `model.safetensors` or
            `model.safetensors.index.json` and its shards (or one `.safetensors` file).
        layer_index: the layer within its stack.
        spec: the model's `ModelSpec` (it names the family); when None, `config.json`
            beside the checkpoint is read if present, else the family is found from the
            tensor names.
        attention: "self", "cross" or "encoder" (as in `build_attention`).

    Returns:
        A dict from each assigned variable name to the checkpoint key it came from.

    Raises:
        CheckpointError: no checkpoint, no tensors of that layer under the family's
            names, a missing tensor (the message names the key and the file), a tensor
            the layer has no variable for, or a shape the layer does not have.

    Example:
        >>> from keras_mha.models import build_attention, load_attention_weights
        >>> from keras_mha.cards.spec import from_config
        >>> import json
        >>> config = json.load(open("minilm/config.json"))  # doctest: +SKIP
        >>> layer = build_attention(from_config(config), layer_index=0)  # doctest: +SKIP
        >>> sources = load_attention_weights(layer, "minilm", 0)  # doctest: +SKIP
        >>> sources["query_kernel"]  # doctest: +SKIP
        'encoder.layer.0.attention.self.query.weight'
    """
    if not getattr(layer, "built", False) or not hasattr(layer, "query_kernel"):
        raise ValueError(
            f"layer {getattr(layer, 'name', layer)!r} must be built before loading weights; "
            f"call layer.build((None, None, hidden_size)) or use build_attention"
        )
    if isinstance(layer_index, bool) or not isinstance(layer_index, int) or layer_index < 0:
        raise ValueError(f"layer_index={layer_index!r} must be a non-negative integer")
    if attention not in ATTENTION_PARTS:
        raise ValueError(f"attention={attention!r} must be one of {list(ATTENTION_PARTS)}")
    checkpoint = SafetensorsCheckpoint(checkpoint_dir)
    keys, where = checkpoint.keys(), checkpoint.describe()
    names = checkpoint_weight_names(
        keys,
        layer_index,
        family=_family_of_checkpoint(checkpoint.directory, spec),
        attention=attention,
        where=where,
    )
    tensors = attention_tensors(names, keys, layer_index, attention=attention, where=where)
    values = _read_layer_tensors(layer, checkpoint, tensors, layer_index, attention)
    # keras casts, so a bfloat16 layer works although NumPy has no bfloat16.
    from keras import ops

    for name, (value, _) in values.items():
        variable = getattr(layer, name)
        variable.assign(ops.cast(value, variable.dtype))
    return {name: source for name, (_, source) in values.items()}


__all__ = [
    "ATTENTION_PARTS",
    "ATTENTION_STEMS",
    "AttentionTensor",
    "CheckpointError",
    "SafetensorsCheckpoint",
    "attention_tensors",
    "checkpoint_weight_names",
    "load_attention_weights",
]
