"""Find the curated config snapshots ("bundled cards") that ship with keras-mha.

A bundled card is a directory `<org>/<name>/` holding a snapshot of the model's Hub
`config.json` and a `source.json` (`repo_id`, `revision`, `source`, `notes`) saying how
that snapshot was obtained (most were written without Hub access, from memory of the
public file, and checked against the published parameter count) and where the numbers
come from. In an installed wheel the cards live
inside the package at `keras_mha/_bundled_cards/`; in a source checkout or an
editable install they live at the top-level `cards/` directory of the repository.

Only the standard library is imported here, so that `keras-mha inspect` starts fast.

Example:
    >>> from keras_mha.hub.bundled import bundled_config_path, list_bundled
    >>> "meta-llama/Meta-Llama-3-8B" in list_bundled()
    True
    >>> bundled_config_path("meta-llama/Meta-Llama-3-8B").name
    'config.json'
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

# Written by the wheel build (pyproject.toml: force-include "cards" -> keras_mha/_bundled_cards).
_WHEEL_DIRECTORY_NAME = "_bundled_cards"
_PACKAGE_DIRECTORY = Path(__file__).resolve().parent.parent


def bundled_cards_root() -> Path | None:
    """The directory holding the bundled cards, or None when neither location exists.

    The wheel location wins over the source checkout, so an installed package never
    reads cards from whatever directory happens to sit next to it.

    Example:
        >>> bundled_cards_root().is_dir()
        True
    """
    for candidate in (
        _PACKAGE_DIRECTORY / _WHEEL_DIRECTORY_NAME,
        _PACKAGE_DIRECTORY.parent / "cards",
    ):
        if candidate.is_dir():
            return candidate
    return None


@functools.lru_cache(maxsize=1)
def _index() -> dict[str, Path]:
    """Map of repo id -> card directory, for every `<org>/<name>/config.json` under the root."""
    root = bundled_cards_root()
    if root is None:
        return {}
    cards = {}
    for config_path in sorted(root.glob("*/*/config.json")):
        card_directory = config_path.parent
        cards[f"{card_directory.parent.name}/{card_directory.name}"] = card_directory
    return cards


def list_bundled() -> list[str]:
    """Repo ids (`org/name`) of every bundled card, sorted.

    Example:
        >>> len(list_bundled()) >= 30
        True
    """
    return sorted(_index())


def bundled_card_directory(model_id: str) -> Path | None:
    """The card directory for `model_id`, matched exactly first and then ignoring case
    (the Hub treats repo ids case-insensitively); None when there is no such card.

    Example:
        >>> bundled_card_directory("META-LLAMA/meta-llama-3-8b").name
        'Meta-Llama-3-8B'
        >>> bundled_card_directory("gpt2").parent.name
        'openai-community'
    """
    cards = _index()
    if model_id in cards:
        return cards[model_id]
    folded = model_id.casefold()
    for repo_id, card_directory in cards.items():
        if repo_id.casefold() == folded:
            return card_directory
    if "/" not in model_id:
        # Legacy ids without an organisation ("gpt2", "bert-base-uncased"), which the Hub
        # redirects to their organisation's repo; only when the name is unambiguous.
        named = [d for repo_id, d in cards.items() if repo_id.split("/")[1].casefold() == folded]
        if len(named) == 1:
            return named[0]
    return None


def bundled_config_path(model_id: str) -> Path | None:
    """Path of the bundled `config.json` for `model_id`, or None when it is not bundled.

    Example:
        >>> bundled_config_path("no-such-org/no-such-model") is None
        True
    """
    card_directory = bundled_card_directory(model_id)
    return None if card_directory is None else card_directory / "config.json"


def close_bundled_ids(model_id: str, limit: int = 3) -> list[str]:
    """Bundled repo ids close to a mistyped `model_id` (whole id or just the name part,
    ignoring case), best first; [] when none is close.

    Example:
        >>> close_bundled_ids("meta-llama/Meta-Llama-3-8b-typo")[0]
        'meta-llama/Meta-Llama-3-8B'
        >>> close_bundled_ids("Mistral-7B-v0.1")[0]
        'mistralai/Mistral-7B-v0.1'
    """
    import difflib

    if not isinstance(model_id, str) or not model_id or len(model_id) > 200:
        return []
    by_folded_id = {repo_id.casefold(): repo_id for repo_id in _index()}
    by_folded_name: dict[str, list[str]] = {}
    for repo_id in _index():
        by_folded_name.setdefault(repo_id.split("/")[-1].casefold(), []).append(repo_id)
    folded = model_id.casefold()
    matches = [
        by_folded_id[match]
        for match in difflib.get_close_matches(folded, list(by_folded_id), n=limit, cutoff=0.75)
    ]
    name = folded.split("/")[-1]
    for match in difflib.get_close_matches(name, list(by_folded_name), n=limit, cutoff=0.8):
        matches += [repo_id for repo_id in by_folded_name[match] if repo_id not in matches]
    return matches[:limit]


def bundled_source(model_id: str) -> dict:
    """The card's `source.json` (`repo_id`, `revision`, `source`, `notes`), or {} if absent.

    Example:
        >>> bundled_source("meta-llama/Meta-Llama-3-8B")["repo_id"]
        'meta-llama/Meta-Llama-3-8B'
    """
    card_directory = bundled_card_directory(model_id)
    if card_directory is None:
        return {}
    source_path = card_directory / "source.json"
    if not source_path.is_file():
        return {}
    with open(source_path, encoding="utf-8") as source_file:
        return json.load(source_file)


def did_you_mean(repo_id: str) -> str:
    """'; did you mean X (bundled:X)?' for a mistyped id of a bundled model, else '', to
    end a message about `repo_id`.

    Example:
        >>> did_you_mean("openai-community/gpt-2")
        '; did you mean openai-community/gpt2 (bundled:openai-community/gpt2)?'
    """
    if bundled_config_path(repo_id) is not None:
        return ""
    close = close_bundled_ids(repo_id)
    if not close:
        return ""
    return "; did you mean " + " or ".join(f"{name} (bundled:{name})" for name in close) + "?"


__all__ = [
    "bundled_card_directory",
    "close_bundled_ids",
    "did_you_mean",
    "bundled_cards_root",
    "bundled_config_path",
    "bundled_source",
    "list_bundled",
]
