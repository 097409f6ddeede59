"""The documentation site builds with `--strict` and its generated reference holds every
command, flag and error; the docstring examples pass as doctests; every script in examples/
is linked from a page."""

import doctest
import importlib
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import current_backend
from tests.docs_examples import ROOT

# One leg runs the docstring examples: torch's eager ops cost a fraction of JAX's (each of
# which compiles); examples print shapes as tuples, the same on every backend.
DOCTEST_BACKEND = "torch"
DOCTEST_PACKAGES = ("keras_mha", "benchmarks", "tools")
# ... and the doc-test collector's own examples.
DOCTEST_MODULES = ("tests.docs_examples",)
# Names every docstring example may use without importing them: NumPy and keras, as in
# Keras's docstrings, and the attention layers.
DOCTEST_GLOBALS = {
    "np": "numpy",
    "keras": "keras",
    "GroupedQueryAttention": "keras_mha.layers:GroupedQueryAttention",
    "MultiHeadAttention": "keras_mha.layers:MultiHeadAttention",
    "MultiQueryAttention": "keras_mha.layers:MultiQueryAttention",
}


# ----------------------------------------------------------------------------- the site
@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    environment = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-5000:]
    return site


def page_text(site: Path, page: str) -> str:
    html = (site / page / "index.html").read_text(encoding="utf-8")
    return re.sub(r"<[^>]+>", "", html)


@pytest.mark.backend_independent
def test_site_builds_strictly_with_generated_reference(built_site):
    from keras_mha import errors
    from keras_mha.cli import build_parser
    from keras_mha.families import unique_families

    cli = page_text(built_site, "reference/cli")
    subcommands = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices)
    for name, parser in subcommands.choices.items():
        assert f"keras-mha {name}" in cli
        for action in parser._actions:
            for flag in action.option_strings:
                assert flag in cli, (name, flag)
    codes = page_text(built_site, "reference/exit-codes")
    for value in vars(errors).values():
        if isinstance(value, type) and issubclass(value, errors.KerasMHAError):
            assert value.__name__ in codes
    cards = page_text(built_site, "reference/cards")
    assert "8,030,261,248" in cards  # Meta-Llama-3-8B's parameters, from its card
    assert (built_site / "reference/cards/meta-llama/Meta-Llama-3-8B/index.html").is_file()
    api = page_text(built_site, "reference/api/pruning")
    assert "HeadPruning" in api and "prune_heads" in api
    exports = page_text(built_site, "guides/prune-checkpoint")  # the table of families
    assert all(f.name in exports for f in unique_families() if f.head_size_in_config)


@pytest.mark.backend_independent
def test_exit_code_table_lists_every_error_class_and_code():
    import importlib.util

    from keras_mha import cli, errors

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "tools" / "docs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    table = hooks.exit_codes()
    for error_class in errors.ERROR_CLASSES:
        assert f"| {error_class.exit_code} | `{error_class.__name__}` |" in table
    codes = (errors.INTERNAL_ERROR_EXIT_CODE, errors.INTERRUPTED_EXIT_CODE, cli.EXIT_BROKEN_PIPE)
    for code in codes:
        assert re.search(rf"^\| {code} \|", table, flags=re.M), code


# ----------------------------------------------------------------------------- doctests
def doctest_modules():
    for package in DOCTEST_PACKAGES:
        folder = ROOT / package
        if not (folder / "__init__.py").is_file():
            continue
        yield package
        for module in pkgutil.walk_packages([str(folder)], prefix=f"{package}."):
            if not module.name.endswith(".__main__"):  # importing it would run the program
                yield module.name
    yield from DOCTEST_MODULES


def _global(target):
    """`"module"` or `"module:attribute"`."""
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attribute) if attribute else module


@pytest.mark.skipif(
    current_backend() != DOCTEST_BACKEND,
    reason=f"docstring examples run under KERAS_BACKEND={DOCTEST_BACKEND}",
)
@pytest.mark.parametrize("module_name", list(doctest_modules()))
def test_docstring_examples(module_name):
    module = importlib.import_module(module_name)
    extra = {name: _global(target) for name, target in DOCTEST_GLOBALS.items()}
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in doctest.DocTestFinder().find(module, module_name):
        test.globs = {**extra, **test.globs}
        runner.run(test)
    results = runner.summarize(verbose=False)
    assert results.failed == 0, f"{results.failed} docstring example(s) of {module_name} failed"


# ----------------------------------------------------------------------------- examples/
@pytest.mark.backend_independent
def test_every_example_script_is_linked_from_a_page():
    pages = "\n".join(path.read_text(encoding="utf-8") for path in (ROOT / "docs").rglob("*.md"))
    for script in sorted((ROOT / "examples").glob("*.py")):
        assert f"examples/{script.name})" in pages, f"no page links examples/{script.name}"
