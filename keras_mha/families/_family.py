"""The shape of a family module's data: `Family`, its `Blocks` and its multimodal `Wrapper`.

A family module (`keras_mha/families/<model_type>.py`) defines `FAMILY = Family(...)`.
Everything keras-mha knows about the family is a field:

- reading its `config.json` (`keys`, `traits`, `switches`, `window`, `moe`,
  `ffn_factor`, `hooks`, `defaults`; `read_family` applies them);
- building it with `keras_mha.models` (`blocks`; None for families that `inspect`
  describes but `from_pretrained` does not build, with `not_built` saying what is missing);
- its checkpoint's tensor names (`weights`, a `WeightNames` table used by whole-model
  loading, `save_pretrained` and single-layer `load_attention_weights` alike);
- how a pruned model's head count is written back (`head_size_in_config`);
- for multimodal wrappers, the language and vision parts and the projector (`wrapper`).

Only the standard library is imported (no keras, no NumPy), so `keras-mha inspect`
reads the registry in a few milliseconds.

Example:
    >>> family = Family("tiny", keys={"hidden_size": ("hidden_size",)})
    >>> family.model_types, family.blocks is None
    (('tiny',), True)
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from keras_mha.errors import ConfigError
from keras_mha.families import _rules as rules

# How a family's config states the head size, which decides how a pruned model exports
# (see `keras_mha.models.export`): the config has a `head_dim` key ("explicit"), has one
# but transformers also requires hidden_size % heads == 0 ("explicit_divisor"), or derives
# the head size as hidden_size / heads ("derived").
HEAD_SIZE_LAYOUTS = ("explicit", "explicit_divisor", "derived")
BLOCK_KINDS = ("decoder", "encoder")


# Named tuples, not dataclasses: `keras-mha inspect` imports these, and a dataclass costs
# about a millisecond to define.
_BLOCK_FIELDS = (
    "kind",
    "default_activation",
    "default_norm_epsilon",
    "norm_scale_offset",
    "embedding_scale",
    "sandwich_norms",
)


class Blocks(namedtuple("Blocks", _BLOCK_FIELDS, defaults=("silu", 1e-6, 0.0, False, False))):
    """What `keras_mha.models` needs beyond the `ModelSpec` to build a family's blocks.

    The spec already says the norm type and bias, MLP kind and biases, positions (RoPE,
    a learned table, RoBERTa's padding offset), parallel residuals and tying; these are
    the family's fixed choices that no config key states.

    Attributes:
        kind: "decoder" (a causal LM, `DecoderModel`) or "encoder" (`EncoderModel`).
        default_activation: the Hugging Face activation name when the config names none.
        default_norm_epsilon: when the config names none.
        norm_scale_offset: norms multiply by `offset + weight` (Gemma stores `w` and
            multiplies by `1 + w`); q/k norms of such a family load as `1 + w`.
        embedding_scale: token embeddings are multiplied by sqrt(hidden_size) (Gemma).
        sandwich_norms: each sublayer's output is normalised too (Gemma 2/3).

    Example:
        >>> Blocks("decoder", norm_scale_offset=1.0).norm_scale_offset
        1.0
        >>> Blocks("decoder")._replace(sandwich_norms=True).sandwich_norms
        True
    """

    __slots__ = ()

    def __new__(cls, kind: str, *args, **kwargs):
        if kind not in BLOCK_KINDS:
            raise ValueError(f"Blocks.kind={kind!r}; expected one of {list(BLOCK_KINDS)}")
        return super().__new__(cls, kind, *args, **kwargs)


_WRAPPER_FIELDS = (
    "text_model_type",
    "vision_model_type",
    "tie_word_embeddings",
    "projector_parameters",
    "read_projector",
)


def _no_projector_fields(top) -> dict:
    return {}


class Wrapper(namedtuple("Wrapper", _WRAPPER_FIELDS, defaults=(_no_projector_fields,))):
    """A multimodal wrapper config (Gemma 3, LLaVA, PaliGemma) around a language model.

    Attributes:
        text_model_type: the `model_type` its `text_config` has when it does not say
            (transformers' `sub_configs` defaults).
        vision_model_type: the same for `vision_config`.
        tie_word_embeddings: the wrapper's own default; None when a false (or absent)
            top-level value takes the text config's (LlavaConfig).
        projector_parameters: `(VisionSpec, text hidden size) -> parameters` of the
            projector between the vision tower and the language model.
        read_projector: `(top-level reader) -> dict` of the `VisionSpec` projector fields
            the wrapper's config sets (`projector_bias`, `projector_input_layers`,
            `projection_dim`).
    """

    __slots__ = ()


@dataclass(frozen=True)
class Family:
    """Everything keras-mha knows about one model family, as data (see the module docstring).

    Attributes:
        name: the `model_type` (and `ModelSpec.family`).
        aliases: other `model_type` values read as this family.
        keys: canonical `ModelSpec` field -> config keys that hold it, tried in order
            (transformers' `attribute_map`, written out); a field without spellings is
            derived (`num_key_value_heads` = heads, `head_dim` = hidden / heads).
        traits: `ModelSpec` fields the family fixes (biases, norms, MLP kind, positions).
        switches: boolean config key -> the boolean `ModelSpec` fields it sets.
        window: how layer kinds are laid out: None (all full), "all" (every layer slides
            when a window is set), "qwen" (`use_sliding_window` + `max_window_layers`),
            "alternate" (Gemma 2), "pattern" (Gemma 3's `sliding_window_pattern`),
            "ignored" (the family has no windows; a window is noted and dropped).
        moe: a key of `_rules.MOE_RULES` ("mixtral", "qwen3_moe", "deepseek", "jamba").
        ffn_factor: intermediate size = `ffn_factor * hidden_size` when no key gives it.
        hooks: the family's genuine special cases, `hook(reader, fields)`, in order.
        defaults: the values transformers' config class uses for keys a config leaves out.
        default_head: the head counted when a config names no `architectures`.
        base_pooler: a bare `...Model` architecture includes a pooler (BERT, RoBERTa).
        blocks: how `keras_mha.models` builds it; None when it is only described.
        not_built: what `keras_mha.models` would need to build it (for the error).
        weights: its checkpoint's tensor names (None: keras-mha reads none of them).
        head_size_in_config: one of `HEAD_SIZE_LAYOUTS`, how a pruned model's heads are
            written back by `save_pretrained`; None when it is not exported.
        wrapper: for a multimodal wrapper, its language and vision parts.

    Example:
        >>> from keras_mha.families import family_for
        >>> family_for("qwen2").traits["o_bias"], family_for("gemma2").window
        (False, 'alternate')
    """

    name: str
    aliases: tuple[str, ...] = ()
    keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    traits: Mapping[str, object] = field(default_factory=dict)
    switches: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    window: str | None = None
    moe: str | None = None
    ffn_factor: int | None = None
    hooks: tuple[Callable[[object, dict], None], ...] = ()
    defaults: Mapping[str, object] = field(default_factory=dict)
    default_head: str = "lm"
    base_pooler: bool = False
    blocks: Blocks | None = None
    not_built: str = "a block layout keras-mha does not describe"
    weights: object = None  # a `_weights.WeightNames`
    head_size_in_config: str | None = None
    wrapper: Wrapper | None = None

    def __post_init__(self):
        if self.head_size_in_config not in (None, *HEAD_SIZE_LAYOUTS):
            raise ValueError(
                f"Family {self.name!r}: head_size_in_config={self.head_size_in_config!r}; "
                f"expected one of {list(HEAD_SIZE_LAYOUTS)} or None"
            )
        if self.moe is not None and self.moe not in rules.MOE_RULES:
            raise ValueError(
                f"Family {self.name!r}: moe={self.moe!r}; expected one of {sorted(rules.MOE_RULES)}"
            )

    @property
    def model_types(self) -> tuple[str, ...]:
        """Every `model_type` read as this family (its name first)."""
        return (self.name, *self.aliases)


def read_family(reader, family: Family) -> dict:
    """Every `ModelSpec` field `family` defines, read and validated through `reader`.

    Args:
        reader: a `keras_mha.planning.config_values.ConfigReader` over the (text) config,
            with `family.defaults` as its defaults.
        family: the family.

    Returns:
        A dict of `ModelSpec` fields plus "layer_kinds" (and "notes": remarks for
        `ModelSpec.warnings`); `cards.spec.from_config` adds the rest and the
        cross-field checks.

    Example:
        >>> from keras_mha.planning.config_values import ConfigReader
        >>> from keras_mha.families import family_for
        >>> reader = ConfigReader({"n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 10,
        ...                        "n_positions": 32}, model_type="gpt2")
        >>> fields = read_family(reader, family_for("gpt2"))
        >>> fields["head_dim"], fields["intermediate_size"], fields["layer_kinds"]
        (16, 256, ('full', 'full'))
    """
    keys = family.keys
    fields: dict = dict(family.traits)
    fields["notes"] = []
    fields["hidden_size"] = reader.integer(
        keys["hidden_size"], "width", name="hidden_size", shape=True
    )
    heads = reader.integer(
        keys["num_attention_heads"], "heads", name="num_attention_heads", shape=True
    )
    fields["num_attention_heads"] = heads
    fields["num_hidden_layers"] = reader.integer(
        keys["num_hidden_layers"], "layers", name="num_hidden_layers", shape=True
    )
    fields["vocab_size"] = reader.integer(keys["vocab_size"], "vocab", shape=True)
    fields["num_key_value_heads"] = reader.integer(
        keys.get("num_key_value_heads", ()),
        "heads",
        default=heads,
        name="num_key_value_heads",
        shape=True,
    )
    head_dim = reader.integer(
        keys.get("head_dim", ()), "width", default=None, name="head_dim", shape=True
    )
    if head_dim is not None:
        fields["head_dim"] = head_dim
    if "intermediate_size" in keys:
        fields["intermediate_size"] = reader.integer(
            keys["intermediate_size"],
            "width",
            default=ConfigError  # required, unless the family derives it from the width
            if family.ffn_factor is None
            else family.ffn_factor * fields["hidden_size"],
            shape=family.ffn_factor is None,
        )
    # A learned position table needs its row count; otherwise positions are informative.
    learned = family.traits.get("position_embedding") == "learned"
    fields["max_position_embeddings"] = reader.integer(
        keys["max_position_embeddings"],
        "tokens",
        default=ConfigError if learned else None,
        shape=learned,
    )
    fields["norm_eps"] = reader.number(keys["norm_eps"], "epsilon")
    activation_key, _ = reader.lookup(keys["hidden_act"])
    fields["hidden_act"] = reader.text(activation_key) if activation_key else None
    fields["tie_word_embeddings"] = reader.flag("tie_word_embeddings", True)
    if "rope_theta" in keys:
        fields.update(rules.rope_fields(reader, keys))
    for key, targets in family.switches.items():
        value = reader.flag(key, fields.get(targets[0], False))
        fields.update(dict.fromkeys(targets, value))
    if family.moe:
        fields.update(rules.MOE_RULES[family.moe](reader, fields))
    if family.window is not None:
        fields["layer_kinds"], fields["sliding_window"] = rules.window_layer_kinds(
            reader, family.window, fields
        )
    for hook in family.hooks:
        hook(reader, fields)
    if "head_dim" not in fields:
        fields["head_dim"] = rules.derived_head_dim(reader, fields)
        if family.head_size_in_config == "derived":
            rules.note_ignored_head_dim(reader, fields)
    fields.setdefault("layer_kinds", ("full",) * fields["num_hidden_layers"])
    return fields


def linear_parameters(inputs: int, outputs: int, bias: bool) -> int:
    """Parameters of a dense layer (for projector formulas).

    Example:
        >>> linear_parameters(4, 3, True)
        15
    """
    return inputs * outputs + (outputs if bias else 0)


__all__ = ["BLOCK_KINDS", "Blocks", "Family", "HEAD_SIZE_LAYOUTS", "Wrapper", "read_family"]
