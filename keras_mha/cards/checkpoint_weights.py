"""Fill a rebuilt attention layer with the weights of a local safetensors checkpoint.

A Hugging Face checkpoint stores each attention block under its family's names and
in torch's layouts. This module finds the block of one layer from the tensor keys
present and converts each tensor to the variables of
`keras_mha.layers.GroupedQueryAttention` (`query_kernel (F, H, D)`,
`key_kernel`/`value_kernel (F, Hkv, D)`, biases `(H, D)`/`(Hkv, D)`,
`output_kernel (H, D, F_out)`, `output_bias (F_out,)`, `query_norm_scale`/
`key_norm_scale (D,)`).

Namings understood (any prefix before them, e.g. `model.`, `bert.`, `transformer.`,
`model.language_model.`):

- `q_proj`: `layers.{i}.self_attn.{q,k,v}_proj` + `o_proj` / `out_proj` / `dense`, and
  `q_norm` / `k_norm` when present (Llama, Mistral, Mixtral, Qwen2/3, Gemma 1/2/3,
  Phi-2, OPT, BART with `encoder_attn` for cross-attention, Jamba);
- `qkv_proj`: `layers.{i}.self_attn.qkv_proj` (rows q, k, v) + `o_proj` (Phi-3);
- `bert`: `encoder.layer.{i}.attention.self.{query,key,value}` +
  `attention.output.dense` (BERT, MiniLM);
- `c_attn`: `h.{i}.attn.c_attn` + `c_proj`, GPT-2's Conv1D `(in, out)` or
  GPTBigCode's Linear `(out, in)` (GPT-2, StarCoder);
- `query_key_value`: `layers.{i}.attention.query_key_value` (q, k, v per head) +
  `dense` (GPT-NeoX, Pythia);
- `falcon_qkv`: `h.{i}.self_attention.query_key_value` (per KV group: its query heads,
  then its key and value) + `dense` (Falcon 7B/40B/180B, Falcon 2).

torch's `Linear` keeps its weight as `(out, in)`; GPT-2's `Conv1D` as `(in, out)`.
Gemma 3 normalises with `1 + weight`; the layer's norm multiplies by its scale, so
1 is added when loading a Gemma 3 checkpoint.

Only NumPy is used, no torch; tensors are read by `keras_mha.models.safetensors_reader`.

Example:
    >>> from keras_mha.cards.checkpoint_weights import SafetensorsCheckpoint
    >>> checkpoint = SafetensorsCheckpoint("path/to/all-MiniLM-L6-v2")  # doctest: +SKIP
    >>> checkpoint.get("encoder.layer.0.attention.self.query.weight").shape  # doctest: +SKIP
    (384, 384)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from keras_mha.errors import CheckpointError
from keras_mha.models.safetensors_reader import SafetensorsCheckpoint

CONFIG_FILE_NAME = "config.json"
ATTENTION_PARTS = ("self", "cross", "encoder")

# Gemma 3 stores its RMS-norm weights as `w` and multiplies by `1 + w`.
_ONE_PLUS_WEIGHT_NORM_FAMILIES = frozenset({"gemma3_text"})


# -- finding one layer's attention tensors ----------------------------------------------------


@dataclass(frozen=True)
class AttentionTensorNames:
    """The checkpoint keys of one attention block, and how they are laid out.

    Attributes:
        naming: "q_proj", "qkv_proj", "bert", "c_attn", "query_key_value" or "falcon_qkv"
            (module docstring).
        query, key, value: keys of the separate projections' weights (None when fused).
        fused: key of the fused q/k/v weight (None when separate).
        output: key of the output projection's weight.
        query_norm, key_norm: keys of the q/k norm weights, None when absent.

    Example:
        >>> names = find_attention_tensors(
        ...     ["h.0.attn.c_attn.weight", "h.0.attn.c_proj.weight"], layer_index=0)
        >>> names.naming, names.fused, names.output
        ('c_attn', 'h.0.attn.c_attn.weight', 'h.0.attn.c_proj.weight')
    """

    naming: str
    output: str
    query: str | None = None
    key: str | None = None
    value: str | None = None
    fused: str | None = None
    query_norm: str | None = None
    key_norm: str | None = None


def _bias_key(weight_key: str) -> str:
    return weight_key[: -len("weight")] + "bias"


def _prefixes(keys: Iterable[str], pattern: str) -> list[str]:
    compiled = re.compile(pattern)
    return sorted({m.group("prefix") for key in keys if (m := compiled.fullmatch(key))})


_VISION_WORDS = ("vision", "visual", "image")


def _pick_prefix(prefixes: list[str], attention: str, layer_index: int, where: str) -> str:
    """One block prefix when several stacks share a naming.

    The language model is wanted, not a vision tower (multimodal checkpoints keep a
    SigLIP encoder with the same `layers.{i}.self_attn` names); of an encoder-decoder,
    the decoder for "self" and "cross", the encoder for "encoder".
    """
    if len(prefixes) == 1:
        return prefixes[0]
    text = [p for p in prefixes if not any(word in p for word in _VISION_WORDS)]
    if attention == "encoder":
        candidates = [p for p in text if "encoder." in p]
    else:
        candidates = [p for p in text if "decoder." in p] or [
            p for p in text if "encoder." not in p
        ]
    if len(candidates) == 1:
        return candidates[0]
    raise CheckpointError(
        f"{where} holds several attention blocks for layer_index={layer_index} "
        f"(attention={attention!r}): {prefixes}; cannot tell which one is meant"
    )


def find_attention_tensors(
    keys: Iterable[str], layer_index: int, *, attention: str = "self", where: str = "checkpoint"
) -> AttentionTensorNames:
    """Find the tensors of one layer's attention block from the keys present.

    Args:
        keys: the checkpoint's tensor keys.
        layer_index: the layer (index within its stack).
        attention: "self" (the main stack: the decoder of an encoder-decoder),
            "cross" (a decoder layer's cross-attention) or "encoder" (an encoder layer's
            self-attention).
        where: the checkpoint's file, for messages.

    Raises:
        CheckpointError: no known naming matches, or the match is ambiguous.

    Example:
        >>> keys = ["bert.encoder.layer.3.attention.self.query.weight"]
        >>> find_attention_tensors(keys, 3).query
        'bert.encoder.layer.3.attention.self.query.weight'
    """
    if attention not in ATTENTION_PARTS:
        raise ValueError(f"attention={attention!r} must be one of {list(ATTENTION_PARTS)}")
    keys = list(keys)
    key_set = set(keys)
    index = int(layer_index)
    block = "encoder_attn" if attention == "cross" else "self_attn"

    prefixes = _prefixes(keys, rf"(?P<prefix>(?:.*\.)?layers\.{index}\.{block}\.)q_proj\.weight")
    if prefixes:
        prefix = _pick_prefix(prefixes, attention, index, where)
        outputs = [f"{prefix}{name}.weight" for name in ("o_proj", "out_proj", "dense")]
        output = next((key for key in outputs if key in key_set), outputs[0])
        norms = [f"{prefix}{name}.weight" for name in ("q_norm", "k_norm")]
        return AttentionTensorNames(
            naming="q_proj",
            query=f"{prefix}q_proj.weight",
            key=f"{prefix}k_proj.weight",
            value=f"{prefix}v_proj.weight",
            output=output,
            query_norm=norms[0] if norms[0] in key_set else None,
            key_norm=norms[1] if norms[1] in key_set else None,
        )
    if attention == "self":
        patterns = (
            ("qkv_proj", rf"(?P<prefix>(?:.*\.)?layers\.{index}\.self_attn\.)qkv_proj\.weight"),
            (
                "bert",
                rf"(?P<prefix>(?:.*\.)?encoder\.layer\.{index}\.attention\.)self\.query\.weight",
            ),
            ("c_attn", rf"(?P<prefix>(?:.*\.)?h\.{index}\.attn\.)c_attn\.weight"),
            (
                "query_key_value",
                rf"(?P<prefix>(?:.*\.)?layers\.{index}\.attention\.)query_key_value\.weight",
            ),
        )
        for naming, pattern in patterns:
            prefixes = _prefixes(keys, pattern)
            if not prefixes:
                continue
            prefix = _pick_prefix(prefixes, attention, index, where)
            if naming == "qkv_proj":
                return AttentionTensorNames(
                    naming, fused=f"{prefix}qkv_proj.weight", output=f"{prefix}o_proj.weight"
                )
            if naming == "bert":
                return AttentionTensorNames(
                    naming,
                    query=f"{prefix}self.query.weight",
                    key=f"{prefix}self.key.weight",
                    value=f"{prefix}self.value.weight",
                    output=f"{prefix}output.dense.weight",
                )
            if naming == "c_attn":
                return AttentionTensorNames(
                    naming, fused=f"{prefix}c_attn.weight", output=f"{prefix}c_proj.weight"
                )
            return AttentionTensorNames(
                naming, fused=f"{prefix}query_key_value.weight", output=f"{prefix}dense.weight"
            )
    if attention == "self":
        prefixes = _prefixes(
            keys, rf"(?P<prefix>(?:.*\.)?h\.{index}\.self_attention\.)query_key_value\.weight"
        )
        if prefixes:
            prefix = _pick_prefix(prefixes, attention, index, where)
            return AttentionTensorNames(
                "falcon_qkv",
                fused=f"{prefix}query_key_value.weight",
                output=f"{prefix}dense.weight",
            )
    sample = [key for key in keys if re.search(rf"(^|\.){index}\.", key)][:6]
    raise CheckpointError(
        f"{where}: no attention tensors of layer_index={index} (attention={attention!r}) in a "
        f"known naming (Llama-style {block}.q_proj, Phi-3 qkv_proj, BERT "
        f"attention.self.query, GPT-2 attn.c_attn, GPT-NeoX attention.query_key_value); "
        f"keys of that layer include {sample}"
    )


# -- converting to the layer's variables ---------------------------------------------------------


def _from_linear(weight: np.ndarray, heads: int, head_dim: int) -> np.ndarray:
    """torch Linear weight `(heads * head_dim, in)` -> kernel `(in, heads, head_dim)`."""
    return weight.T.reshape(weight.shape[1], heads, head_dim)


def _split_rows(weight: np.ndarray, sizes: tuple[int, ...]) -> list[np.ndarray]:
    return np.split(weight, np.cumsum(sizes)[:-1], axis=0)


class _Loader:
    """Reads, converts, checks and assigns the tensors of one attention block."""

    def __init__(self, layer, checkpoint: SafetensorsCheckpoint, names, family_of_model):
        self.layer = layer
        self.checkpoint = checkpoint
        self.names = names
        # Called only when q/k norms are loaded: reading config.json is needed for nothing else.
        self.family_of_model = family_of_model
        self.heads = layer.num_heads
        self.kv_heads = layer.num_key_value_heads
        self.head_dim = layer.head_dim
        self.assigned: dict[str, str] = {}
        self.values: dict[str, np.ndarray] = {}

    def read(self, key: str) -> np.ndarray:
        return np.asarray(self.checkpoint.get(key))

    def has(self, key: str) -> bool:
        return key in self.checkpoint

    def put(self, variable_name: str, value: np.ndarray, source: str) -> None:
        variable = getattr(self.layer, variable_name, None)
        if variable is None:
            raise CheckpointError(
                f"{self.checkpoint.describe()}: {source!r} has no place in the layer "
                f"{self.layer.name!r}: it has no {variable_name} (check use_bias / "
                f"use_output_bias / use_qk_norm of the layer against the checkpoint)"
            )
        expected = tuple(variable.shape)
        if tuple(value.shape) != expected:
            raise CheckpointError(
                f"{self.checkpoint.describe()}: {source!r} gives {variable_name} the shape "
                f"{tuple(value.shape)}, but the layer {self.layer.name!r} expects {expected} "
                f"(num_heads={self.heads}, num_key_value_heads={self.kv_heads}, "
                f"head_dim={self.head_dim})"
            )
        self.values[variable_name] = value
        self.assigned[variable_name] = source

    def require_bias(self, variable_name: str, weight_key: str) -> np.ndarray | None:
        """The bias beside `weight_key`; an error when the layer and checkpoint disagree."""
        bias_key = _bias_key(weight_key)
        present = self.has(bias_key)
        expected = getattr(self.layer, variable_name, None) is not None
        if expected and not present:
            raise CheckpointError(
                f"tensor {bias_key!r} not found in {self.checkpoint.describe()}, but the layer "
                f"{self.layer.name!r} has a {variable_name}"
            )
        if present and not expected:
            raise CheckpointError(
                f"{self.checkpoint.describe()} holds {bias_key!r}, but the layer "
                f"{self.layer.name!r} has no {variable_name}; build it with the bias"
            )
        return self.read(bias_key) if present else None

    # Separate q/k/v projections (Llama-style and BERT-style).
    def separate(self) -> None:
        for variable, key, heads in (
            ("query", self.names.query, self.heads),
            ("key", self.names.key, self.kv_heads),
            ("value", self.names.value, self.kv_heads),
        ):
            weight = self.read(key)
            self.check_rank(key, weight, 2)
            expected = (heads * self.head_dim, self.layer._query_features)
            if weight.shape != expected:
                raise CheckpointError(
                    f"{self.checkpoint.describe()}: {key!r} has shape {tuple(weight.shape)}, but "
                    f"the layer {self.layer.name!r} expects {expected} for its {variable}_kernel "
                    f"(num_heads={self.heads}, num_key_value_heads={self.kv_heads}, "
                    f"head_dim={self.head_dim}, {self.layer._query_features} input features)"
                )
            self.put(f"{variable}_kernel", _from_linear(weight, heads, self.head_dim), key)
            bias = self.require_bias(f"{variable}_bias", key)
            if bias is not None:
                self.put(f"{variable}_bias", bias.reshape(heads, self.head_dim), _bias_key(key))
        self.output_projection(transposed=True)
        self.qk_norms()

    # One fused q/k/v weight.
    def fused(self) -> None:
        key = self.names.fused
        weight = self.read(key)
        self.check_rank(key, weight, 2)
        features = self.layer._query_features
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        total = q_size + 2 * kv_size
        naming = self.names.naming
        if self.layer.use_qk_norm:
            raise CheckpointError(
                f"{self.checkpoint.describe()}: the {naming} naming has no q/k norms, but the "
                f"layer {self.layer.name!r} was built with use_qk_norm=True"
            )
        if naming == "c_attn" and weight.shape == (features, total) and total != features:
            weight = weight.T  # GPT-2's Conv1D keeps (in, out)
            conv1d = True
        else:
            conv1d = False
        if weight.shape != (total, features):
            raise CheckpointError(
                f"{self.checkpoint.describe()}: {key!r} has shape {tuple(weight.shape)}, "
                f"expected ({total}, {features}) for num_heads={self.heads}, "
                f"num_key_value_heads={self.kv_heads}, head_dim={self.head_dim}"
            )
        bias = self.require_bias("query_bias", key)
        # GPT-NeoX and GPTBigCode (without multi_query) interleave q, k, v per head.
        interleaved = naming == "query_key_value" or (
            naming == "c_attn" and not conv1d and self.kv_heads == self.heads
        )
        if naming == "falcon_qkv":
            parts, bias_parts = self._falcon_groups(weight, bias)
        elif interleaved:
            if self.kv_heads != self.heads:
                raise CheckpointError(
                    f"{key!r} interleaves q, k, v per head, which needs num_key_value_heads == "
                    f"num_heads; the layer has {self.kv_heads} and {self.heads}"
                )
            per_head = weight.reshape(self.heads, 3, self.head_dim, features)
            parts = [per_head[:, i].reshape(q_size, features) for i in range(3)]
            bias_parts = (
                [b.reshape(q_size) for b in np.moveaxis(bias.reshape(self.heads, 3, -1), 1, 0)]
                if bias is not None
                else [None] * 3
            )
        else:
            parts = _split_rows(weight, (q_size, kv_size, kv_size))
            bias_parts = (
                _split_rows(bias, (q_size, kv_size, kv_size)) if bias is not None else [None] * 3
            )
        for variable, part, part_bias, heads in zip(
            ("query", "key", "value"),
            parts,
            bias_parts,
            (self.heads, self.kv_heads, self.kv_heads),
            strict=True,
        ):
            self.put(f"{variable}_kernel", _from_linear(part, heads, self.head_dim), key)
            if part_bias is not None:
                self.put(
                    f"{variable}_bias", part_bias.reshape(heads, self.head_dim), _bias_key(key)
                )
        self.output_projection(transposed=not conv1d)

    def _falcon_groups(self, weight: np.ndarray, bias: np.ndarray | None):
        """Falcon's rows: per KV group, its G query heads, then its key, then its value.

        That one layout covers all three Falcon variants: `new_decoder_architecture`
        (grouped, Falcon-40B/180B), `multi_query` (one group: all queries, k, v; Falcon-7B)
        and plain multi-head (one query per group: q, k, v interleaved per head).
        """
        groups, size = self.kv_heads, self.heads // self.kv_heads
        grouped = weight.reshape(groups, size + 2, self.head_dim, -1)
        features = grouped.shape[-1]
        parts = [
            grouped[:, :size].reshape(self.heads * self.head_dim, features),
            grouped[:, size].reshape(groups * self.head_dim, features),
            grouped[:, size + 1].reshape(groups * self.head_dim, features),
        ]
        bias_parts = [None] * 3
        if bias is not None:
            grouped_bias = bias.reshape(groups, size + 2, self.head_dim)
            bias_parts = [
                grouped_bias[:, :size].reshape(-1),
                grouped_bias[:, size].reshape(-1),
                grouped_bias[:, size + 1].reshape(-1),
            ]
        return parts, bias_parts

    def output_projection(self, transposed: bool) -> None:
        key = self.names.output
        weight = self.read(key)
        self.check_rank(key, weight, 2)
        # (out, heads * head_dim) for Linear, (heads * head_dim, out) for Conv1D.
        weight = weight.T if transposed else weight
        if weight.shape[0] != self.heads * self.head_dim:
            raise CheckpointError(
                f"{self.checkpoint.describe()}: {key!r} has shape {tuple(self.read(key).shape)}; "
                f"its input side should be num_heads * head_dim = {self.heads * self.head_dim}"
            )
        self.put("output_kernel", weight.reshape(self.heads, self.head_dim, weight.shape[1]), key)
        bias = self.require_bias("output_bias", key)
        if bias is not None:
            self.put("output_bias", bias, _bias_key(key))

    def qk_norms(self) -> None:
        names = (
            ("query_norm_scale", self.names.query_norm),
            ("key_norm_scale", self.names.key_norm),
        )
        if not self.layer.use_qk_norm:
            present = [key for _, key in names if key is not None]
            if present:
                raise CheckpointError(
                    f"{self.checkpoint.describe()} holds q/k norms {present}, but the layer "
                    f"{self.layer.name!r} was built with use_qk_norm=False"
                )
            return
        for variable, key in names:
            if key is None:
                expected = self.names.query.rsplit(".", 2)[0] + (
                    ".q_norm.weight" if variable.startswith("query") else ".k_norm.weight"
                )
                raise CheckpointError(
                    f"tensor {expected!r} not found in {self.checkpoint.describe()}, but the "
                    f"layer {self.layer.name!r} has use_qk_norm=True"
                )
            family = self.family_of_model()
            if family is None:
                raise CheckpointError(
                    f"{self.checkpoint.describe()}: cannot tell whether {key!r} is a plain RMS "
                    f"weight or Gemma's (1 + weight) without the model's config; pass spec= or "
                    f"put config.json beside the checkpoint"
                )
            scale = self.read(key).astype(np.float32)
            if family in _ONE_PLUS_WEIGHT_NORM_FAMILIES:
                scale = scale + 1.0
            self.put(variable, scale, key)

    def check_rank(self, key: str, tensor: np.ndarray, rank: int) -> None:
        if tensor.ndim != rank:
            raise CheckpointError(
                f"{self.checkpoint.describe()}: {key!r} has shape {tuple(tensor.shape)}, "
                f"expected a rank-{rank} weight"
            )

    def assign(self) -> None:
        # keras casts, so a bfloat16 layer works although NumPy has no bfloat16.
        from keras import ops

        for variable_name, value in self.values.items():
            variable = getattr(self.layer, variable_name)
            variable.assign(ops.cast(value, variable.dtype))


def _family_of_checkpoint(directory: Path, spec) -> str | None:
    if spec is not None:
        return spec.family
    config_path = directory / CONFIG_FILE_NAME
    if not config_path.is_file():
        return None
    from keras_mha.cards.spec import from_config

    return from_config(json.loads(config_path.read_text())).family


def load_attention_weights(
    layer, checkpoint_dir, layer_index: int, *, spec=None, attention: str = "self"
) -> dict[str, str]:
    """Fill `layer` with the attention weights of layer `layer_index` of a checkpoint.

    The naming (Llama-style, BERT, GPT-2, Phi-3, GPT-NeoX; see the module docstring) is
    detected from the keys present. Every tensor is checked against the layer's
    variable shapes before any is assigned, so a failed load leaves the layer unchanged.
    The layer's `head_gates` are left as they are.

    Args:
        layer: a built `keras_mha.layers.GroupedQueryAttention` (or MHA / MQA), e.g.
            from `keras_mha.cards.build_attention`.
        checkpoint_dir: directory with `model.safetensors` or
            `model.safetensors.index.json` and its shards (or one `.safetensors` file).
        layer_index: the layer within its stack.
        spec: the model's `ModelSpec`; when None, `config.json` beside the checkpoint is
            read if present. Needed only to know how q/k norms are parametrised.
        attention: "self", "cross" or "encoder" (as in `build_attention`).

    Returns:
        A dict from each assigned variable name to the checkpoint key it came from.

    Raises:
        CheckpointError: no checkpoint, no known naming for that layer, a missing tensor
            (the message names the key and the file), or a shape the layer does not have.

    Example:
        >>> from keras_mha.cards import build_attention, load_attention_weights
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
    checkpoint = SafetensorsCheckpoint(checkpoint_dir)
    names = find_attention_tensors(
        checkpoint.keys(), layer_index, attention=attention, where=checkpoint.describe()
    )
    loader = _Loader(
        layer, checkpoint, names, lambda: _family_of_checkpoint(checkpoint.directory, spec)
    )
    if names.fused is not None:
        loader.fused()
    else:
        loader.separate()
    loader.assign()
    return dict(loader.assigned)


__all__ = [
    "AttentionTensorNames",
    "CheckpointError",
    "SafetensorsCheckpoint",
    "find_attention_tensors",
    "load_attention_weights",
]
