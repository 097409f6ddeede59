"""The one validation layer every `config.json` value passes through on its way into a `ModelSpec`.

A config comes from a stranger (any Hub repo, mirror or folder), so `cards.spec` reads
no value directly: it asks a `ConfigReader` for "an integer of this quantity", "a
positive number", "a flag", "an object", and gets either a checked Python value or a
`ConfigError` that names the key, the value (its repr cut to 60 characters) and what
was expected, in one line.

Rules, the same for every family:

- integers are JSON integers: `true`/`false`, `32.5`, `"32"` and also `32.0` are refused
  (transformers' config classes annotate these fields as `int` and Hub configs never
  write an integral float, so refusing it hides nothing);
- numbers (floats) are finite: NaN, Infinity and integers too large for a float are
  refused; an integer is accepted where a float is expected (`"rope_theta": 500000`);
- every integer lies in the range of its quantity in `INTEGER_RANGES`, every number in
  the range of its kind in `NUMBER_RANGES` (the README's "Cost model" section lists both);
- a sub-object (`text_config`, `vision_config`, DBRX's `attn_config`, `rope_scaling`) is
  a JSON object or absent/null; anything else is an error, never a silent default;
- the whole config is plain JSON (objects with string keys, arrays, strings, numbers,
  booleans, null), nested at most `MAX_NESTING_DEPTH` levels.

Example:
    >>> reader = ConfigReader({"n_head": 12, "n_layer": True}, model_type="gpt2")
    >>> reader.integer(("num_attention_heads", "n_head"), "heads")
    12
    >>> try:
    ...     reader.integer(("n_layer",), "layers")
    ... except ConfigError as error:
    ...     print(error.exit_code, error.key, error.value)
    ...     print(error)
    9 n_layer True
    n_layer=True must be an integer in [1, 10,000], not a bool (config.json, model_type 'gpt2')
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping, Sequence

from keras_mha.errors import ConfigError

#: Quantity -> (smallest, largest) integer accepted. Generous for any real model (the
#: largest published configs are 10 to 100 times below each bound), small enough that
#: a typo or a hostile config cannot make the cost model allocate or loop without end.
INTEGER_RANGES: dict[str, tuple[int, int]] = {
    "layers": (1, 10_000),  # layers of a stack (decoder, encoder, vision tower)
    "heads": (1, 65_536),  # attention heads, KV heads
    "width": (1, 2**20),  # hidden and head sizes, feed-forward sizes, MLA ranks, Mamba sizes
    "vocab": (1, 2**24),  # vocabulary rows
    "tokens": (1, 2**32),  # positions, sliding windows
    "experts": (1, 65_536),  # routed experts, experts per token
    "count": (0, 65_536),  # shared experts, token types, relative-position buckets
    "layer_number": (0, 10_000),  # a layer number (offsets, first dense layers)
    "period": (1, 10_000),  # every N-th layer
    "image": (1, 65_536),  # image and patch sizes, channels, feature layers
    "token_id": (0, 2**24 - 1),  # a token id (RoBERTa's pad_token_id)
}

#: Kind -> (low, high, whether low itself is allowed) for floats; high is always included.
NUMBER_RANGES: dict[str, tuple[float, float, bool]] = {
    "positive": (0.0, 1e15, False),  # RoPE bases, soft caps, scalars, clip values, factors
    "fraction": (0.0, 1.0, False),  # partial rotary factor
    "epsilon": (0.0, 1.0, True),  # norm epsilons
    "finite": (-1e15, 1e15, True),  # YaRN's beta_fast/beta_slow, mscale
}

#: Deepest nesting of objects and arrays accepted (Hub configs use 3 or 4 levels).
MAX_NESTING_DEPTH = 32
#: Characters of a value's repr shown in a message.
SHOWN_CHARACTERS = 60

_JSON_SCALARS = (str, int, float, bool, type(None))


class _ShortRepr(reprlib.Repr):
    """`reprlib` with small limits, and no `repr()` of integers too long to print."""

    def __init__(self):
        super().__init__()
        self.maxlevel, self.maxdict, self.maxlist, self.maxstring = 2, 4, 4, SHOWN_CHARACTERS

    def repr_int(self, value, level):
        if value.bit_length() > 200:
            return f"<an integer of {value.bit_length()} bits>"
        return repr(value)


_SHORT_REPR = _ShortRepr()


def shown(value: object) -> str:
    """The repr of `value` for a one-line message, cut to `SHOWN_CHARACTERS` characters.

    Example:
        >>> shown("x" * 100)[-27:]
        '(100 characters, truncated)'
        >>> shown(list(range(100)))
        '[0, 1, 2, 3, ...]... (truncated)'
        >>> shown(float("nan"))
        'nan'
    """
    if isinstance(value, str) and len(value) > SHOWN_CHARACTERS:
        return f"{value[:SHOWN_CHARACTERS]!r}... ({len(value):,} characters, truncated)"
    text = _SHORT_REPR.repr(value)
    if isinstance(value, list | tuple | dict) and ("..." in text or len(text) > SHOWN_CHARACTERS):
        return f"{text[:SHOWN_CHARACTERS]}... (truncated)"
    return text


def _type_name(value: object) -> str:
    return {
        bool: "bool",
        str: "string",
        float: "float",
        list: "list",
        dict: "object",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def copy_json_config(config: object) -> dict:
    """A copy of `config` as plain dicts and lists, after checking it is a JSON object of
    bounded depth.

    The copy is made iteratively, so a hostile nesting depth (or a dict that contains
    itself) is an error, never a `RecursionError`, and mappings or tuples a Python caller
    passed become plain dicts and lists.

    Raises:
        ConfigError: not a dict, a non-string key, a non-JSON value, or nested too deep.

    Example:
        >>> copy_json_config({"a": [1, {"b": None}]})
        {'a': [1, {'b': None}]}
    """
    if not isinstance(config, Mapping):
        raise ConfigError(
            f"config must be a JSON object (a dict), got {_type_name(config)}: {shown(config)}",
            value=config,
        )
    copied: dict = {}
    stack: list[tuple[Mapping | list | tuple, dict | list, str, int]] = [(config, copied, "", 1)]
    while stack:
        source, target, path, depth = stack.pop()
        if depth > MAX_NESTING_DEPTH:
            raise ConfigError(
                f"config.json: {path} is nested deeper than {MAX_NESTING_DEPTH} levels; "
                f"expected a plain config",
                key=path,
            )
        is_object = isinstance(source, Mapping)
        for key, value in source.items() if is_object else enumerate(source):
            if is_object and not isinstance(key, str):
                raise ConfigError(
                    f"config.json: key {shown(key)} under {path or 'the top level'} is not a "
                    f"string; expected JSON object keys",
                    key=path or None,
                    value=key,
                )
            child_path = (f"{path}.{key}" if path else key) if is_object else f"{path}[{key}]"
            if isinstance(value, Mapping):
                child: object = {}
                stack.append((value, child, child_path, depth + 1))
            elif isinstance(value, list | tuple):
                child = []
                stack.append((value, child, child_path, depth + 1))
            elif isinstance(value, _JSON_SCALARS):
                child = value
            else:
                raise ConfigError(
                    f"config.json: {child_path}={shown(value)} is a {type(value).__name__}; "
                    f"expected a JSON value (object, array, string, number, boolean or null)",
                    key=child_path,
                    value=value,
                )
            if is_object:
                target[key] = child
            else:
                target.append(child)
    return copied


class ConfigReader:
    """Typed, validated access to one (sub-)config: the dict first, then the family defaults.

    Args:
        config: the (sub-)config dict, already checked by `copy_json_config`.
        model_type: named in messages.
        defaults: values transformers' config class uses for absent keys.
        where: prefix of key names in messages and errors (e.g. "text_config.").

    Attributes:
        notes: what had to be taken from the defaults (collected into `ModelSpec.warnings`).
        found: canonical name -> the key (with `where`) its value came from, so that
            cross-field errors name the key as the config spells it.

    Example:
        >>> reader = ConfigReader({"d_model": 512}, model_type="t5", where="text_config.")
        >>> reader.integer(("hidden_size", "d_model"), "width", name="hidden_size")
        512
        >>> reader.found["hidden_size"]
        'text_config.d_model'
    """

    def __init__(
        self,
        config: Mapping,
        *,
        model_type: str,
        defaults: Mapping | None = None,
        where: str = "",
    ):
        self.config = config
        self.model_type = model_type
        self.defaults = defaults or {}
        self.where = where
        self.notes: list[str] = []
        self.found: dict[str, str] = {}

    # -- errors -------------------------------------------------------------------------------

    def error(self, key: str, value: object, expected: str) -> ConfigError:
        """A `ConfigError`: "<key>=<value> <expected> (config.json, model_type '<type>')"."""
        qualified = key if key.startswith(self.where) else f"{self.where}{key}"
        family = f", model_type {self.model_type!r}" if self.model_type else ""
        return ConfigError(
            f"{qualified}={shown(value)} {expected} (config.json{family})",
            key=qualified,
            value=value,
        )

    def require(self, condition: bool, key: str, value: object, expected: str) -> None:
        """Raise `error(key, value, expected)` unless `condition` holds."""
        if not condition:
            raise self.error(key, value, expected)

    # -- lookup -------------------------------------------------------------------------------

    def has(self, key: str) -> bool:
        """Whether the config itself holds `key` (null included)."""
        return key in self.config

    def lookup(
        self, keys: Sequence[str] | str, *, shape: bool = False, nullable: bool = False
    ) -> tuple[str | None, object]:
        """(key, value) of the first key holding a non-null value, config first, defaults next.

        With `shape=True` a value taken from the defaults is noted (it decides the model's
        size). With `nullable=True` an explicit null in the config means "not set" (as a
        keyword argument of the config class would), so the defaults are not consulted.
        """
        keys = (keys,) if isinstance(keys, str) else keys
        for key in keys:
            if self.config.get(key) is not None:
                return key, self.config[key]
            if nullable and key in self.config:
                return None, None
        for key in keys:
            value = self.defaults.get(key)
            if value is not None:
                if shape:
                    self.notes.append(
                        f"{self.where}{key} is not in the config; used the {self.model_type} "
                        f"default {value!r}, as transformers does"
                    )
                return key, value
        return None, None

    def _missing(self, keys: Sequence[str], what: str) -> ConfigError:
        looked_for = ", ".join(f"{self.where}{key}" for key in keys)
        return ConfigError(
            f"config.json (model_type={self.model_type!r}) has no {what}: looked for {looked_for}",
            key=f"{self.where}{keys[0]}",
        )

    # -- typed values -------------------------------------------------------------------------

    def integer(
        self,
        keys: Sequence[str] | str,
        quantity: str,
        *,
        default: int | None | type[ConfigError] = ConfigError,
        name: str | None = None,
        low: int | None = None,
        high: int | None = None,
        shape: bool = False,
        nullable: bool = False,
    ) -> int | None:
        """The first of `keys` present, as an integer in the range of `quantity`.

        Args:
            keys: spellings, tried in order (config first, then the family defaults).
            quantity: a key of `INTEGER_RANGES`.
            default: returned when no key holds a value; without it that is an error.
            name: canonical name under which `found` records the key used.
            low, high: a narrower range than the quantity's (e.g. `high=num_experts`).
            shape: note in `notes` when the value comes from the family defaults.
            nullable: an explicit null in the config gives `default` (see `lookup`).
        """
        keys = (keys,) if isinstance(keys, str) else tuple(keys)
        key, value = self.lookup(keys, shape=shape, nullable=nullable)
        if key is None:
            if default is ConfigError:
                raise self._missing(keys, name or keys[0])
            return default
        return self.check_integer(key, value, quantity, name=name, low=low, high=high)

    def check_integer(
        self,
        key: str,
        value: object,
        quantity: str,
        *,
        name: str | None = None,
        low: int | None = None,
        high: int | None = None,
    ) -> int:
        """`value` (read from `key`) checked as an integer of `quantity`."""
        quantity_low, quantity_high = INTEGER_RANGES[quantity]
        low = quantity_low if low is None else max(low, quantity_low)
        high = quantity_high if high is None else min(high, quantity_high)
        if isinstance(value, bool) or not isinstance(value, int):
            integral = isinstance(value, float) and value.is_integer()
            hint = f" (write {int(value)}, not {value})" if integral else ""
            raise self.error(
                key,
                value,
                f"must be an integer in [{low:,}, {high:,}], not a {_type_name(value)}{hint}",
            )
        if not low <= value <= high:
            raise self.error(key, value, f"must be >= {low:,} and <= {high:,} ({quantity})")
        if name is not None:
            self.found[name] = f"{self.where}{key}"
        return value

    def number(
        self, keys: Sequence[str] | str, kind: str = "positive", *, default: float | None = None
    ) -> float | None:
        """The first of `keys` present, as a finite float of `kind` (see `NUMBER_RANGES`);
        an explicit null gives `default`."""
        key, value = self.lookup(keys, nullable=True)
        if key is None:
            return default
        return self.check_number(key, value, kind)

    def check_number(self, key: str, value: object, kind: str = "positive") -> float:
        """`value` (read from `key`) checked as a finite float of `kind`."""
        low, high, low_included = NUMBER_RANGES[kind]
        shown_range = f"{'[' if low_included else '('}{low:g}, {high:g}]"
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(
                key, value, f"must be a number in {shown_range}, not a {_type_name(value)}"
            )
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise self.error(key, value, f"must be a finite number in {shown_range}")
        if not (low <= number if low_included else low < number) or number > high:
            raise self.error(key, value, f"must be in {shown_range}")
        return number

    def flag(self, key: str, default: bool | None = False) -> bool | None:
        """`key` as a boolean; absent or null gives the family default, else `default`."""
        if self.config.get(key) is not None:
            value = self.config[key]
        else:
            value = self.defaults.get(key)
            if value is None:
                return default
        self.require(isinstance(value, bool), key, value, "must be true or false")
        return value

    def text(self, key: str, default: str | None = None) -> str | None:
        """`key` as a string (absent or null gives the family default, else `default`)."""
        found, value = self.lookup((key,))
        if found is None:
            return default
        self.require(isinstance(value, str), key, value, "must be a string")
        return value

    def choice(self, key: str, choices: Sequence[str], default: str | None = None) -> str | None:
        """`key` as one of `choices`."""
        value = self.text(key, default)
        if value is not None:
            self.require(value in choices, key, value, f"must be one of {list(choices)}")
        return value

    def sub_config(self, key: str, *, defaults: Mapping | None = None, model_type: str = ""):
        """`key` as a nested object, read by its own `ConfigReader`; None when absent or null."""
        if self.config.get(key) is None:
            return None
        value = self.config[key]
        self.require(isinstance(value, Mapping), key, value, "must be a JSON object or null")
        return ConfigReader(
            value,
            model_type=model_type or self.model_type,
            defaults=defaults,
            where=f"{self.where}{key}.",
        )

    def integer_list(self, key: str, quantity: str, *, high: int | None = None) -> list[int]:
        """`key` as a list of integers of `quantity` (absent or null: empty)."""
        _, values = self.lookup((key,))
        if values is None:
            return []
        self.require(isinstance(values, list), key, values, "must be a list of integers")
        return [
            self.check_integer(f"{key}[{index}]", value, quantity, high=high)
            for index, value in enumerate(values)
        ]


__all__ = [
    "INTEGER_RANGES",
    "MAX_NESTING_DEPTH",
    "NUMBER_RANGES",
    "ConfigReader",
    "copy_json_config",
    "shown",
]
