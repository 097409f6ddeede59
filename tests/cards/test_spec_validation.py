"""Every refusal of `from_config`: the key, the value and what was expected, in one line.

Table-driven: each row edits a valid config (a bundled card or a small Mistral config)
in one place and names the `ConfigError.key` and a phrase the message must contain.
The same rows go through `keras-mha inspect` once each to check the exit code (9).
"""

from __future__ import annotations

import copy
import json
import math
import warnings
from pathlib import Path

import pytest

from keras_mha import cli
from keras_mha.errors import ConfigError, KerasMHAError
from keras_mha.planning.config_values import MAX_NESTING_DEPTH, shown
from keras_mha.planning.costs import kv_cache_cost, parameter_counts
from keras_mha.planning.spec import from_config
from tests.cards.test_spec import mistral

pytestmark = pytest.mark.backend_independent

CARDS_ROOT = Path(__file__).resolve().parents[2] / "cards"


def card(card_id: str) -> dict:
    return json.loads((CARDS_ROOT / card_id / "config.json").read_text())


# A small Mistral config (every layer slides) with an architecture.
MISTRAL = {**mistral(sliding_window=64), "architectures": ["MistralForCausalLM"]}


def edited(base: dict | str, path: str, value) -> dict:
    """`base` (a dict or a card id) with `value` at the dotted `path`; `DELETE` removes it."""
    config = copy.deepcopy(card(base) if isinstance(base, str) else base)
    *parents, last = path.split(".")
    node = config
    for name in parents:
        node = node[name]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return config


DELETE = object()

# (id, base config or card, dotted path, new value, expected ConfigError.key, phrase in message)
REFUSALS = [
    # -- integers: type, range -------------------------------------------------------------
    ("heads-string", MISTRAL, "num_attention_heads", "32", "num_attention_heads", "not a string"),
    ("heads-float", MISTRAL, "num_attention_heads", 8.5, "num_attention_heads", "not a float"),
    (
        "heads-integral-float",
        MISTRAL,
        "num_attention_heads",
        8.0,
        "num_attention_heads",
        "write 8, not 8.0",
    ),
    ("heads-bool", MISTRAL, "num_attention_heads", True, "num_attention_heads", "not a bool"),
    ("heads-zero", MISTRAL, "num_attention_heads", 0, "num_attention_heads", "must be >= 1"),
    ("heads-negative", MISTRAL, "num_attention_heads", -8, "num_attention_heads", ">= 1"),
    ("heads-huge", MISTRAL, "num_attention_heads", 2**17, "num_attention_heads", "<= 65,536"),
    ("heads-nan", MISTRAL, "num_attention_heads", math.nan, "num_attention_heads", "integer"),
    ("heads-list", MISTRAL, "num_attention_heads", [8], "num_attention_heads", "not a list"),
    ("heads-null", MISTRAL, "num_attention_heads", None, None, None),  # default 32: valid
    ("layers-10-million", MISTRAL, "num_hidden_layers", 10**7, "num_hidden_layers", "<= 10,000"),
    ("layers-googol", MISTRAL, "num_hidden_layers", 10**100, "num_hidden_layers", "<= 10,000"),
    ("hidden-huge", MISTRAL, "hidden_size", 2**21, "hidden_size", "<= 1,048,576"),
    ("vocab-huge", MISTRAL, "vocab_size", 2**25, "vocab_size", "<= 16,777,216"),
    ("vocab-zero", MISTRAL, "vocab_size", 0, "vocab_size", ">= 1"),
    ("ffn-negative", MISTRAL, "intermediate_size", -1, "intermediate_size", ">= 1"),
    (
        "positions-inf",
        MISTRAL,
        "max_position_embeddings",
        math.inf,
        "max_position_embeddings",
        "float",
    ),
    ("window-zero", MISTRAL, "sliding_window", 0, "sliding_window", ">= 1"),
    ("window-negative", MISTRAL, "sliding_window", -4096, "sliding_window", ">= 1"),
    ("window-string", MISTRAL, "sliding_window", "4096", "sliding_window", "not a string"),
    ("head-dim-zero", MISTRAL, "head_dim", 0, "head_dim", ">= 1"),
    # -- numbers: finite, in range -------------------------------------------------------------
    ("theta-nan", MISTRAL, "rope_theta", math.nan, "rope_theta", "finite"),
    ("theta-inf", MISTRAL, "rope_theta", math.inf, "rope_theta", "finite"),
    ("theta-negative", MISTRAL, "rope_theta", -1.0, "rope_theta", "must be in (0"),
    ("theta-string", MISTRAL, "rope_theta", "1e4", "rope_theta", "not a string"),
    ("theta-overflow", MISTRAL, "rope_theta", 10**400, "rope_theta", "finite"),
    ("eps-negative", MISTRAL, "rms_norm_eps", -1e-6, "rms_norm_eps", "must be in [0"),
    ("partial-rotary", MISTRAL, "partial_rotary_factor", 1.5, "partial_rotary_factor", "(0, 1]"),
    (
        "softcap-zero",
        "google/gemma-2-9b",
        "attn_logit_softcapping",
        0,
        "attn_logit_softcapping",
        "(0",
    ),
    ("flag-string", MISTRAL, "tie_word_embeddings", "yes", "tie_word_embeddings", "true or false"),
    ("activation-number", MISTRAL, "hidden_act", 3, "hidden_act", "must be a string"),
    # -- cross-field -------------------------------------------------------------------------
    ("kv-not-dividing", MISTRAL, "num_key_value_heads", 3, "num_key_value_heads", "must divide"),
    ("kv-above-heads", MISTRAL, "num_key_value_heads", 16, "num_key_value_heads", "must divide"),
    ("hidden-not-divisible", "openai-community/gpt2", "n_embd", 770, "n_embd", "not divisible"),
    ("layer-types-length", MISTRAL, "layer_types", ["full_attention"], "layer_types", "per layer"),
    (
        "layer-types-unknown",
        MISTRAL,
        "layer_types",
        ["full_attention", "magic", "full_attention", "full_attention"],
        "layer_types[1]",
        "must be one of",
    ),
    (
        "layer-types-sliding-without-window",
        edited(MISTRAL, "sliding_window", None),
        "layer_types",
        ["sliding_attention"] * 4,
        "layer_types",
        "sliding_window must be set",
    ),
    (
        "experts-per-token",
        "mistralai/Mixtral-8x7B-v0.1",
        "num_experts_per_tok",
        9,
        "num_experts_per_tok",
        "<= 8",
    ),
    (
        "qwen-moe-dense-list",
        "Qwen/Qwen3-30B-A3B",
        "mlp_only_layers",
        "0,1",
        "mlp_only_layers",
        "list",
    ),
    (
        "qwen-moe-dense-entry",
        "Qwen/Qwen3-30B-A3B",
        "mlp_only_layers",
        [-1],
        "mlp_only_layers[0]",
        ">= 0",
    ),
    ("jamba-offset", "ai21labs/Jamba-v0.1", "attn_layer_offset", 8, "attn_layer_offset", "<= 7"),
    (
        "falcon-norms",
        "tiiuae/falcon-40b",
        "num_ln_in_parallel_attn",
        3,
        "num_ln_in_parallel_attn",
        "<= 2",
    ),
    (
        "gemma3-pattern",
        "google/gemma-3-1b-pt",
        "sliding_window_pattern",
        0,
        "sliding_window_pattern",
        ">= 1",
    ),
    (
        "t5-projection",
        "google-t5/t5-small",
        "feed_forward_proj",
        "gated-",
        "feed_forward_proj",
        "activation",
    ),
    # -- rope_scaling / rope_parameters ----------------------------------------------------------
    ("rope-scaling-string", MISTRAL, "rope_scaling", "linear", "rope_scaling", "JSON object"),
    (
        "rope-scaling-no-factor",
        MISTRAL,
        "rope_scaling",
        {"rope_type": "linear"},
        "rope_scaling",
        "'factor'",
    ),
    (
        "rope-scaling-nan-factor",
        MISTRAL,
        "rope_scaling",
        {"rope_type": "linear", "factor": math.nan},
        "rope_scaling.factor",
        "finite",
    ),
    (
        "rope-scaling-type",
        MISTRAL,
        "rope_scaling",
        {"type": 3, "factor": 2.0},
        "rope_scaling.rope_type",
        "string",
    ),
    (
        "rope-scaling-long-factor",
        MISTRAL,
        "rope_scaling",
        {"rope_type": "longrope", "long_factor": [1.0, -2.0], "short_factor": [1.0]},
        "rope_scaling.long_factor[1]",
        "(0",
    ),
    ("rope-parameters-list", MISTRAL, "rope_parameters", [], "rope_parameters", "JSON object"),
    (
        "rope-parameters-per-type",
        MISTRAL,
        "rope_parameters",
        {"full_attention": "default"},
        "rope_parameters.full_attention",
        "JSON object",
    ),
    # -- sub-objects -----------------------------------------------------------------------------
    (
        "text-config-string",
        "google/gemma-3-4b-it",
        "text_config",
        "abc",
        "text_config",
        "JSON object",
    ),
    (
        "text-config-missing",
        "llava-hf/llava-1.5-7b-hf",
        "text_config",
        DELETE,
        "text_config",
        "JSON object",
    ),
    (
        "text-config-type",
        "google/gemma-3-4b-it",
        "text_config.model_type",
        7,
        "text_config.model_type",
        "string",
    ),
    (
        "text-config-heads",
        "google/gemma-3-4b-it",
        "text_config.num_attention_heads",
        -1,
        "text_config.num_attention_heads",
        ">= 1",
    ),
    (
        "vision-config-list",
        "google/gemma-3-4b-it",
        "vision_config",
        [],
        "vision_config",
        "JSON object",
    ),
    (
        "vision-config-missing",
        "google/paligemma-3b-pt-224",
        "vision_config",
        DELETE,
        "vision_config",
        "JSON object",
    ),
    (
        "vision-patch-above-image",
        "google/paligemma-3b-pt-224",
        "vision_config.patch_size",
        448,
        "vision_config.patch_size",
        "<= 224",
    ),
    (
        "vision-heads",
        "llava-hf/llava-1.5-7b-hf",
        "vision_config.num_attention_heads",
        7,
        "vision_config.hidden_size",
        "divisible",
    ),
    (
        "llava-feature-layer",
        "llava-hf/llava-1.5-7b-hf",
        "vision_feature_layer",
        "last",
        "vision_feature_layer",
        "integer",
    ),
    ("dbrx-attn-string", "databricks/dbrx-base", "attn_config", "x", "attn_config", "JSON object"),
    (
        "dbrx-attn-missing",
        "databricks/dbrx-base",
        "attn_config",
        DELETE,
        "attn_config",
        "JSON object",
    ),
    (
        "dbrx-attn-no-kv",
        "databricks/dbrx-base",
        "attn_config.kv_n_heads",
        DELETE,
        "attn_config.kv_n_heads",
        "looked for",
    ),
    (
        "dbrx-clip-nan",
        "databricks/dbrx-base",
        "attn_config.clip_qkv",
        math.nan,
        "attn_config.clip_qkv",
        "finite",
    ),
    (
        "dbrx-top-k",
        "databricks/dbrx-base",
        "ffn_config.moe_top_k",
        17,
        "ffn_config.moe_top_k",
        "<= 16",
    ),
    ("dbrx-ffn-list", "databricks/dbrx-base", "ffn_config", [1], "ffn_config", "JSON object"),
    # -- the document itself -----------------------------------------------------------------------
    ("model-type-number", MISTRAL, "model_type", 3, "model_type", "must be a string"),
    ("model-type-empty-list", MISTRAL, "model_type", [], "model_type", "must be a string"),
    (
        "generic-without-ffn",
        edited(MISTRAL, "model_type", "brand_new_lm"),
        "intermediate_size",
        DELETE,
        "intermediate_size",
        "looked for intermediate_size, n_inner",
    ),
    (
        "architectures-string",
        MISTRAL,
        "architectures",
        "MistralForCausalLM",
        "architectures",
        "list",
    ),
    ("non-json-value", MISTRAL, "rope_theta", {1, 2}, "rope_theta", "JSON value"),
]
VALID_ROWS = [row for row in REFUSALS if row[4] is None]
REFUSALS = [row for row in REFUSALS if row[4] is not None]


@pytest.mark.parametrize(
    ("base", "path", "value", "key", "phrase"),
    [row[1:] for row in REFUSALS],
    ids=[r[0] for r in REFUSALS],
)
def test_refusal_names_the_key_the_value_and_the_expectation(base, path, value, key, phrase):
    config = edited(base, path, value)
    with pytest.raises(ConfigError) as raised, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an unknown model_type is read with a UserWarning
        from_config(config)
    error = raised.value
    message = str(error)
    assert isinstance(error, KerasMHAError) and isinstance(error, ValueError)
    assert error.exit_code == 9
    assert error.key == key, message
    assert key in message and phrase in message, message
    assert "\n" not in message and len(message) < 400, message
    if error.key == path and value is not DELETE and not isinstance(value, dict | set):
        assert shown(value) in message or "truncated" in message, message


@pytest.mark.parametrize(("base", "path", "value"), [row[1:4] for row in VALID_ROWS])
def test_null_means_the_family_default(base, path, value):
    assert (
        from_config(edited(base, path, value)).attention.num_attention_heads == 32
    )  # MistralConfig


def test_values_are_shown_short():
    long_name = "x" * 10_000
    with pytest.raises(ConfigError) as raised:
        from_config(edited(MISTRAL, "hidden_act", [long_name] * 1000))
    assert len(str(raised.value)) < 300 and "truncated" in str(raised.value)
    with pytest.raises(ConfigError) as raised:
        from_config(edited(MISTRAL, "num_hidden_layers", 10**5000))
    assert "an integer of 16610 bits" in str(raised.value)


def test_deep_nesting_and_cycles_are_refused_without_recursion_errors():
    deep: dict = {}
    node = deep
    for _ in range(100_000):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(ConfigError, match=f"nested deeper than {MAX_NESTING_DEPTH} levels"):
        from_config({**MISTRAL, "extra": deep})
    cyclic = dict(MISTRAL)
    cyclic["self"] = cyclic
    with pytest.raises(ConfigError, match="nested deeper"):
        from_config(cyclic)
    with pytest.raises(ConfigError, match="not a string"):
        from_config({**MISTRAL, "rope_scaling": {1: "x"}})


def test_not_an_object():
    for value in (None, [], "config", 3):
        with pytest.raises(ConfigError, match="must be a JSON object"):
            from_config(value)


def test_missing_sizes_name_every_spelling():
    config = {"model_type": "brand_new_lm", "vocab_size": 10, "hidden_size": 64}
    with pytest.warns(UserWarning), pytest.raises(ConfigError) as raised:
        from_config(config)
    assert raised.value.key == "num_attention_heads"
    assert "n_head, num_heads, n_heads" in str(raised.value)


def test_the_largest_accepted_sizes_cost_nothing_to_describe():
    # 10,000 layers of Gemma 3 (the layer bound): the kinds follow the 5:1 pattern.
    config = edited("google/gemma-3-1b-pt", "num_hidden_layers", 10_000)
    spec = from_config(config)
    assert spec.layer_kind_counts() == {"full": 1666, "sliding": 8334, "none": 0}
    cost = kv_cache_cost(spec, seq_len=2**32, batch=2**20)
    per_layer_token = 2 * 256 * 2
    assert cost.total_bytes == 2**20 * per_layer_token * (1666 * 2**32 + 8334 * 512)
    counts = parameter_counts(spec)
    assert counts.total == counts.attention + counts.embeddings + counts.mlp + counts.norms


@pytest.mark.parametrize(
    ("path", "value", "key"),
    [
        ("num_hidden_layers", 10**7, "num_hidden_layers"),
        ("num_key_value_heads", 3, "num_key_value_heads"),
        ("rope_scaling", "linear", "rope_scaling"),
    ],
)
def test_cli_exits_9_with_one_line(tmp_path, capsys, path, value, key):
    (tmp_path / "config.json").write_text(json.dumps(edited(MISTRAL, path, value)))
    code = cli.main(["inspect", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 9, captured.err
    assert captured.out == "" and captured.err.count("\n") == 1
    assert key in captured.err
