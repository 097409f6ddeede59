"""Every runnable block of README.md and docs/ runs as written (rules in
`tests/docs_examples.py`), and the README stays an introduction. The site build and the
docstring examples are in `test_docs_site.py` (a file of their own, so that pytest-xdist
runs the two halves on two workers)."""

import re

import pytest

from tests.conftest import BACKEND_FOR_BACKEND_INDEPENDENT_TESTS, current_backend
from tests.docs_examples import ROOT, PageRun, all_blocks

BLOCKS = all_blocks()


def runs_in_this_leg(block) -> bool:
    if block.skip_reason or block.only_backend not in (None, current_backend()):
        return False
    once = block.once_reason or not block.needs_backend
    return not once or current_backend() == BACKEND_FOR_BACKEND_INDEPENDENT_TESTS


def block_params():
    for block in BLOCKS:
        marks = [] if block.needs_backend else [pytest.mark.backend_independent]
        yield pytest.param(block, id=block.name, marks=marks)


_pages: dict[str, PageRun] = {}


@pytest.mark.parametrize("block", block_params())
def test_documentation_block_runs(block):
    if block.skip_reason:
        pytest.skip(block.skip_reason)
    if block.only_backend not in (None, current_backend()):
        pytest.skip(f"written for KERAS_BACKEND={block.only_backend}")
    if block.once_reason and current_backend() != BACKEND_FOR_BACKEND_INDEPENDENT_TESTS:
        pytest.skip(
            f"runs once, under KERAS_BACKEND={BACKEND_FOR_BACKEND_INDEPENDENT_TESTS}: "
            + block.once_reason
        )
    page = _pages.setdefault(block.path, PageRun(block.path))
    # Later blocks build on earlier ones (names, files): run those first (once each).
    for earlier in BLOCKS:
        if earlier.path == block.path and earlier.line < block.line and runs_in_this_leg(earlier):
            page.run(earlier)
    page.run(block)


@pytest.mark.backend_independent
def test_every_runnable_block_is_run_or_says_why_not():
    """A skipped block names its reason; the README's quick starts all run."""
    readme = [block for block in BLOCKS if block.path == "README.md"]
    quick_start = [block for block in readme if block.language in ("python", "console")]
    assert len(quick_start) >= 3
    assert all(block.skip_reason is None for block in quick_start), quick_start


@pytest.mark.backend_independent
def test_readme_is_an_introduction_not_a_log():
    """At most 300 lines, and no measurement log (times of day, load averages)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 300
    assert not re.search(r"\d\d:\d\d UTC|load average|\d{4}-\d\d-\d\d", readme)
