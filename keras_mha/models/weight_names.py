"""Hub tensors <-> variables of keras-mha models: the transforms and the binding, in NumPy.

Each family's checkpoint layout is data in its family module (`Family.weights`, a
`keras_mha.families._weights.WeightNames` table of `WeightRule`s, each naming a
transform). This module is the model side of those tables: `TRANSFORMS` holds each
named transform in both directions (`to_keras` loads a checkpoint, `to_hub` writes one
back for `save_pretrained`), `bound_rules` ties a table to a model's variables, and
`hub_tensors` yields a model's tensors under their Hub names. Shapes come from the
model's variables, so a model whose heads were pruned exports its smaller tensors.

A rule applies when every variable it names exists in the model (biases only when the
layer has them, `lm_head` only when the embeddings are not tied). The transforms and
their layouts are listed in `keras_mha.families._weights`; torch `Linear` weights are
`(out, in)`, GPT-2's `Conv1D` weights `(in, out)`.

Example:
    >>> import numpy as np
    >>> weight = np.arange(2 * 4 * 8, dtype="float32").reshape(8, 8)  # (H * D, F)
    >>> (kernel,) = TRANSFORMS["to_heads"].to_keras(weight, [(8, 2, 4)])
    >>> kernel.shape
    (8, 2, 4)
    >>> np.array_equal(TRANSFORMS["to_heads"].to_hub([kernel]), weight)
    True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from keras_mha.families import family_for
from keras_mha.families._weights import (
    TRANSFORM_NAMES,
    BoundRule,
    WeightNames,
    WeightRule,
)

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


def _split(tensor: np.ndarray, sizes: Sequence[int], axis: int = 0) -> list[np.ndarray]:
    return np.split(tensor, np.cumsum(sizes)[:-1], axis=axis)


def _qkv_from_rows(tensor: np.ndarray, shapes: Sequence[Shape]) -> list[np.ndarray]:
    """Rows q, k, v of a fused `(out, in)` weight -> `(F, H, D)` kernels."""
    parts = _split(tensor, [_rows(s) for s in shapes])
    return [part.T.reshape(shape) for part, shape in zip(parts, shapes, strict=True)]


def _qkv_to_rows(values: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate([v.reshape(v.shape[0], -1).T for v in values], axis=0)


def _groups(shapes: Sequence[Shape]) -> tuple[int, int, int]:
    """(KV heads, query heads per KV head, head size) of q/k/v variable shapes."""
    query, key = shapes[0], shapes[1]
    heads, kv_heads, head_dim = query[-2], key[-2], query[-1]
    return kv_heads, heads // kv_heads, head_dim


def _qkv_from_groups(tensor: np.ndarray, shapes: Sequence[Shape]) -> list[np.ndarray]:
    """Per KV head its G query heads, its key, its value (rows, or a bias) -> q, k, v.

    One layout covers GPT-NeoX (G = 1: q, k, v per head), Falcon's three variants and
    GPTBigCode (multi-query: one group holding every query head).
    """
    kv_heads, group, head_dim = _groups(shapes)
    grouped = tensor.reshape(kv_heads, group + 2, head_dim, -1)
    features = grouped.shape[-1]
    parts = (grouped[:, :group], grouped[:, group : group + 1], grouped[:, group + 1 :])
    return [
        part.reshape(-1, features).T.reshape(shape) if len(shape) == 3 else part.reshape(shape)
        for part, shape in zip(parts, shapes, strict=True)
    ]


def _qkv_to_groups(values: Sequence[np.ndarray]) -> np.ndarray:
    query, key, value = values
    biases = query.ndim == 2
    kv_heads, head_dim = key.shape[-2], key.shape[-1]
    group = query.shape[-2] // kv_heads
    # To (KV heads, members, head size, features); a bias has one feature.
    columns = [v[..., None] if biases else np.moveaxis(v, 0, -1) for v in values]
    features = columns[0].shape[-1]
    stacked = np.concatenate(
        [
            columns[0].reshape(kv_heads, group, head_dim, features),
            columns[1].reshape(kv_heads, 1, head_dim, features),
            columns[2].reshape(kv_heads, 1, head_dim, features),
        ],
        axis=1,
    )
    return stacked.reshape(-1) if biases else stacked.reshape(-1, features)


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
            "conv1d_from_heads",
            hub_shape=lambda shapes: (int(np.prod(shapes[0][:-1])), shapes[0][-1]),
            to_keras=lambda tensor, shapes: [tensor.reshape(shapes[0])],
            to_hub=lambda values: values[0].reshape(-1, values[0].shape[-1]),
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
            to_keras=_qkv_from_rows,
            to_hub=_qkv_to_rows,
        ),
        Transform(
            "split_qkv_columns",
            hub_shape=lambda shapes: (shapes[0][0], sum(_rows(s) for s in shapes)),
            to_keras=lambda tensor, shapes: _qkv_from_rows(tensor.T, shapes),
            to_hub=lambda values: _qkv_to_rows(values).T,
        ),
        Transform(
            "split_qkv_bias",
            hub_shape=lambda shapes: (sum(int(np.prod(s)) for s in shapes),),
            to_keras=lambda tensor, shapes: [
                part.reshape(shape)
                for part, shape in zip(
                    _split(tensor, [int(np.prod(s)) for s in shapes]), shapes, strict=True
                )
            ],
            to_hub=lambda values: np.concatenate([v.reshape(-1) for v in values]),
        ),
        Transform(
            "split_qkv_per_group",
            hub_shape=lambda shapes: (sum(_rows(s) for s in shapes), shapes[0][0]),
            to_keras=_qkv_from_groups,
            to_hub=_qkv_to_groups,
        ),
        Transform(
            "split_qkv_bias_per_group",
            hub_shape=lambda shapes: (sum(int(np.prod(s)) for s in shapes),),
            to_keras=_qkv_from_groups,
            to_hub=_qkv_to_groups,
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
assert set(TRANSFORMS) == set(TRANSFORM_NAMES), "a named transform has no implementation"


# -- binding a table to a model ------------------------------------------------------------------


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


def bound_rules(
    model, names: WeightNames, prefix: str, num_layers: int, lookup=resolve
) -> list[BoundRule]:
    """Every rule that applies to `model` (all its variables exist), one per Hub tensor.

    `lookup(model, path)` finds a variable (default `resolve`; loading passes
    `quantized_loading.load_target`, which also finds the float variables of layers built
    quantized).

    Example:
        >>> from keras_mha.families import family_for
        >>> rules = bound_rules(model, family_for("llama").weights, "model.", 2)
        ... # doctest: +SKIP
        >>> [rule.hub_name for rule in rules][:2]  # doctest: +SKIP
        ['model.layers.0.self_attn.q_proj.weight', 'model.layers.1.self_attn.q_proj.weight']
    """
    bound = []
    for rule in names.rules:
        layers = range(num_layers) if rule.per_layer else [None]
        for layer in layers:
            paths = rule.variable_paths(layer)
            if all(lookup(model, path) is not None for path in paths):
                bound.append(BoundRule(rule, rule.hub_name(prefix, layer), paths, layer))
    return bound


def model_weight_names(model) -> WeightNames:
    """The tensor-name table of a `DecoderModel` / `EncoderModel`'s family.

    Example:
        >>> model_weight_names(model).anchor  # doctest: +SKIP
        '{prefix}embed_tokens.weight'
    """
    family = family_for(getattr(model, "family", None) or "")
    if family is None or family.weights is None:
        raise ValueError(
            f"{type(model).__name__} {getattr(model, 'name', '')!r} has family="
            f"{getattr(model, 'family', None)!r}: no checkpoint tensor names are known for it "
            f"(build it with keras_mha.models.build_model or from_pretrained)"
        )
    return family.weights


def hub_tensors(model):
    """Yield `(hub name, NumPy array)` for every tensor of `model`'s Hub checkpoint.

    The inverse of loading: each rule's `to_hub` applied to the model's current
    variable values (pruned shapes included). `model` is a `DecoderModel` or
    `EncoderModel` (it records its family and its checkpoint's name stem).

    Example:
        >>> dict(hub_tensors(model))["model.norm.weight"].shape  # doctest: +SKIP
        (64,)
    """
    from keras import ops

    names = model_weight_names(model)
    for bound in bound_rules(model, names, model.hub_prefix, len(model.blocks)):
        values = [
            np.asarray(ops.convert_to_numpy(resolve(model, path))) for path in bound.variables
        ]
        yield bound.hub_name, TRANSFORMS[bound.transform].to_hub(values)


__all__ = [
    "TRANSFORMS",
    "BoundRule",
    "Transform",
    "WeightNames",
    "WeightRule",
    "bound_rules",
    "hub_tensors",
    "model_weight_names",
    "resolve",
]
