"""The family registry: every family module is complete, and nothing else names a family.

A family is one file in `keras_mha/families/` plus a bundled card and, when
`keras_mha.models` builds it, a parity case (docs/guides/adding-a-family.md); these
tests fail when a registered family lacks any of them or when a module outside the
registry branches on a family name. (The 0.2 import paths: tests/test_moved_paths.py.)
"""

import ast
import importlib
import json
from pathlib import Path

import pytest

from keras_mha.errors import ConfigError
from keras_mha.families import (
    GENERIC_NAME,
    all_families,
    family_for,
    family_module_names,
    module_family,
    module_name,
    read_family,
    unique_families,
)
from keras_mha.hub import bundled_config_path, list_bundled
from keras_mha.planning.config_values import ConfigReader
from keras_mha.planning.spec import from_config
from tests.models_checkpoints import CASES

pytestmark = pytest.mark.backend_independent

PACKAGE = Path(__file__).resolve().parents[2] / "keras_mha"
GUIDE = PACKAGE.parent / "docs" / "guides" / "adding-a-family.md"
# Every language family reads these (the fields `read_family` requires).
REQUIRED_KEYS = (
    "hidden_size",
    "num_attention_heads",
    "num_hidden_layers",
    "vocab_size",
    "max_position_embeddings",
    "norm_eps",
    "hidden_act",
)
MODULES = [name for name in family_module_names() if name != GENERIC_NAME]


def _bundled_model_types():
    types = {}
    for card in list_bundled():
        config = json.loads(bundled_config_path(card).read_text())
        text = config.get("text_config") or {}
        for model_type in (config.get("model_type"), text.get("model_type")):
            types.setdefault(model_type, card)
    return types


@pytest.mark.parametrize("name", MODULES)
def test_every_family_module_is_complete(name):
    family = module_family(importlib.import_module(f"keras_mha.families.{name}"))
    # The registry finds a family by the module named after it.
    assert module_name(family.name) == name and all_families()[family.name] is family
    if family.wrapper is not None:
        assert family_for(family.wrapper.text_model_type) is not None
    else:
        assert set(REQUIRED_KEYS) <= set(family.keys), family.name
        assert family.defaults, f"{family.name}: transformers' config defaults are missing"
        if family.blocks is None:
            assert family.not_built, f"{family.name}: say what keras_mha.models would need"
        else:
            assert family.weights is not None and family.head_size_in_config, family.name
    # A bundled card of the family (or of one of its aliases).
    assert set(family.model_types) & set(_bundled_model_types()), f"{name}: no card in cards/"


def test_every_family_keras_mha_builds_has_a_parity_case():
    built = {family.name for family in unique_families() if family.blocks is not None}
    tested = {case[3] for case in CASES.values()}
    assert built <= tested, f"no case in tests/models_checkpoints.py for {built - tested}"
    # The three families added by the 0.3 guide are among them.
    assert {"gpt2", "gpt_neox", "roberta", "xlm-roberta"} <= built


def test_the_guide_names_the_one_file_the_card_and_the_test_case():
    text = GUIDE.read_text()
    for part in ("keras_mha/families/", "cards/", "tests/models_checkpoints.py", "FAMILY"):
        assert part in text, part


def _string_constants(tree):
    """String constants of a module that are not docstrings."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                yield node


def test_no_module_outside_the_registry_names_a_family():
    names = set(all_families())
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "families":
            continue
        for node in _string_constants(ast.parse(path.read_text())):
            if node.value in names:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.value!r}")
    assert not found, found


def test_the_three_new_families_read_their_special_keys():
    gpt2 = from_config(
        {
            "model_type": "gpt2",
            "n_embd": 64,
            "n_head": 4,
            "n_layer": 3,
            "vocab_size": 100,
            "n_positions": 32,
            "scale_attn_by_inverse_layer_idx": True,
        }
    )
    assert [gpt2.attention_layer(i).scale for i in range(3)] == [0.25, 0.125, 0.25 / 3]
    assert (gpt2.positions.position_embedding, gpt2.mlp.intermediate_size) == ("learned", 256)
    neox = from_config(
        {
            "model_type": "gpt_neox",
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "intermediate_size": 96,
            "vocab_size": 100,
            "use_parallel_residual": False,
        }
    )
    assert (
        neox.norms.parallel_residual,
        neox.positions.partial_rotary_factor,
        neox.attention.q_bias,
    ) == (False, 0.25, True)
    xlmr = from_config(
        {
            "model_type": "xlm-roberta",
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "intermediate_size": 96,
            "max_position_embeddings": 514,
        }
    )
    assert (xlmr.family, xlmr.vocab_size, xlmr.positions.position_padding_idx) == (
        "xlm-roberta",
        30522,
        1,
    )


@pytest.mark.parametrize(
    "config, message",
    [
        ({"pad_token_id": 40}, r"max_position_embeddings=34 must exceed pad_token_id \+ 1 = 41"),
        ({"pad_token_id": 100}, r"pad_token_id=100 must be >= 0 and <= 99"),
        ({"pad_token_id": "1"}, r"pad_token_id='1' must be an integer"),
    ],
)
def test_roberta_padding_index_is_validated(config, message):
    base = {
        "model_type": "roberta",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 96,
        "vocab_size": 100,
        "max_position_embeddings": 34,
    }
    with pytest.raises(ConfigError, match=message) as error:
        from_config({**base, **config})
    assert "\n" not in str(error.value)


def test_read_family_is_the_registry_reader():
    config = {"n_embd": 8, "n_head": 2, "n_layer": 1, "vocab_size": 5}
    reader = ConfigReader(config, model_type="gpt2", defaults=family_for("gpt2").defaults)
    fields = read_family(reader, family_for("gpt2"))
    assert fields["max_position_embeddings"] == 1024  # GPT2Config's default n_positions
    assert reader.notes and "n_positions" in reader.notes[0]
