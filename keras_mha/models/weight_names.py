"""Hub tensor names <-> variables of keras-mha whole models, as data, in both directions.

Each family's checkpoint layout is one `WeightNames` entry of `FAMILY_WEIGHT_NAMES`: a
list of `WeightRule`s, each tying one Hub tensor name (with `{prefix}` and `{layer}`
placeholders) to one or more model variables (dotted attribute paths from the model,
`blocks.{layer}.attention.query_kernel`) through a named `Transform`. A transform
converts in both directions, so the same table loads a checkpoint
(`Transform.to_keras`) and writes one back (`Transform.to_hub`, used by
`save_pretrained`). Shapes are never stored in the table: they come from the model's
variables, so a model whose heads were pruned exports its smaller tensors unchanged.

A rule applies when every variable it names exists in the model (biases only when the
layer has them, `lm_head` only when the embeddings are not tied); Hub tensors matching
`ignored` patterns (rotary caches, BERT's pooler) are skipped on load and not written.

Transforms (`TRANSFORMS`), torch `Linear` weights being `(out, in)`:

| name | Hub tensor | model variable(s) |
|---|---|---|
| `identity` | `x` | `x` |
| `transpose` | `(out, in)` | Dense kernel `(in, out)` |
| `to_heads` | `(H * D, F)` | `(F, H, D)` (q/k/v kernels) |
| `bias_to_heads` | `(H * D,)` | `(H, D)` |
| `from_heads` | `(F, H * D)` | `(H, D, F)` (output kernel) |
| `one_plus` | `w` | `1 + w` (Gemma 3's q/k norms; the layer multiplies by its scale) |
| `split_qkv` | `(Hq * D + 2 * Hkv * D, F)` | query, key, value kernels `(F, H, D)` |
| `split_gate_up` | `(2 * I, F)` | gate and up Dense kernels `(F, I)` |

Example:
    >>> import numpy as np
    >>> names = FAMILY_WEIGHT_NAMES["llama"]
    >>> rule = names.rule_for("model.layers.3.self_attn.q_proj.weight", prefix="model.")
    >>> rule.variables
    ('blocks.3.attention.query_kernel',)
    >>> weight = np.arange(2 * 4 * 8, dtype="float32").reshape(8, 8)  # (H * D, F)
    >>> (kernel,) = TRANSFORMS["to_heads"].to_keras(weight, [(8, 2, 4)])
    >>> kernel.shape
    (8, 2, 4)
    >>> np.array_equal(TRANSFORMS["to_heads"].to_hub([kernel]), weight)
    True
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

Shape = tuple[int, ...]


# -- transforms --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transform:
    """One conversion between a Hub tensor and model variables, both ways.

    Attributes:
        name: the key in `TRANSFORMS`.
        hub_shape: the Hub tensor's shape implied by the variables' shapes.
        to_keras: `(hub tensor, [variable shapes]) -> [variable values]`.
        to_hub: `([variable values]) -> hub tensor`.
    """

    name: str
    hub_shape: Callable[[Sequence[Shape]], Shape]
    to_keras: Callable[[np.ndarray, Sequence[Shape]], list[np.ndarray]]
    to_hub: Callable[[Sequence[np.ndarray]], np.ndarray]


def _rows(shape: Shape) -> int:
    """Rows a `(F, H, D)` head kernel or `(F, I)` Dense kernel takes in a fused `(out, in)`."""
    return int(np.prod(shape[1:]))


def _split(tensor: np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
    return np.split(tensor, np.cumsum(sizes)[:-1], axis=0)


TRANSFORMS: dict[str, Transform] = {
    t.name: t
    for t in (
        Transform(
            "identity",
            hub_shape=lambda shapes: tuple(shapes[0]),
            to_keras=lambda tensor, shapes: [tensor],
            to_hub=lambda values: values[0],
        ),
        Transform(
            "transpose",
            hub_shape=lambda shapes: tuple(reversed(shapes[0])),
            to_keras=lambda tensor, shapes: [tensor.T],
            to_hub=lambda values: values[0].T,
        ),
        Transform(
            "to_heads",
            hub_shape=lambda shapes: (_rows(shapes[0]), shapes[0][0]),
            to_keras=lambda tensor, shapes: [tensor.T.reshape(shapes[0])],
            to_hub=lambda values: values[0].reshape(values[0].shape[0], -1).T,
        ),
        Transform(
            "bias_to_heads",
            hub_shape=lambda shapes: (int(np.prod(shapes[0])),),
            to_keras=lambda tensor, shapes: [tensor.reshape(shapes[0])],
            to_hub=lambda values: values[0].reshape(-1),
        ),
        Transform(
            "from_heads",
            hub_shape=lambda shapes: (shapes[0][-1], int(np.prod(shapes[0][:-1]))),
            to_keras=lambda tensor, shapes: [tensor.T.reshape(shapes[0])],
            to_hub=lambda values: values[0].reshape(-1, values[0].shape[-1]).T,
        ),
        Transform(
            "one_plus",
            hub_shape=lambda shapes: tuple(shapes[0]),
            to_keras=lambda tensor, shapes: [tensor.astype(np.float32) + 1.0],
            to_hub=lambda values: values[0].astype(np.float32) - 1.0,
        ),
        Transform(
            "split_qkv",
            hub_shape=lambda shapes: (sum(_rows(s) for s in shapes), shapes[0][0]),
            to_keras=lambda tensor, shapes: [
                part.T.reshape(shape)
                for part, shape in zip(
                    _split(tensor, [_rows(s) for s in shapes]), shapes, strict=True
                )
            ],
            to_hub=lambda values: np.concatenate(
                [v.reshape(v.shape[0], -1).T for v in values], axis=0
            ),
        ),
        Transform(
            "split_gate_up",
            hub_shape=lambda shapes: (sum(s[1] for s in shapes), shapes[0][0]),
            to_keras=lambda tensor, shapes: [
                part.T for part in _split(tensor, [s[1] for s in shapes])
            ],
            to_hub=lambda values: np.concatenate([v.T for v in values], axis=0),
        ),
    )
}


# -- rules ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightRule:
    """One Hub tensor and the model variable(s) it becomes.

    Attributes:
        hub: the Hub name with `{prefix}` (the model's stem, e.g. `model.`) and, for
            per-layer tensors, `{layer}` placeholders.
        variables: dotted attribute paths from the model to each variable, with `{layer}`.
        transform: a key of `TRANSFORMS`.
    """

    hub: str
    variables: tuple[str, ...]
    transform: str = "identity"

    @property
    def per_layer(self) -> bool:
        return "{layer}" in self.hub

    def hub_name(self, prefix: str, layer: int | None = None) -> str:
        return self.hub.format(prefix=prefix, layer=layer)

    def variable_paths(self, layer: int | None = None) -> tuple[str, ...]:
        return tuple(v.format(layer=layer) for v in self.variables)

    def pattern(self, prefix: str) -> re.Pattern:
        """A regex matching this rule's Hub names, capturing the layer index."""
        text = re.escape(self.hub.replace("{prefix}", "\0P").replace("{layer}", "\0L"))
        text = text.replace(re.escape("\0P"), re.escape(prefix)).replace(
            re.escape("\0L"), r"(?P<layer>\d+)"
        )
        return re.compile(text)


@dataclass(frozen=True)
class WeightNames:
    """A family's checkpoint layout.

    Attributes:
        naming: the key in `FAMILY_WEIGHT_NAMES`.
        prefixes: candidate stems tried in order; the first for which `anchor` exists wins.
        anchor: a Hub name (with `{prefix}`) present in every checkpoint of the layout.
        rules: the tensors.
        ignored: regexes of Hub names that carry nothing the model needs.
    """

    naming: str
    prefixes: tuple[str, ...]
    anchor: str
    rules: tuple[WeightRule, ...]
    ignored: tuple[str, ...] = ()

    def rule_for(self, hub_name: str, *, prefix: str) -> BoundRule | None:
        """The rule (bound to its layer) that `hub_name` belongs to, or None."""
        for rule in self.rules:
            match = rule.pattern(prefix).fullmatch(hub_name)
            if match:
                layer = int(match.group("layer")) if rule.per_layer else None
                return BoundRule(rule, hub_name, rule.variable_paths(layer), layer)
        return None

    def is_ignored(self, hub_name: str) -> bool:
        return any(re.search(pattern, hub_name) for pattern in self.ignored)

    def find_prefix(self, keys) -> str | None:
        keys = set(keys)
        for prefix in self.prefixes:
            if self.anchor.format(prefix=prefix) in keys:
                return prefix
        return None


@dataclass(frozen=True)
class BoundRule:
    """A rule for one concrete Hub tensor (layer filled in)."""

    rule: WeightRule
    hub_name: str
    variables: tuple[str, ...]
    layer: int | None

    @property
    def transform(self) -> Transform:
        return TRANSFORMS[self.rule.transform]


def resolve(model, path: str):
    """The object at a dotted path from `model` (`blocks.3.attention.query_kernel`), or None.

    Example:
        >>> resolve(model, "blocks.0.attention.query_kernel")  # doctest: +SKIP
        <Variable path=decoder/block_0/attention/query_kernel, shape=(64, 4, 16), ...>
    """
    current = model
    for part in path.split("."):
        if part.isdigit():
            index = int(part)
            if not isinstance(current, (list, tuple)) or index >= len(current):
                return None
            current = current[index]
        else:
            current = getattr(current, part, None)
        if current is None:
            return None
    return current


def bound_rules(model, names: WeightNames, prefix: str, num_layers: int) -> list[BoundRule]:
    """Every rule that applies to `model` (all its variables exist), one per Hub tensor.

    Example:
        >>> [r.hub_name for r in bound_rules(model, FAMILY_WEIGHT_NAMES["llama"], "model.", 2)][:2]
        ... # doctest: +SKIP
        ['model.embed_tokens.weight', 'model.norm.weight']
    """
    bound = []
    for rule in names.rules:
        layers = range(num_layers) if rule.per_layer else [None]
        for layer in layers:
            paths = rule.variable_paths(layer)
            if all(resolve(model, path) is not None for path in paths):
                bound.append(BoundRule(rule, rule.hub_name(prefix, layer), paths, layer))
    return bound


def hub_tensors(model):
    """Yield `(hub name, NumPy array)` for every tensor of `model`'s Hub checkpoint.

    The inverse of loading: each rule's `to_hub` applied to the model's current
    variable values (pruned shapes included). `model` is a `DecoderModel` or
    `EncoderModel` (it records its naming and prefix).

    Example:
        >>> dict(hub_tensors(model))["model.norm.weight"].shape  # doctest: +SKIP
        (64,)
    """
    from keras import ops

    names = FAMILY_WEIGHT_NAMES[model.weight_naming]
    for bound in bound_rules(model, names, model.hub_prefix, len(model.blocks)):
        values = [
            np.asarray(ops.convert_to_numpy(resolve(model, path))) for path in bound.variables
        ]
        yield bound.hub_name, bound.transform.to_hub(values)


# -- the per-family tables -----------------------------------------------------------------------


def _attention(hub_block: str, *, fused_qkv: bool, one_plus_qk_norm: bool = False):
    """Rules of a Llama-style `self_attn` block (q/k/v/o projections, biases, q/k norms)."""
    rules = []
    if fused_qkv:
        rules.append(
            WeightRule(
                f"{hub_block}.qkv_proj.weight",
                tuple(f"blocks.{{layer}}.attention.{p}_kernel" for p in ("query", "key", "value")),
                "split_qkv",
            )
        )
    else:
        for hub, ours in (("q", "query"), ("k", "key"), ("v", "value")):
            rules.append(
                WeightRule(
                    f"{hub_block}.{hub}_proj.weight",
                    (f"blocks.{{layer}}.attention.{ours}_kernel",),
                    "to_heads",
                )
            )
            rules.append(
                WeightRule(
                    f"{hub_block}.{hub}_proj.bias",
                    (f"blocks.{{layer}}.attention.{ours}_bias",),
                    "bias_to_heads",
                )
            )
    rules += [
        WeightRule(
            f"{hub_block}.o_proj.weight", ("blocks.{layer}.attention.output_kernel",), "from_heads"
        ),
        WeightRule(f"{hub_block}.o_proj.bias", ("blocks.{layer}.attention.output_bias",)),
    ]
    norm = "one_plus" if one_plus_qk_norm else "identity"
    rules += [
        WeightRule(
            f"{hub_block}.q_norm.weight", ("blocks.{layer}.attention.query_norm_scale",), norm
        ),
        WeightRule(
            f"{hub_block}.k_norm.weight", ("blocks.{layer}.attention.key_norm_scale",), norm
        ),
    ]
    return rules


def _gated_mlp(hub_block: str, *, fused_gate_up: bool):
    if fused_gate_up:
        rules = [
            WeightRule(
                f"{hub_block}.gate_up_proj.weight",
                ("blocks.{layer}.gate_proj.kernel", "blocks.{layer}.up_proj.kernel"),
                "split_gate_up",
            )
        ]
    else:
        rules = [
            WeightRule(
                f"{hub_block}.{name}.weight", (f"blocks.{{layer}}.{name}.kernel",), "transpose"
            )
            for name in ("gate_proj", "up_proj")
        ]
        rules += [
            WeightRule(f"{hub_block}.{name}.bias", (f"blocks.{{layer}}.{name}.bias",))
            for name in ("gate_proj", "up_proj")
        ]
    return rules + [
        WeightRule(
            f"{hub_block}.down_proj.weight", ("blocks.{layer}.down_proj.kernel",), "transpose"
        ),
        WeightRule(f"{hub_block}.down_proj.bias", ("blocks.{layer}.down_proj.bias",)),
    ]


def _decoder_names(
    naming: str,
    *,
    norms: dict[str, str],
    fused: bool = False,
    one_plus_qk_norm: bool = False,
) -> WeightNames:
    layer = "{prefix}layers.{layer}"
    rules = [
        WeightRule("{prefix}embed_tokens.weight", ("token_embedding.embeddings",)),
        WeightRule("{prefix}norm.weight", ("final_norm.scale",)),
        WeightRule("lm_head.weight", ("lm_head.kernel",), "transpose"),
        *_attention(f"{layer}.self_attn", fused_qkv=fused, one_plus_qk_norm=one_plus_qk_norm),
        *_gated_mlp(f"{layer}.mlp", fused_gate_up=fused),
        *(
            WeightRule(f"{layer}.{hub}.weight", (f"blocks.{{layer}}.{ours}.scale",))
            for hub, ours in norms.items()
        ),
    ]
    return WeightNames(
        naming=naming,
        # Gemma 3 multimodal checkpoints keep the language model under model.language_model.
        prefixes=("model.", "model.language_model.", "language_model.model.", ""),
        anchor="{prefix}embed_tokens.weight",
        rules=tuple(rules),
        ignored=(r"rotary_emb\.inv_freq$",),
    )


_PRE_NORMS = {"input_layernorm": "attention_norm", "post_attention_layernorm": "mlp_norm"}
# Gemma 2/3 normalise each sublayer's input and output; note the shifted meaning of
# `post_attention_layernorm` (Llama's pre-MLP norm, Gemma 2's post-attention norm).
_SANDWICH_NORMS = {
    "input_layernorm": "attention_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "mlp_norm",
    "post_feedforward_layernorm": "post_mlp_norm",
}


def _bert_names() -> WeightNames:
    layer = "{prefix}encoder.layer.{layer}"
    rules = [
        WeightRule("{prefix}embeddings.word_embeddings.weight", ("token_embedding.embeddings",)),
        WeightRule(
            "{prefix}embeddings.position_embeddings.weight", ("position_embedding.embeddings",)
        ),
        WeightRule(
            "{prefix}embeddings.token_type_embeddings.weight",
            ("token_type_embedding.embeddings",),
        ),
        WeightRule("{prefix}embeddings.LayerNorm.weight", ("embeddings_norm.gamma",)),
        WeightRule("{prefix}embeddings.LayerNorm.bias", ("embeddings_norm.beta",)),
    ]
    for hub, ours in (("query", "query"), ("key", "key"), ("value", "value")):
        rules += [
            WeightRule(
                f"{layer}.attention.self.{hub}.weight",
                (f"blocks.{{layer}}.attention.{ours}_kernel",),
                "to_heads",
            ),
            WeightRule(
                f"{layer}.attention.self.{hub}.bias",
                (f"blocks.{{layer}}.attention.{ours}_bias",),
                "bias_to_heads",
            ),
        ]
    rules += [
        WeightRule(
            f"{layer}.attention.output.dense.weight",
            ("blocks.{layer}.attention.output_kernel",),
            "from_heads",
        ),
        WeightRule(
            f"{layer}.attention.output.dense.bias", ("blocks.{layer}.attention.output_bias",)
        ),
        WeightRule(
            f"{layer}.attention.output.LayerNorm.weight", ("blocks.{layer}.attention_norm.gamma",)
        ),
        WeightRule(
            f"{layer}.attention.output.LayerNorm.bias", ("blocks.{layer}.attention_norm.beta",)
        ),
        WeightRule(
            f"{layer}.intermediate.dense.weight",
            ("blocks.{layer}.intermediate.kernel",),
            "transpose",
        ),
        WeightRule(f"{layer}.intermediate.dense.bias", ("blocks.{layer}.intermediate.bias",)),
        WeightRule(
            f"{layer}.output.dense.weight", ("blocks.{layer}.output_dense.kernel",), "transpose"
        ),
        WeightRule(f"{layer}.output.dense.bias", ("blocks.{layer}.output_dense.bias",)),
        WeightRule(f"{layer}.output.LayerNorm.weight", ("blocks.{layer}.output_norm.gamma",)),
        WeightRule(f"{layer}.output.LayerNorm.bias", ("blocks.{layer}.output_norm.beta",)),
    ]
    return WeightNames(
        naming="bert",
        prefixes=("", "bert."),
        anchor="{prefix}embeddings.word_embeddings.weight",
        rules=tuple(rules),
        # The pooler and task heads (BertForMaskedLM's cls.*) are not part of the encoder.
        ignored=(r"(^|\.)pooler\.", r"^cls\.", r"embeddings\.position_ids$"),
    )


FAMILY_WEIGHT_NAMES: dict[str, WeightNames] = {
    "llama": _decoder_names("llama", norms=_PRE_NORMS),
    "phi3": _decoder_names("phi3", norms=_PRE_NORMS, fused=True),
    "gemma2": _decoder_names("gemma2", norms=_SANDWICH_NORMS),
    "gemma3": _decoder_names("gemma3", norms=_SANDWICH_NORMS, one_plus_qk_norm=True),
    "bert": _bert_names(),
}

__all__ = [
    "FAMILY_WEIGHT_NAMES",
    "TRANSFORMS",
    "BoundRule",
    "Transform",
    "WeightNames",
    "WeightRule",
    "bound_rules",
    "hub_tensors",
    "resolve",
]
