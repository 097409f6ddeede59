"""The import paths that moved in 0.3 keep working for one release: each old module path
is the new module and each old name the new object, with a `DeprecationWarning` naming
the new path. That nothing inside keras-mha imports through them:
tests/test_import_structure.py."""

import importlib
import re
import sys

import pytest

from keras_mha.moved_paths import MOVED_MODULES, MOVED_NAMES

pytestmark = pytest.mark.backend_independent

# `keras_mha.cards.__all__` of 0.2, which users import from.
CARDS_0_2_NAMES = [
    "CardError", "ConfigError", "ConfigFileNotFoundError", "GatedRepositoryError",
    "HubUnreachableError", "KVCacheCost", "LoadedConfig", "MalformedConfigError", "ModelSpec",
    "ParameterCounts", "RepositoryNotFoundError", "RevisionNotFoundError",
    "bundled_config_path", "from_config", "kv_cache_cost", "list_bundled", "load_config",
    "parameter_counts",
]  # fmt: skip


def _forget(monkeypatch, old: str) -> None:
    """Make the next `import old` a first import again (the alias is cached once imported)."""
    parent, _, leaf = old.rpartition(".")
    monkeypatch.delitem(sys.modules, old, raising=False)
    monkeypatch.delattr(importlib.import_module(parent), leaf, raising=False)


@pytest.mark.parametrize("old, new", sorted(MOVED_MODULES.items()))
def test_an_old_module_path_warns_and_is_the_new_module(old, new, monkeypatch):
    _forget(monkeypatch, old)
    expected = rf"^{re.escape(old)} moved to {re.escape(new)}; import it from there"
    with pytest.warns(DeprecationWarning, match=expected):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert importlib.import_module(old) is module  # cached: later imports are the same


@pytest.mark.parametrize(
    "module, name, new",
    [(module, name, new) for module, names in MOVED_NAMES.items() for name, new in names.items()],
)
def test_an_old_name_warns_and_is_the_new_object(module, name, new):
    expected = rf"^{re.escape(f'{module}.{name}')} moved to {re.escape(f'{new}.{name}')};"
    with pytest.warns(DeprecationWarning, match=expected):
        value = getattr(importlib.import_module(module), name)
    assert value is getattr(importlib.import_module(new), name)


def test_the_warning_points_at_the_importing_line(monkeypatch):
    _forget(monkeypatch, "keras_mha.cards.gpus")
    with pytest.warns(DeprecationWarning) as caught:
        from keras_mha.cards.gpus import find_gpu  # noqa: F401
    assert [warning.filename for warning in caught] == [__file__]


def test_every_0_2_cards_name_still_imports():
    import keras_mha.cards as cards

    with pytest.warns(DeprecationWarning):  # the Hub names moved to keras_mha.hub
        missing = [name for name in CARDS_0_2_NAMES if getattr(cards, name, None) is None]
    assert missing == []


def test_an_unknown_name_is_still_an_attribute_error():
    import keras_mha.cards as cards

    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        cards.no_such_name  # noqa: B018
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("keras_mha.cards.no_such_module")


# Old modules kept as files because they rebuild their 0.2 tables from the new modules.
REBUILT = {
    "keras_mha.cards.family_defaults": ("FAMILY_DEFAULTS", "keras_mha.families"),
    "keras_mha.models.families": ("FAMILY_TRAITS", "keras_mha.families"),
}


@pytest.mark.parametrize("old", list(REBUILT))
def test_a_rebuilt_old_module_warns_and_holds_its_tables(old, monkeypatch):
    name, new = REBUILT[old]
    _forget(monkeypatch, old)
    expected = rf"^{re.escape(old)} moved to {re.escape(new)}"
    with pytest.warns(DeprecationWarning, match=expected):
        module = importlib.import_module(old)
    assert getattr(module, name)


def test_the_rebuilt_tables_come_from_the_family_modules():
    from keras_mha.cards.family_defaults import FAMILY_DEFAULTS
    from keras_mha.families import family_for
    from keras_mha.models import weight_names

    assert FAMILY_DEFAULTS["gpt2"]["n_embd"] == 768
    assert FAMILY_DEFAULTS["clip_vision_model"]["patch_size"] == 32
    with pytest.warns(DeprecationWarning, match="family_for.model_type..weights"):
        tables = weight_names.FAMILY_WEIGHT_NAMES
    assert tables["llama"] is family_for("llama").weights
