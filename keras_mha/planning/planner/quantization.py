"""How a checkpoint stores its weights: plain dtypes and the quantization formats of the
Hub, one table entry per format with the rule it stores a linear layer's weight by.

`checkpoint_format(config)` reads `quantization_config` and `torch_dtype` / `dtype` (at the
top level or in `text_config`) and returns the `WeightsFormat` the plan uses by default;
`dtype_format("int4")` is the format `--weights-dtype` asks for. A format says which
matrices it quantizes (by `WeightGroup.role`), the bytes of one quantized matrix of
`(in_features, out_features)` (weights, scales, zero points and indices, as the format
writes them into its safetensors), and the dtype of everything it leaves alone (embeddings,
norms, biases, the LM head, routers). docs/concepts/memory-planner.md gives every rule with its
source and the real checkpoint sizes it was checked against.

Formats counted (`quant_method`): `fp8` (transformers' FineGrainedFP8, DeepSeek-V3's
block-scaled float8), `fbgemm_fp8`, `gptq`, `awq`, `bitsandbytes` (LLM.int8, nf4/fp4 with
or without double quantization) and `compressed-tensors` (`pack-quantized`,
`int-quantized`, `float-quantized`, `nvfp4-pack-quantized`).

Pure Python.

Example:
    >>> fmt = checkpoint_format({"torch_dtype": "float16", "quantization_config": {
    ...     "quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}})
    >>> fmt.id, fmt.matrix_bytes(4096, 4096)
    ('gptq-int4-g128', 8732672)
    >>> checkpoint_format({"torch_dtype": "bfloat16"}).id
    'bfloat16'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from keras_mha.planning.costs import KV_DTYPE_BITS
from keras_mha.planning.weight_formats import PLANNER_FORMATS, weight_format

PLAIN_DTYPES = ("float32", "bfloat16", "float16")
GENERIC_DTYPES = PLANNER_FORMATS
# What `torch_dtype` / `dtype` may say, in transformers' spellings.
TORCH_DTYPES = {
    "float32": "float32", "float": "float32", "torch.float32": "float32",
    "bfloat16": "bfloat16", "torch.bfloat16": "bfloat16",
    "float16": "float16", "half": "float16", "torch.float16": "float16",
}  # fmt: skip
DEFAULT_DTYPE = "bfloat16"
# A config that names no dtype: transformers loads it in float32, and checkpoints that old
# (GPT-2, BERT, T5) are stored so.
UNNAMED_DTYPE = "float32"
# Roles a weight-only format quantizes when its config says nothing else: every linear
# layer of the blocks. The LM head, routers, poolers and OPT's projections stay unquantized
# (transformers skips `lm_head`; routers are tiny and kept in 16 bits by the fp8 and GPTQ
# checkpoints on the Hub).
BLOCK_ROLES = frozenset(
    ("attention", "kv_projection", "mla_down", "mlp", "expert", "shared_expert", "mamba",
     "vision")
)  # fmt: skip
# bitsandbytes converts every nn.Linear but the LM head (`llm_int8_skip_modules`).
ALL_BUT_HEAD = BLOCK_ROLES | {"router", "pooler", "projection"}


def _ceil(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


@dataclass(frozen=True)
class WeightsFormat:
    """How the weights are stored (see the module docstring).

    Attributes:
        id: short name used in reports and JSON (`bfloat16`, `int4`, `gptq-int4-g128`, ...).
        label: one line for people.
        method: the `quantization_config.quant_method` it reads, or None for dtypes.
        bits: bits per quantized weight (the dtype's width for plain dtypes).
        unquantized_dtype: dtype of every tensor it does not quantize.
        quantized_roles: `WeightGroup.role`s it quantizes (empty for plain dtypes).
        matrix_bytes: bytes of one quantized `(in_features, out_features)` matrix.
        fp8_compute: whether prefill runs at the device's float8 peak (float8 weights and
            activations); weight-only formats compute in 16 bits.
        from_checkpoint: read from the config (True) or asked for (`--weights-dtype`).
        notes: what the reading assumed or could not use.
        runtime_mode: the `quantize=` mode that allocates exactly these bytes (generic
            int8 / int4), else None.
        plan_only: a generic format keras-mha's runtime cannot store (float8's 1-byte
            weights); checkpoints' formats describe files and are never plan only.

    Example:
        >>> dtype_format("int4").matrix_bytes(256, 2)  # 256 + 4 scales x 3 + 256 g_idx x 4
        1292
    """

    id: str
    label: str
    method: str | None
    bits: int
    unquantized_dtype: str
    quantized_roles: frozenset
    matrix_bytes: Callable[[int, int], int] = field(compare=False, repr=False)
    fp8_compute: bool = False
    from_checkpoint: bool = False
    notes: tuple[str, ...] = ()
    runtime_mode: str | None = None
    plan_only: bool = False

    @property
    def is_quantized(self) -> bool:
        return bool(self.quantized_roles)

    def as_dict(self) -> dict:
        """JSON-ready.

        Example:
            >>> dtype_format("bfloat16").as_dict()["id"]
            'bfloat16'
        """
        return {
            "id": self.id,
            "label": self.label,
            "method": self.method,
            "bits": self.bits,
            "unquantized_dtype": self.unquantized_dtype,
            "quantized_roles": sorted(self.quantized_roles),
            "fp8_compute": self.fp8_compute,
            "from_checkpoint": self.from_checkpoint,
            "notes": list(self.notes),
            "runtime_mode": self.runtime_mode,
            "plan_only": self.plan_only,
        }


def dtype_format(dtype: str, *, from_checkpoint: bool = False, notes=()) -> WeightsFormat:
    """The format of `--weights-dtype DTYPE`: every weight in a plain dtype, or the generic
    int8 / int4 / float8 of the block matrices as `keras_mha.planning.weight_formats`
    describes them (int8 and int4: Keras's, what `model.quantize` allocates; float8: 1-byte
    weights, a float32 scale per 128x128 block, plan only), the rest in bfloat16.

    Example:
        >>> dtype_format("float8").matrix_bytes(128, 256)  # 32,768 weights + 2 scales
        32776
        >>> dtype_format("int8").matrix_bytes(128, 256)  # 32,768 weights + 256 scales
        33280
    """
    bits = KV_DTYPE_BITS[dtype]
    if dtype in PLAIN_DTYPES:
        return WeightsFormat(dtype, f"{dtype} weights", None, bits, dtype, frozenset(),
                             lambda size_in, size_out: 0, from_checkpoint=from_checkpoint,
                             notes=tuple(notes))  # fmt: skip
    scheme = weight_format(dtype)
    return WeightsFormat(
        dtype,
        scheme.label + (" (plan only)" if scheme.plan_only else ""),
        None,
        bits,
        DEFAULT_DTYPE,
        BLOCK_ROLES,
        lambda size_in, size_out: scheme.matrix_bytes(size_in, size_out, DEFAULT_DTYPE),
        fp8_compute=dtype == "float8",
        runtime_mode=scheme.runtime_mode,
        plan_only=scheme.plan_only,
    )


# -- the rules ------------------------------------------------------------------------------


def _fp8_block(block_out: int, block_in: int, scale_bytes: int):
    def rule(size_in: int, size_out: int) -> int:
        return size_in * size_out + _ceil(size_out, block_out) * _ceil(size_in, block_in) * (
            scale_bytes
        )

    return rule


def _gptq(bits: int, group: int):
    def rule(size_in: int, size_out: int) -> int:
        groups = _ceil(size_in, group or size_in)
        qweight = _ceil(size_in * bits, 32) * size_out * 4
        qzeros = groups * _ceil(size_out * bits, 32) * 4
        return qweight + qzeros + groups * size_out * 2 + size_in * 4  # scales, g_idx

    return rule


def _awq(bits: int, group: int, zero_point: bool):
    def rule(size_in: int, size_out: int) -> int:
        groups = _ceil(size_in, group or size_in)
        packed_out = _ceil(size_out * bits, 32) * 4
        qzeros = groups * packed_out if zero_point else 0
        return size_in * packed_out + qzeros + groups * size_out * 2

    return rule


def _bnb_8bit(size_in: int, size_out: int) -> int:
    return size_in * size_out + 4 * size_out  # int8 weight, float32 SCB per row


def _bnb_4bit(double_quant: bool, blocksize: int = 64):
    def rule(size_in: int, size_out: int) -> int:
        weights = size_in * size_out
        blocks = _ceil(weights, blocksize)
        code = 16 * 4  # quant_map: the 16 nf4/fp4 values in float32
        if double_quant:
            # absmax quantized to uint8, with a float32 absmax per 256 blocks and its
            # 256-entry float32 code.
            scales = blocks + _ceil(blocks, 256) * 4 + 256 * 4
        else:
            scales = blocks * 4
        return _ceil(weights, 2) + scales + code

    return rule


# -- reading quantization_config ------------------------------------------------------------


@dataclass
class _Reader:
    """Values of one `quantization_config`, each checked once; a bad one is a note."""

    config: Mapping
    notes: list[str]
    where: str = "quantization_config"

    def int_in(self, key: str, allowed, default):
        value = self.config.get(key, default)
        if isinstance(value, bool) or value not in allowed:
            self.notes.append(f"{self.where}.{key} = {value!r} is not one of {list(allowed)}")
            raise _Unreadable
        return value

    def group_size(self, key: str = "group_size", default: int = 128) -> int:
        """A positive group size, or 0 for one group per row (-1 / None in configs)."""
        value = self.config.get(key, default)
        if value is None or value == -1:
            return 0
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            self.notes.append(
                f"{self.where}.{key} = {value!r} is not a group size (a positive integer or -1)"
            )
            raise _Unreadable
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.config.get(key, default)
        if not isinstance(value, bool):
            self.notes.append(f"{self.where}.{key} = {value!r} is not true or false")
            raise _Unreadable
        return value

    def block(self, key: str) -> tuple[int, int] | None:
        """A weight block `[n, k]` of two positive integers (booleans are not: `true` is no
        block size), or None when the key is absent."""
        value = self.config.get(key)
        if value is None:
            return None
        if not (
            isinstance(value, list)
            and len(value) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in value)
        ):
            self.notes.append(f"{self.where}.{key} = {value!r} is not [n, k]")
            raise _Unreadable
        return value[0], value[1]

    def text(self, key: str, default: str | None = None) -> str | None:
        value = self.config.get(key, default)
        if value is not None and not isinstance(value, str):
            self.notes.append(f"{self.where}.{key} = {value!r} is not a string")
            raise _Unreadable
        return value.lower() if isinstance(value, str) else value


class _Unreadable(Exception):
    """A value of the quantization config that keras-mha cannot plan with (noted)."""


def _skipped_roles(reader: _Reader, *keys: str) -> frozenset:
    """Roles named by `modules_to_not_convert` / `ignore` style lists, by keyword; an
    entry naming single modules (a layer index) cannot be applied and is noted."""
    roles = set()
    for key in keys:
        entries = reader.config.get(key) or []
        if not isinstance(entries, list):
            reader.notes.append(f"{reader.where}.{key} = {entries!r} is not a list; ignored")
            continue
        for entry in entries:
            text = str(entry).lower()
            matched = [role for words, role in _SKIP_WORDS if any(w in text for w in words)]
            if matched and not any(character.isdigit() for character in text):
                roles.update(matched)
            elif not any(words in text for words in ("lm_head", "embed")):
                reader.notes.append(
                    f"{reader.where}.{key} entry {str(entry)[:60]!r} names single modules; "
                    "counted as quantized"
                )
    return frozenset(roles)


# Keywords of module names in skip lists and the role they exclude.
_SKIP_WORDS = (
    (("lm_head", "embed_out", "output_layer"), "lm_head"),
    (("mlp.gate$", ".gate", "router", "gate$"), "router"),
    (("vision", "visual", "multi_modal_projector", "mm_projector"), "vision"),
    (("mamba", "mixer"), "mamba"),
)


def _fp8(reader: _Reader, dtype: str) -> WeightsFormat:
    block = reader.block("weight_block_size")
    scale_bytes = 1 if reader.text("scale_fmt") == "ue8m0" else 4
    if block is None:
        rule = lambda size_in, size_out: size_in * size_out + 4  # noqa: E731 - per tensor
        shape = "one float32 scale per tensor"
        name = "fp8-tensor"
    else:
        rule = _fp8_block(block[0], block[1], scale_bytes)
        shape = f"a {'ue8m0' if scale_bytes == 1 else 'float32'} scale per {block[0]}x{block[1]}"
        name = f"fp8-block{block[0]}x{block[1]}"
    roles = BLOCK_ROLES - _skipped_roles(reader, "modules_to_not_convert")
    return WeightsFormat(name, f"float8 weights, {shape} block", "fp8", 8, dtype, roles, rule,
                         fp8_compute=True)  # fmt: skip


def _fbgemm_fp8(reader: _Reader, dtype: str) -> WeightsFormat:
    roles = BLOCK_ROLES - _skipped_roles(reader, "modules_to_not_convert")
    return WeightsFormat(
        "fbgemm-fp8", "float8 weights, float32 scale per output row", "fbgemm_fp8", 8, dtype,
        roles, lambda size_in, size_out: size_in * size_out + 4 * size_out, fp8_compute=True,
    )  # fmt: skip


def _gptq_format(reader: _Reader, dtype: str) -> WeightsFormat:
    bits = reader.int_in("bits", (2, 3, 4, 8), 4)
    group = reader.group_size()
    act_order = reader.flag("desc_act", False)
    label = (
        f"GPTQ {bits}-bit, {f'group {group}' if group else 'one group per row'}"
        f"{', act-order' if act_order else ''} (float16 scales, int32 zeros and g_idx)"
    )
    roles = (BLOCK_ROLES - {"vision"}) - _skipped_roles(reader, "modules_to_not_convert")
    return WeightsFormat(f"gptq-int{bits}-g{group or 'row'}", label, "gptq", bits, dtype, roles,
                         _gptq(bits, group))  # fmt: skip


def _awq_format(reader: _Reader, dtype: str) -> WeightsFormat:
    bits = reader.int_in("bits", (4,), reader.config.get("w_bit", 4))
    group = reader.group_size("group_size", reader.config.get("q_group_size", 128))
    zero_point = reader.flag("zero_point", True)
    label = f"AWQ {bits}-bit, group {group or 'row'}{', zero points' if zero_point else ''}"
    roles = (BLOCK_ROLES - {"vision"}) - _skipped_roles(reader, "modules_to_not_convert")
    return WeightsFormat(f"awq-int{bits}-g{group or 'row'}", label, "awq", bits, dtype, roles,
                         _awq(bits, group, zero_point))  # fmt: skip


def _bitsandbytes(reader: _Reader, dtype: str) -> WeightsFormat:
    four_bit = reader.flag("load_in_4bit", False)
    eight_bit = reader.flag("load_in_8bit", False)
    if four_bit == eight_bit:
        reader.notes.append(
            "quantization_config sets load_in_4bit and load_in_8bit to "
            f"{four_bit} and {eight_bit}; expected exactly one true"
        )
        raise _Unreadable
    roles = ALL_BUT_HEAD - _skipped_roles(reader, "llm_int8_skip_modules")
    if eight_bit:
        return WeightsFormat("bnb-int8", "bitsandbytes LLM.int8 (int8, float32 scale per row)",
                             "bitsandbytes", 8, dtype, roles, _bnb_8bit)  # fmt: skip
    kind = reader.text("bnb_4bit_quant_type", "fp4")
    if kind not in ("nf4", "fp4"):
        reader.notes.append(f"quantization_config.bnb_4bit_quant_type = {kind!r} is not nf4/fp4")
        raise _Unreadable
    double = reader.flag("bnb_4bit_use_double_quant", False)
    label = f"bitsandbytes {kind}, blocks of 64{', double quantization' if double else ''}"
    return WeightsFormat(f"bnb-{kind}{'-dq' if double else ''}", label, "bitsandbytes", 4, dtype,
                         roles, _bnb_4bit(double))  # fmt: skip


# compressed-tensors: bytes of the scale each strategy keeps, per (in, out) and group size.
_CT_SCALES = {
    "tensor": lambda size_in, size_out, group: 1,
    "channel": lambda size_in, size_out, group: size_out,
    "group": lambda size_in, size_out, group: size_out * _ceil(size_in, group),
    "tensor_group": lambda size_in, size_out, group: size_out * _ceil(size_in, group),
}


def _compressed_tensors(reader: _Reader, dtype: str) -> WeightsFormat:
    groups = reader.config.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        reader.notes.append("quantization_config.config_groups is missing or empty")
        raise _Unreadable
    name, group = next(iter(groups.items()))
    if len(groups) > 1:
        reader.notes.append(
            f"quantization_config has {len(groups)} config_groups; planned with the first "
            f"({str(name)[:40]!r}) for every quantized layer"
        )
    weights = group.get("weights") if isinstance(group, Mapping) else None
    if not isinstance(weights, Mapping):
        reader.notes.append(f"config_groups.{str(name)[:40]} has no weights scheme")
        raise _Unreadable
    inner = _Reader(weights, reader.notes, f"config_groups.{str(name)[:40]}.weights")
    bits = inner.int_in("num_bits", (4, 8), 8)
    kind = inner.text("type", "int")
    strategy = inner.text("strategy", "tensor")
    symmetric = inner.flag("symmetric", True)
    group_size = inner.group_size("group_size", 128) if strategy in ("group", "tensor_group") else 0
    storage = reader.text("format") or (group.get("format") or "").lower() or "naive-quantized"
    scale_bytes = KV_DTYPE_BITS.get(inner.text("scale_dtype") or dtype, 16) // 8
    block = inner.block("block_structure") if strategy == "block" else None
    if strategy == "block" and block is None:
        inner.notes.append(f"{inner.where}.block_structure is missing for strategy 'block'")
        raise _Unreadable
    if strategy not in (*_CT_SCALES, "block"):
        reader.notes.append(f"{inner.where}.strategy = {strategy!r} is not known")
        raise _Unreadable

    def scales(size_in, size_out):
        if strategy == "block":
            return _ceil(size_out, block[0]) * _ceil(size_in, block[1])
        return _CT_SCALES[strategy](size_in, size_out, group_size)

    act_order = inner.text("actorder") == "group"
    if storage == "pack-quantized":

        def rule(size_in, size_out):
            count = scales(size_in, size_out)
            packed = size_out * _ceil(size_in * bits, 32) * 4
            # Asymmetric: zero points packed along the output rows, one set per scale column.
            columns = max(1, count // size_out)
            zeros = 0 if symmetric else _ceil(size_out * bits, 32) * 4 * columns
            g_idx = size_in * 4 if act_order else 0
            return packed + count * scale_bytes + zeros + g_idx + 16  # + int64 weight_shape

    elif storage in ("int-quantized", "float-quantized"):

        def rule(size_in, size_out):
            zeros = 0 if symmetric else scales(size_in, size_out)
            return size_in * size_out * bits // 8 + scales(size_in, size_out) * scale_bytes + zeros
    elif storage == "nvfp4-pack-quantized":

        def rule(size_in, size_out):  # fp4 weights, float8 scale per 16, a float32 global
            return _ceil(size_in * size_out, 2) + size_out * _ceil(size_in, 16) + 4

        bits, kind = 4, "float"
    elif storage in ("naive-quantized", "dense"):
        reader.notes.append(
            f"compressed-tensors format {storage!r} stores the quantized values in {dtype}: "
            "no saving"
        )
        raise _Unreadable
    else:
        reader.notes.append(f"compressed-tensors format {storage!r} is not one keras-mha counts")
        raise _Unreadable
    ignored = _skipped_roles(reader, "ignore")
    roles = (ALL_BUT_HEAD - {"pooler", "projection"}) - ignored
    fp8 = kind == "float" and bits == 8 and isinstance(group.get("input_activations"), Mapping)
    what = f"{kind}{bits}" if kind == "int" else ("fp8" if bits == 8 else "fp4")
    detail = f"{strategy}{f' {group_size}' if group_size else ''}"
    return WeightsFormat(
        f"ct-{what}-{strategy}{group_size or ''}",
        f"compressed-tensors {storage}: {what} weights, scales per {detail}"
        f"{'' if symmetric else ', zero points'}",
        "compressed-tensors", bits, dtype, roles, rule, fp8_compute=fp8,
    )  # fmt: skip


# quant_method -> the reader of its config. One entry per format.
FORMATS: dict[str, Callable[[_Reader, str], WeightsFormat]] = {
    "fp8": _fp8,
    "fbgemm_fp8": _fbgemm_fp8,
    "gptq": _gptq_format,
    "awq": _awq_format,
    "bitsandbytes": _bitsandbytes,
    "compressed-tensors": _compressed_tensors,
}


def _config_dtype(config: Mapping, notes: list[str]) -> str | None:
    for scope in (config, config.get("text_config") or {}):
        if not isinstance(scope, Mapping):
            continue
        for key in ("dtype", "torch_dtype"):
            value = scope.get(key)
            if value is None:
                continue
            dtype = TORCH_DTYPES.get(str(value).lower())
            if dtype is None:
                notes.append(f"{key} = {str(value)[:40]!r} is not float32, bfloat16 or float16")
                continue
            return dtype
    return None


def _quantization_config(config: Mapping):
    for scope in (config, config.get("text_config") or {}):
        if isinstance(scope, Mapping) and scope.get("quantization_config") is not None:
            return scope["quantization_config"]
    return None


def checkpoint_format(config: Mapping) -> WeightsFormat:
    """The format a checkpoint's config says its weights are in (module docstring).

    Without `quantization_config` it is the config's `torch_dtype` / `dtype` (float32 when
    neither is given, as transformers loads such a checkpoint); a quantization config
    keras-mha cannot count falls back to that dtype, and `notes` says why.

    Example:
        >>> fmt = checkpoint_format({"quantization_config": {"quant_method": "fp8",
        ...     "weight_block_size": [128, 128]}, "torch_dtype": "bfloat16"})
        >>> fmt.id, fmt.unquantized_dtype, fmt.fp8_compute
        ('fp8-block128x128', 'bfloat16', True)
        >>> checkpoint_format({"quantization_config": {"quant_method": "aqlm"}}).notes[0][:48]
        "quantization_config.quant_method 'aqlm' is not o"
    """
    notes: list[str] = []
    dtype = _config_dtype(config, notes)
    quantization = _quantization_config(config)
    if quantization is None:
        if dtype is None:
            notes.append(
                f"the config names no torch_dtype: {UNNAMED_DTYPE} assumed, as transformers "
                "loads it (--weights-dtype to plan another)"
            )
        return dtype_format(dtype or UNNAMED_DTYPE, from_checkpoint=True, notes=notes)
    unquantized = dtype or ("float16" if _method(quantization) in ("gptq", "awq") else
                            DEFAULT_DTYPE)  # fmt: skip
    method = _method(quantization)
    reader_function = FORMATS.get(method) if method else None
    if not isinstance(quantization, Mapping) or reader_function is None:
        shown = method if method else str(quantization)[:40]
        notes.append(
            f"quantization_config.quant_method {shown!r} is not one of the formats keras-mha "
            f"counts ({', '.join(FORMATS)}); weights planned as {unquantized}, more than the "
            "checkpoint holds"
        )
        return dtype_format(unquantized, from_checkpoint=True, notes=notes)
    try:
        fmt = reader_function(_Reader(quantization, notes), unquantized)
    except _Unreadable:
        notes.append(f"weights planned as {unquantized}, more than the checkpoint holds")
        return dtype_format(unquantized, from_checkpoint=True, notes=notes)
    return WeightsFormat(**{**fmt.__dict__, "from_checkpoint": True, "notes": tuple(notes)})


def _method(quantization) -> str | None:
    if not isinstance(quantization, Mapping):
        return None
    method = quantization.get("quant_method")
    if method is None and (quantization.get("load_in_4bit") or quantization.get("load_in_8bit")):
        return "bitsandbytes"
    if not isinstance(method, str):
        return None
    method = method.lower()
    return "compressed-tensors" if method == "compressed_tensors" else method


__all__ = [
    "FORMATS",
    "GENERIC_DTYPES",
    "PLAIN_DTYPES",
    "WeightsFormat",
    "checkpoint_format",
    "dtype_format",
]
