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

Only NumPy is used, no torch; tensors are read by `keras_mha.models.safetensors_reader`.

Example:
    >>> from keras_mha.models import build_attention, load_attention_weights
    >>> layer = build_attention(spec, layer_index=0)  # doctest: +SKIP
    >>> load_attention_weights(layer, "path/to/all-MiniLM-L6-v2", 0)["query_kernel"]
    ... # doctest: +SKIP
    'encoder.layer.0.attention.self.query.weight'
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from keras_mha.errors import CheckpointError
from keras_mha.families import family_for, unique_families
from keras_mha.families._weights import WeightNames
from keras_mha.models.safetensors_reader import SafetensorsCheckpoint
from keras_mha.models.weight_names import TRANSFORMS

CONFIG_FILE_NAME = "config.json"
ATTENTION_PARTS = ("self", "cross", "encoder")
# The model variables of each attention part in the family tables.
ATTENTION_STEMS = {
    "self": "blocks.{layer}.attention.",
    "cross": "blocks.{layer}.cross_attention.",
    "encoder": "encoder_blocks.{layer}.attention.",
}


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
    from keras_mha.planning.spec import from_config

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
        >>> from keras_mha.planning.spec import from_config
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
    "attention_tensors",
    "checkpoint_weight_names",
    "load_attention_weights",
]
