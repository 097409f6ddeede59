"""Regenerate `card.md` beside every bundled card, with the CLI itself.

Each card's report is exactly what `keras-mha inspect bundled:ORG/NAME --format markdown`
prints, so the shipped reports can never drift from the tool:

    python -m tools.render_bundled_cards          # rewrite every card.md
    python -m tools.render_bundled_cards --check  # exit 1 and list stale ones

Example:
    >>> from tools.render_bundled_cards import card_markdown
    >>> card_markdown("meta-llama/Meta-Llama-3-8B").splitlines()[0]
    '# meta-llama/Meta-Llama-3-8B'
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path

from keras_mha.hub.bundled import bundled_card_directory, list_bundled

CARD_FILENAME = "card.md"


def inspect_arguments(repo_id: str) -> list[str]:
    """The `keras-mha` arguments that produce the card of `repo_id`.

    Example:
        >>> inspect_arguments("openai-community/gpt2")
        ['inspect', 'bundled:openai-community/gpt2', '--format', 'markdown']
    """
    return ["inspect", f"bundled:{repo_id}", "--format", "markdown"]


def card_markdown(repo_id: str) -> str:
    """What `keras-mha inspect bundled:<repo_id> --format markdown` prints; raises on failure.

    Example:
        >>> "## KV cache" in card_markdown("openai-community/gpt2")
        True
    """
    from keras_mha.cli import main as cli_main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        exit_code = cli_main(inspect_arguments(repo_id))
    if exit_code != 0:
        raise RuntimeError(
            f"keras-mha {' '.join(inspect_arguments(repo_id))} exited with {exit_code}: "
            f"{stderr.getvalue().strip()}"
        )
    return stdout.getvalue()


def card_path(repo_id: str) -> Path:
    """Where the card's `card.md` lives (beside its config.json).

    Example:
        >>> card_path("openai-community/gpt2").name
        'card.md'
    """
    directory = bundled_card_directory(repo_id)
    if directory is None:
        raise ValueError(f"repo_id={repo_id!r} is not a bundled card")
    return directory / CARD_FILENAME


def stale_cards() -> list[str]:
    """Repo ids whose `card.md` is missing or differs from a fresh rendering.

    Example:
        >>> stale_cards()
        []
    """
    stale = []
    for repo_id in list_bundled():
        path = card_path(repo_id)
        if not path.is_file() or path.read_text(encoding="utf-8") != card_markdown(repo_id):
            stale.append(repo_id)
    return stale


def main(argv: list[str] | None = None) -> int:
    """Rewrite every bundled `card.md` (or, with --check, only report stale ones)."""
    parser = argparse.ArgumentParser(prog="python -m tools.render_bundled_cards")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if any card.md is stale"
    )
    arguments = parser.parse_args(argv)
    if arguments.check:
        stale = stale_cards()
        for repo_id in stale:
            print(f"stale: {card_path(repo_id)}")
        print(f"{len(list_bundled()) - len(stale)} current, {len(stale)} stale")
        return 1 if stale else 0
    for repo_id in list_bundled():
        path = card_path(repo_id)
        text = card_markdown(repo_id)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
