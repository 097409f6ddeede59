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
