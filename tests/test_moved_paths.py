"""The import paths that moved in 0.4 keep working for one release: each old module path
is the new module and each old name the new object, with a `DeprecationWarning` naming
the new path. That nothing inside keras-mha imports through them:
tests/test_import_structure.py."""

import importlib
import re
import sys

import pytest

from keras_mha.moved_paths import MOVED_MODULES, MOVED_NAMES

pytestmark = pytest.mark.backend_independent

# `keras_mha.cards.__all__` of 0.3, which users import from.
CARDS_0_3_NAMES = [
    "CardError", "ConfigError", "ConfigFileNotFoundError", "GatedRepositoryError",
    "HubUnreachableError", "KVCacheCost", "MalformedConfigError", "ModelSpec",
    "ParameterCounts", "RepositoryNotFoundError", "RevisionNotFoundError", "from_config",
    "kv_cache_cost", "parameter_counts",
]  # fmt: skip


def _forget(monkeypatch, old: str) -> None:
    """Make the next `import old` a first import again (the alias is cached once imported)."""
    for name in list(sys.modules):
        if name == old or name.startswith(old + "."):
            monkeypatch.delitem(sys.modules, name)
    parent, _, leaf = old.rpartition(".")
    if parent in sys.modules:
        monkeypatch.delattr(sys.modules[parent], leaf, raising=False)


@pytest.mark.parametrize("old, new", sorted(MOVED_MODULES.items()))
def test_an_old_module_path_warns_and_is_the_new_module(old, new, monkeypatch):
    _forget(monkeypatch, old)
    expected = rf"^{re.escape(old)} moved to {re.escape(new)}; import it from there"
    with pytest.warns(DeprecationWarning, match=expected):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert importlib.import_module(old) is module  # cached: later imports are the same


def test_a_module_inside_a_moved_package_is_not_loaded_twice(monkeypatch):
    # Found through the new package's __path__, it would be a second copy of the module.
    _forget(monkeypatch, "keras_mha.cards")
    with pytest.warns(DeprecationWarning):
        from keras_mha.cards.planner import gpus
        from keras_mha.cards.rendering.report import render_table
    from keras_mha.planning.planner import gpus as new_gpus
    from keras_mha.planning.render import report

    assert gpus is new_gpus
    assert render_table is report.render_table


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
    _forget(monkeypatch, "keras_mha.cards")
    with pytest.warns(DeprecationWarning) as caught:
        from keras_mha.cards.planner.gpus import find_gpu  # noqa: F401
    assert caught and {warning.filename for warning in caught} == {__file__}


def test_every_0_3_cards_name_still_imports(monkeypatch):
    _forget(monkeypatch, "keras_mha.cards")
    with pytest.warns(DeprecationWarning):
        cards = importlib.import_module("keras_mha.cards")
    missing = [name for name in CARDS_0_3_NAMES if getattr(cards, name, None) is None]
    assert missing == []


def test_an_unknown_path_is_still_an_error():
    cards = importlib.import_module("keras_mha.planning")
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        cards.no_such_name  # noqa: B018
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("keras_mha.cards.no_such_module")


@pytest.mark.parametrize(
    "old",
    ["keras_mha.cards.hub", "keras_mha.cards.family_defaults", "keras_mha.models.families"],
)
def test_the_paths_that_moved_in_0_3_are_gone(old):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)
