"""`save_pretrained`: a keras-mha model back to a Hub checkpoint that transformers loads.

The tensors come from the model's variables through the same name table that loads
them (the family's `weights` in `keras_mha.families`, each rule's `to_hub` transform in
`keras_mha.models.weight_names`), so a model whose heads were removed writes its
smaller tensors with the family's names and layout. The config is the source's
`config.json` with the head counts of the model now (under the family's own key
spellings, e.g. GPT-2's `n_head`), and the tokenizer (and sentence-transformers) files
are copied from the source.

How a pruned model's head count reaches the config depends on the family
(`Family.head_size_in_config`, checked against transformers 5.24):

- `"explicit"` (Mistral, Qwen2/3, Gemma 1, Phi-3): the config states `head_dim`, so
  `num_attention_heads` / `num_key_value_heads` shrink and `head_dim` is written
  explicitly; the checkpoint is genuinely smaller.
- `"explicit_divisor"` (Llama, Gemma 2/3): the same, but transformers' config also
  requires `hidden_size % num_attention_heads == 0`. When the kept heads do not
  divide `hidden_size` (e.g. 24 of Llama-3.2-1B's 32 heads), zero heads are added up
  to the nearest count that does (within each KV group, so the KV heads and the KV
  cache stay as pruned); a warning says how many. Targets that keep a divisor of
  `hidden_size` (e.g. 50%) export with no zero head.
- `"derived"` (BERT, RoBERTa, GPT-2, GPT-NeoX): transformers computes the head size as
  `hidden_size / num_attention_heads`, so fewer heads cannot be stated. The
  checkpoint keeps the original head count and the removed heads are written as zero
  rows/columns of the q/k/v/output projections. Outputs are equal, the file is not
  smaller, and a `UserWarning` says so; the `.keras` model stays the smaller one.

A zero head adds exactly nothing: its output-projection rows are zero (and so are
its q/k/v weights and biases). Heads are independent and their order within a KV
group does not matter, so the kept heads come first and the zero heads after them.

Hub configs state one head count for all layers: a model whose layers keep
different numbers of heads is refused with an `ExportError` (prune with
`heads_to_prune(..., scope="per_layer")` or `keras-mha prune --uniform`).

Example:
    >>> from keras_mha.models import from_pretrained, save_pretrained
    >>> from keras_mha.pruning import prune_heads
    >>> model = from_pretrained("path/to/llama")  # doctest: +SKIP
    >>> prune_heads(model, heads={path: [0, 1] for path in find_attention_layers(model)})
    ... # doctest: +SKIP
    >>> save_pretrained(model, "llama-pruned").num_attention_heads  # doctest: +SKIP
    30
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import warnings
from pathlib import Path

import numpy as np

from keras_mha.errors import CheckpointError, ExportError, PathError
from keras_mha.families import family_for, unique_families
from keras_mha.layers.quantization import refuse_quantized
from keras_mha.models.export_files import (
    DEFAULT_MAX_SHARD_SIZE,
    KERAS_TO_SAFETENSORS_DTYPE,
    SAFETENSORS_TO_TORCH_DTYPE,
    LazyTensor,
    check_output_folder,
    output_folder,
    parse_size,
    write_safetensors,
)
from keras_mha.models.local_files import file_in_folder
from keras_mha.planning.config_values import shown

# Files copied from the source folder when present: the tokenizer, generation
# defaults, and sentence-transformers' description of the pipeline (pooling etc.).
COPIED_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
)
COPIED_FOLDERS = ("1_Pooling", "2_Normalize")

# Variables of an attention layer indexed by query head / by KV head, and the axis
# (as in layers/head_surgery).
_QUERY_HEAD_AXIS = {"query_kernel": 1, "query_bias": 0, "output_kernel": 0}
_KV_HEAD_AXIS = {"key_kernel": 1, "value_kernel": 1, "key_bias": 0, "value_bias": 0}


@dataclasses.dataclass(frozen=True)
class ExportSummary:
    """What `save_pretrained` wrote.

    Attributes:
        path: the output folder.
        files: file names written (config, safetensors, index, copied tokenizer files).
        bytes: total size of the safetensors files.
        model_type: the config's `model_type`.
        num_attention_heads, num_key_value_heads, head_dim: as written in `config.json`.
        heads_zeroed: zero heads per layer written because the family's config cannot
            state the kept count (see the module docstring); 0 when none.
        kept_heads: query heads per layer the model really has.
        parameters: elements of the safetensors tensors (what transformers counts).
        dtype: the tensors' dtype.
    """

    path: str
    files: list
    bytes: int
    model_type: str
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    heads_zeroed: int
    kept_heads: int
    parameters: int
    dtype: str

    def as_dict(self):
        return dataclasses.asdict(self)


# -- what the model knows about its source ---------------------------------------------------


def source_config(model) -> dict:
    """The source checkpoint's `config.json` as a dict (a copy)."""
    raw = getattr(model, "hub_config", None)
    if not isinstance(raw, dict) or not getattr(model, "family", None):
        raise ExportError(
            f"`model` ({type(model).__name__} {getattr(model, 'name', '')!r}) was not built by "
            "keras_mha.models.from_pretrained / build_model: it carries no Hub config to "
            "export; expected a DecoderModel or EncoderModel",
            key="model",
        )
    # A JSON round trip, not deepcopy: Keras wraps the attribute in tracking containers
    # that are slow to deep-copy, and config.json holds only JSON values anyway.
    return json.loads(json.dumps(raw))


def source_directory(model) -> Path | None:
    """The local folder the model was loaded from (the HF cache snapshot for Hub ids)."""
    directory = getattr(model, "source_directory", None)
    return None if directory is None else Path(directory)


def model_kind(model) -> str:
    """`"decoder"` (causal LM, logits) or `"encoder"` (last hidden state)."""
    from keras_mha.models.encoder import EncoderModel

    return "encoder" if isinstance(model, EncoderModel) else "decoder"


def model_type(model) -> str:
    """The source config's `model_type`."""
    return str(source_config(model).get("model_type", getattr(model, "family", "")))


def vocabulary_size(model) -> int:
    return int(model.vocab_size)


def compute_dtype(model) -> str:
    return str(getattr(model, "compute_dtype", None) or "float32")


def load_for_pruning(source, *, dtype=None, revision=None, token=None, **hub):
    """`from_pretrained`, remembering the local folder the files came from.

    For a Hub id the tokenizer files are fetched into the HF cache beside the weights;
    `hub` (`endpoint`, `offline`, `timeout`) goes to every Hub exchange.
    """
    from keras_mha.models import from_pretrained

    model = from_pretrained(source, dtype=dtype, revision=revision, token=token, **hub)
    local = Path(str(source)).expanduser()
    if local.is_dir():
        model.source_directory = local
    else:
        # The commit from_pretrained read (its snapshot folder's name), so the tokenizer
        # files match the weights even if the branch moved meanwhile.
        snapshot = Path(str(getattr(model, "source_directory", "") or "")).name
        commit = snapshot if re.fullmatch(r"[0-9a-f]{40}", snapshot) else revision
        model.source_directory = _fetch_hub_files(str(source), commit, token, hub)
    return model


def _fetch_hub_files(model_id, revision, token, hub=None):
    """The HF-cache snapshot folder of `model_id`, with its tokenizer files fetched (through
    `hub_file`, which checks every name the endpoint sends before writing)."""
    from keras_mha.hub.files import hub_file

    folder = None
    for name in ("config.json", *COPIED_FILES):
        options = {key: value for key, value in (hub or {}).items() if value is not None}
        path = hub_file(model_id, name, revision=revision, token=token, **options)
        if path is not None:
            folder = path.parent
    return folder


# -- head counts ------------------------------------------------------------------------------


def _attention_layers(model):
    from keras_mha.pruning import find_attention_layers

    return find_attention_layers(model)


def head_counts(model) -> dict[str, tuple[int, int, int]]:
    """`{layer path: (num_heads, num_key_value_heads, head_dim)}`."""
    return {
        path: (layer.num_heads, layer.num_key_value_heads, layer.head_dim)
        for path, layer in _attention_layers(model).items()
    }


def is_uniform(model) -> bool:
    """Whether every attention layer has the same head counts (what a Hub config can state).

    Example:
        >>> is_uniform(model)  # doctest: +SKIP
        True
    """
    return len(set(head_counts(model).values())) <= 1


def check_uniform(model) -> tuple[int, int, int]:
    """The one `(num_heads, num_key_value_heads, head_dim)` of the model, or ExportError."""
    counts = head_counts(model)
    distinct = sorted(set(counts.values()))
    if len(distinct) == 1:
        return distinct[0]
    examples = {}
    for path, value in counts.items():
        examples.setdefault(value, path)
    shown = "; ".join(
        f"{path!r} keeps {h} query / {kv} KV heads" for (h, kv, _), path in examples.items()
    )
    raise ExportError(
        f"cannot write a Hub checkpoint: its config has one num_attention_heads and "
        f"num_key_value_heads for all layers, but the model's layers differ ({shown}); prune "
        "the same number of heads in every layer: heads_to_prune(model, scores, target, "
        "scope='per_layer') or `keras-mha prune --uniform`, or keep this model as .keras",
        key="model",
    )


def grouped_query_refusal(model) -> str | None:
    """Why `model`'s Hub config cannot state its KV heads, or None when it can.

    A config states grouped-query attention only if its family reads
    `num_key_value_heads` (`keras_mha.families`: Llama, Mistral, Qwen, Gemma, Phi-3,
    ...); BERT, RoBERTa, GPT-2 and GPT-NeoX derive one KV head per query head. Models whose
    layers keep as many KV heads as query heads need no such key.

    Example:
        >>> grouped_query_refusal(converted_minilm)  # doctest: +SKIP
        "model_type='bert': transformers' config for it has no num_key_value_heads ..."
    """
    counts = set(head_counts(model).values())
    if all(heads == kv_heads for heads, kv_heads, _ in counts):
        return None
    family = family_for(model.family)
    if family is not None and "num_key_value_heads" in family.keys:
        return None
    heads, kv_heads, _ = sorted(counts)[0]
    name = str(source_config(model).get("model_type", model.family))
    return (
        f"model_type={name!r}: transformers' config for it has no num_key_value_heads (every "
        f"query head has its own key/value head), so {heads} query heads sharing {kv_heads} "
        f"KV head{'s' if kv_heads > 1 else ''} cannot be written as a Hub checkpoint; keep the "
        "converted model as .keras (model.save(...))"
    )


# -- tensors ----------------------------------------------------------------------------------


def _variable_numpy(variable) -> np.ndarray:
    from keras import ops

    value = ops.convert_to_numpy(variable)
    return np.asarray(value if value.dtype.kind != "V" else value.astype("float32"))


@dataclasses.dataclass(frozen=True)
class HeadPadding:
    """Zero heads added on export: each KV group grows from `group_size` to
    `padded_group_size` query heads, then zero groups are appended up to
    `padded_kv_heads` KV heads.

    Example:
        >>> plan = HeadPadding(kv_heads=4, group_size=1, padded_group_size=1, padded_kv_heads=8)
        >>> plan.padded_heads, plan.zero_heads
        (8, 4)
    """

    kv_heads: int
    group_size: int
    padded_group_size: int
    padded_kv_heads: int

    @property
    def heads(self):
        return self.kv_heads * self.group_size

    @property
    def padded_heads(self):
        return self.padded_kv_heads * self.padded_group_size

    @property
    def zero_heads(self):
        return self.padded_heads - self.heads

    def pad_query_axis(self, value, axis):
        shape = list(value.shape)
        grouped = value.reshape(shape[:axis] + [self.kv_heads, self.group_size] + shape[axis + 1 :])
        widths = [(0, 0)] * grouped.ndim
        widths[axis] = (0, self.padded_kv_heads - self.kv_heads)
        widths[axis + 1] = (0, self.padded_group_size - self.group_size)
        grouped = np.pad(grouped, widths)
        return grouped.reshape(shape[:axis] + [self.padded_heads] + shape[axis + 1 :])

    def pad_kv_axis(self, value, axis):
        widths = [(0, 0)] * value.ndim
        widths[axis] = (0, self.padded_kv_heads - self.kv_heads)
        return np.pad(value, widths)


def head_padding(layout, *, heads, kv_heads, head_dim, hidden_size) -> HeadPadding | None:
    """The zero heads a family's config needs for this head layout (None: none needed).

    Example:
        >>> head_padding("explicit_divisor", heads=24, kv_heads=8, head_dim=64, hidden_size=2048)
        HeadPadding(kv_heads=8, group_size=3, padded_group_size=4, padded_kv_heads=8)
        >>> head_padding("explicit", heads=24, kv_heads=8, head_dim=64, hidden_size=2048) is None
        True
    """
    group = heads // kv_heads
    if layout == "explicit" or (layout == "explicit_divisor" and hidden_size % heads == 0):
        return None
    if layout == "derived":
        original = hidden_size // head_dim
        if original * head_dim != hidden_size or heads != kv_heads:
            raise ExportError(
                f"the config derives the head size from hidden_size / num_attention_heads, and "
                f"head_dim={head_dim} with {heads} query / {kv_heads} KV heads cannot be padded "
                f"back to hidden_size={hidden_size}",
                key="head_dim",
                value=head_dim,
            )
        return None if heads == original else HeadPadding(kv_heads, 1, 1, original)
    # Grow each group (keeps the KV heads, so the KV cache stays pruned), else add groups.
    for padded_group in range(group, hidden_size + 1):
        if hidden_size % (kv_heads * padded_group) == 0:
            return HeadPadding(kv_heads, group, padded_group, kv_heads)
    for padded_kv in range(kv_heads, hidden_size + 1):
        if hidden_size % (padded_kv * group) == 0:
            return HeadPadding(kv_heads, group, group, padded_kv)
    raise ExportError(  # pragma: no cover - padded_kv * group = hidden_size always divides
        f"no head count of at least {heads} divides hidden_size={hidden_size}", key="heads"
    )


def _hub_tensors(model, *, padding=None, dtype_name):
    """`{hub name: LazyTensor}` for every tensor of the checkpoint, in table order."""
    from keras_mha.layers import ATTENTION_LAYER_CLASSES
    from keras_mha.models.weight_names import (
        TRANSFORMS,
        bound_rules,
        model_weight_names,
        resolve,
    )

    names = model_weight_names(model)
    tensors = {}
    for bound in bound_rules(model, names, model.hub_prefix, len(model.blocks)):
        sources = []
        for path in bound.variables:
            variable = resolve(model, path)
            owner_path, _, attribute = path.rpartition(".")
            owner = resolve(model, owner_path) if owner_path else model
            pad = None
            shape = list(variable.shape)
            if padding is not None and isinstance(owner, ATTENTION_LAYER_CLASSES):
                if attribute in _QUERY_HEAD_AXIS:
                    axis = _QUERY_HEAD_AXIS[attribute]
                    pad = lambda value, axis=axis: padding.pad_query_axis(value, axis)  # noqa: E731
                    shape[axis] = padding.padded_heads
                elif attribute in _KV_HEAD_AXIS:
                    axis = _KV_HEAD_AXIS[attribute]
                    pad = lambda value, axis=axis: padding.pad_kv_axis(value, axis)  # noqa: E731
                    shape[axis] = padding.padded_kv_heads
            sources.append((variable, pad, tuple(shape)))

        transform = TRANSFORMS[bound.transform]

        def produce(sources=sources, transform=transform):
            values = []
            for variable, pad, _ in sources:
                value = _variable_numpy(variable)
                values.append(value if pad is None else pad(value))
            return transform.to_hub(values)

        shape = transform.hub_shape([shape for _, _, shape in sources])
        variable_dtype = str(sources[0][0].dtype)
        stored = (
            dtype_name if "float" in variable_dtype else KERAS_TO_SAFETENSORS_DTYPE[variable_dtype]
        )
        tensors[bound.hub_name] = LazyTensor(tuple(int(d) for d in shape), stored, produce)
    return tensors


def _source_extras(model, written, dtype_name):
    """Tensors of the source checkpoint the model does not hold but that do not depend on
    the heads (BERT's pooler, a masked-LM head): copied as they are, so transformers finds
    every weight it had. Buffers (rotary caches, position ids) are not weights: left out."""
    from keras_mha.models.safetensors_reader import SafetensorsCheckpoint
    from keras_mha.models.weight_names import model_weight_names

    directory = source_directory(model)
    if directory is None or not directory.is_dir():  # The source moved or is gone.
        return {}
    checkpoint = SafetensorsCheckpoint(directory)
    names = model_weight_names(model)
    extras = {}
    for key in checkpoint.keys():
        if key in written or not names.is_ignored(key) or names.is_buffer(key):
            continue
        stored = checkpoint.dtype_of(key)
        shape = tuple(int(d) for d in checkpoint.shape_of(key))
        floating = stored in ("F64", "F32", "F16", "BF16")
        if not floating and stored not in ("I64", "I32", "BOOL"):
            continue
        extras[key] = LazyTensor(
            shape, dtype_name if floating else stored, lambda key=key: checkpoint.get(key)
        )
    return extras


def _exported_dtype(model, dtype):
    from keras_mha.pruning import find_attention_layers

    name = dtype
    if name is None:
        layer = next(iter(find_attention_layers(model).values()))
        name = str(layer.query_kernel.dtype)
    if name not in ("float32", "float16", "bfloat16"):
        raise ExportError(
            f"dtype={dtype!r} is not a dtype to export; expected 'float32', 'bfloat16' or "
            "'float16'",
            key="dtype",
            value=dtype,
        )
    return name


def _spelling(target: dict, family, field: str) -> str:
    """The key `target` states `field` under, else the family's first spelling of it."""
    spellings = family.keys.get(field) or (field,)
    return next((key for key in spellings if key in target), spellings[0])


def _config_with_heads(config, family, *, heads, kv_heads, head_dim, layout, dtype):
    """The source config with the model's head counts (in `text_config` when nested),
    under the family's own spellings (GPT-2's `n_head`)."""
    target = config
    if isinstance(config.get("text_config"), dict) and not any(
        key in config for key in family.keys["num_attention_heads"]
    ):
        target = config["text_config"]
    target[_spelling(target, family, "num_attention_heads")] = int(heads)
    kv_key = _spelling(target, family, "num_key_value_heads")
    if layout != "derived":
        target[kv_key] = int(kv_heads)
        target[_spelling(target, family, "head_dim")] = int(head_dim)
    elif kv_key in target:
        target[kv_key] = int(kv_heads)
    # transformers 5 reads `dtype`, earlier versions `torch_dtype`: state both.
    config["dtype"] = dtype
    config["torch_dtype"] = dtype
    return config


def save_pretrained(
    model,
    out_dir,
    *,
    max_shard_size=DEFAULT_MAX_SHARD_SIZE,
    dtype=None,
    overwrite=False,
    copy_tokenizer=True,
    tokenizer_from=None,
) -> ExportSummary:
    """Write `model` as a Hub checkpoint folder (config.json, safetensors, tokenizer).

    Everything is written into a hidden folder beside `out_dir` and moved into place
    when complete: an error leaves `out_dir` as it was. `out_dir` is checked before any
    work: it may not be, contain or lie inside the folder the model was loaded from (or
    `tokenizer_from`), symlinks resolved, so the source is never overwritten.

    Args:
        model: a model from `keras_mha.models.from_pretrained`, pruned or not.
        out_dir: the folder to create (a str or `os.PathLike`). It must be new or empty,
            or hold a checkpoint and `overwrite=True`.
        max_shard_size: above this size the tensors are split into
            `model-0000i-of-0000n.safetensors` files with `model.safetensors.index.json`
            (an int in bytes or a string such as `"5GB"`).
        dtype: `"float32"`, `"bfloat16"` or `"float16"`; default the model's weights'.
        overwrite: write into a folder that holds a checkpoint: the files this export
            writes replace theirs (and an earlier export's weight files go, as in
            transformers' `save_pretrained`); every other file stays.
        copy_tokenizer: copy the tokenizer (and sentence-transformers) files of the
            source folder when it had them.
        tokenizer_from: the folder to copy them from; default the folder
            `from_pretrained` read (`model.source_directory`).

    Returns:
        An `ExportSummary`.

    Raises:
        ExportError: layers with different head counts, a family keras-mha cannot
            state pruned heads for, or fewer KV heads than query heads in a family whose
            config cannot say so (`grouped_query_refusal`: BERT).
        PathError: `out_dir` is not a path, not writable, not empty (without
            `overwrite`), or is, contains or lies inside the source folder.
        CheckpointError: a tokenizer file of the source is a link leading out of it.

    Warns:
        UserWarning: the family derives the head size (BERT), so the removed heads are
            written as zeros and the file is not smaller.

    Example:
        >>> summary = save_pretrained(model, "pruned")  # doctest: +SKIP
        >>> transformers.AutoModelForCausalLM.from_pretrained("pruned")  # doctest: +SKIP
    """
    source = _tokenizer_source(model, tokenizer_from)
    protected = (source_directory(model), source)
    check_output_folder(out_dir, overwrite=overwrite, source=protected, argument="out_dir")
    if copy_tokenizer and source is not None and source.is_dir():
        source_files(source)  # a file leading out of the source is refused before any work
    config = source_config(model)
    for layer in model._flatten_layers():  # Keras's walk over every nested layer
        refuse_quantized(layer, "save_pretrained (float safetensors)", ExportError)
    heads, kv_heads, head_dim = check_uniform(model)
    refusal = grouped_query_refusal(model)
    if refusal is not None:
        raise ExportError(refusal, key="num_key_value_heads", value=kv_heads)
    family = family_for(model.family)
    model_type_name = str(config.get("model_type", model.family))
    layout = None if family is None else family.head_size_in_config
    if layout is None:
        exported = sorted(f.name for f in unique_families() if f.head_size_in_config)
        raise ExportError(
            f"model_type={model_type_name!r}: keras-mha does not know how this family's config "
            f"states head counts; families it exports: {exported}",
            key="model_type",
            value=model_type_name,
        )
    dtype_name = _exported_dtype(model, dtype)
    stored_dtype = KERAS_TO_SAFETENSORS_DTYPE[dtype_name]
    parse_size(max_shard_size)
    try:
        padding = head_padding(
            layout, heads=heads, kv_heads=kv_heads, head_dim=head_dim, hidden_size=model.hidden_size
        )
    except ExportError as error:
        raise ExportError(f"model_type={model_type_name!r}: {error}", key=error.key) from None
    written_heads = heads if padding is None else padding.padded_heads
    written_kv_heads = kv_heads if padding is None else padding.padded_kv_heads
    if padding is not None:
        reason = (
            "transformers derives the head size from hidden_size / num_attention_heads"
            if layout == "derived"
            else f"transformers requires hidden_size ({model.hidden_size}) to be a multiple of "
            f"num_attention_heads for {model_type_name}"
        )
        warnings.warn(
            f"{model_type_name}: {reason}, so the checkpoint states {written_heads} heads per "
            f"layer, {padding.zero_heads} of them with zeroed weights: the outputs are the "
            f"pruned model's but the file is bigger than needed (the .keras model is the "
            "smallest)",
            UserWarning,
            stacklevel=2,
        )
    config = _config_with_heads(
        config,
        family,
        heads=written_heads,
        kv_heads=written_kv_heads,
        head_dim=head_dim,
        layout=layout,
        dtype=SAFETENSORS_TO_TORCH_DTYPE[stored_dtype],
    )
    tensors = _hub_tensors(model, padding=padding, dtype_name=stored_dtype)
    tensors.update(_source_extras(model, set(tensors), stored_dtype))
    with output_folder(
        out_dir, overwrite=overwrite, source=protected, argument="out_dir"
    ) as staging:
        (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        files = ["config.json", *write_safetensors(tensors, staging, max_shard_size)]
        if copy_tokenizer and source is not None and source.is_dir():
            files += _copy_source_files(source, staging)
    out = Path(out_dir)
    return ExportSummary(
        path=str(out),
        files=files,
        bytes=sum((out / name).stat().st_size for name in files if name.endswith(".safetensors")),
        model_type=model_type_name,
        num_attention_heads=int(written_heads),
        num_key_value_heads=int(written_kv_heads),
        head_dim=int(head_dim),
        heads_zeroed=0 if padding is None else padding.zero_heads,
        kept_heads=int(heads),
        parameters=int(sum(int(np.prod(t.shape)) for t in tensors.values())),
        dtype=SAFETENSORS_TO_TORCH_DTYPE[stored_dtype],
    )


def save_keras(model, out_dir, *, overwrite=False, argument="--out") -> dict:
    """Write `model` as `out_dir/model.keras` (for models no Hub config can describe), with
    the same folder rules as `save_pretrained`: staged beside `out_dir`, moved into place
    when complete, never into the folder the model was loaded from.

    Returns:
        `{"format": "keras", "path", "files", "bytes"}` for a report.

    Example:
        >>> save_keras(model, "pruned-uneven")["files"]  # doctest: +SKIP
        ['model.keras']
    """
    source = source_directory(model)
    with output_folder(out_dir, overwrite=overwrite, source=source, argument=argument) as staging:
        model.save(staging / "model.keras")
    out = Path(out_dir)
    return {
        "format": "keras",
        "path": str(out),
        "files": ["model.keras"],
        "bytes": (out / "model.keras").stat().st_size,
    }


def _tokenizer_source(model, tokenizer_from) -> Path | None:
    """The folder the tokenizer files are copied from (checked to be a folder)."""
    if tokenizer_from is None:
        return source_directory(model)
    if not isinstance(tokenizer_from, (str, os.PathLike)) or not Path(tokenizer_from).is_dir():
        raise PathError(
            f"tokenizer_from={shown(tokenizer_from)} is not a folder; expected the folder "
            "holding tokenizer.json (or None for the folder the model was loaded from)",
            value=tokenizer_from,
        )
    return Path(tokenizer_from)


def source_files(source) -> dict[str, Path]:
    """The tokenizer and sentence-transformers files `save_pretrained` copies from `source`:
    `{name in the export: resolved file}` (names under a copied folder hold a `/`).

    Only regular files inside `source` qualify (`local_files.file_in_folder`): a symlink
    leading elsewhere is refused rather than copied into a checkpoint that may be
    published. Cheap (no file is read), so it runs before any work.

    Raises:
        CheckpointError: a file or folder of the list that leads out of `source`.

    Example:
        >>> sorted(source_files("path/to/all-MiniLM-L6-v2"))  # doctest: +SKIP
        ['1_Pooling/config.json', 'modules.json', 'tokenizer.json', 'vocab.txt', ...]
    """
    source = Path(source)
    files = {}
    for name in COPIED_FILES:
        found = file_in_folder(source, name)
        if found is not None:
            files[name] = found
    for name in COPIED_FOLDERS:
        folder = source / name
        if folder.is_dir():
            for relative in _folder_files(source, folder):
                inside = str(Path(name, relative))
                files[inside] = file_in_folder(source, inside)
    return files


def _copy_source_files(source: Path, staging: Path) -> list[str]:
    """Copy `source_files(source)` into `staging`; the names listed as in `ExportSummary`."""
    copied = []
    for name, found in source_files(source).items():
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(found, staging / name)
        listed = name if "/" not in name else name.split("/")[0] + "/"
        if listed not in copied:
            copied.append(listed)
    return copied


def _folder_files(source: Path, folder: Path) -> list[Path]:
    """The files under `folder` (relative to it). A folder that is a link is refused; each
    file is checked by `file_in_folder` when copied."""
    _refuse_linked_folder(source, folder)
    files = []
    for root, folders, names in os.walk(folder):
        for name in folders:
            _refuse_linked_folder(source, Path(root, name))
        files += [Path(root, name).relative_to(folder) for name in names]
    return sorted(files)


def _refuse_linked_folder(source: Path, folder: Path) -> None:
    if os.path.islink(folder):
        raise CheckpointError(
            f"{str(folder)!r} is a link to a folder; keras-mha copies only the plain folders "
            f"of the checkpoint {str(source)!r} (pass copy_tokenizer=False to skip them)",
            path=str(folder),
        )
