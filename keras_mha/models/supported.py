"""What `keras_mha.models` builds: a spec's family and features, checked before building.

A family is built when its module gives `blocks` (`keras_mha.families`); its
`ModelSpec` then says the rest (norm type, MLP kind, positions, residual form, tying),
and each of those must be one the blocks implement (`BUILT_FEATURES`). Anything else is
refused with an `UnsupportedModelError` that names what is missing.

Example:
    >>> from keras_mha.planning.spec import from_config
    >>> spec = from_config({"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2,
    ...                     "vocab_size": 100, "n_positions": 32})
    >>> built_family(spec).blocks.kind, activation_name(spec, built_family(spec).blocks)
    ('decoder', 'gelu_new')
"""

from __future__ import annotations

from keras_mha.errors import UnsupportedModelError
from keras_mha.families import Blocks, Family, family_for, unique_families
from keras_mha.planning.spec import RECORD_OF_FIELD

# Hugging Face activation names -> (keras activation, keyword arguments).
ACTIVATIONS = {
    "silu": ("silu", {}),
    "swish": ("silu", {}),
    "gelu": ("gelu", {"approximate": False}),
    "gelu_pytorch_tanh": ("gelu", {"approximate": True}),
    "gelu_new": ("gelu", {"approximate": True}),
    "relu": ("relu", {}),
}
# `ModelSpec` field -> the values the blocks of each kind implement.
BUILT_FEATURES = {
    "decoder": {
        "position_embedding": ("rope", "learned"),
        "mlp_kind": ("gated", "plain"),
        "norm_type": ("rms", "layer"),
    },
    "encoder": {
        "position_embedding": ("learned",),
        "mlp_kind": ("plain",),
        "norm_type": ("layer",),
    },
}


def built_families() -> list[str]:
    """Names of the families `keras_mha.models` builds.

    Example:
        >>> "gpt2" in built_families() and "t5" not in built_families()
        True
    """
    return sorted(family.name for family in unique_families() if family.blocks is not None)


def built_family(spec) -> Family:
    """The family of `spec`, after checking that `keras_mha.models` builds this config.

    Raises:
        UnsupportedModelError: the family is only described (its module says what it
            needs), or the config asks for a feature the blocks do not implement.

    Example:
        >>> built_family(spec).name  # doctest: +SKIP
        'llama'
    """
    family = family_for(spec.family)
    if family is None or family.blocks is None:
        missing = family.not_built if family is not None else "a block layout"
        raise UnsupportedModelError(
            f"model_type={spec.model_type!r} (family {spec.family!r}) is not supported by "
            f"keras_mha.models: it needs {missing}; supported families are "
            f"{built_families()}",
            value=spec.model_type,
        )
    where = f"model_type={spec.model_type!r}"
    if spec.mlp.num_experts or any(spec.mlp.moe_layers):
        raise UnsupportedModelError(f"{where}: a mixture-of-experts MLP is not supported")
    kind = family.blocks.kind
    for name, supported in BUILT_FEATURES[kind].items():
        value = getattr(getattr(spec, RECORD_OF_FIELD[name]), name)
        if value not in supported:
            raise UnsupportedModelError(
                f"{where}: keras_mha.models builds {kind}s with {name} in "
                f"{list(supported)}; this config has {name}={value!r}",
                key=name,
                value=value,
            )
    position_type = spec.raw.get("position_embedding_type", "absolute")
    if position_type not in (None, "absolute"):
        raise UnsupportedModelError(
            f"{where}: position_embedding_type={position_type!r} is not supported; "
            f"keras_mha.models builds absolute learned positions",
            key="position_embedding_type",
            value=position_type,
        )
    activation_name(spec, family.blocks)
    return family


def activation_name(spec, blocks: Blocks) -> str:
    """The config's Hugging Face activation name, checked against `ACTIVATIONS`."""
    name = spec.mlp.hidden_act or blocks.default_activation
    if name not in ACTIVATIONS:
        raise UnsupportedModelError(
            f"model_type={spec.model_type!r}: hidden_act={name!r} is not supported; "
            f"expected one of {sorted(ACTIVATIONS)}",
            key="hidden_act",
            value=name,
        )
    return name


__all__ = ["ACTIVATIONS", "BUILT_FEATURES", "activation_name", "built_families", "built_family"]
