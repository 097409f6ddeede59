"""`keras-mha cards`: list the bundled model cards, one `org/name<TAB>revision` per line.

Example:
    >>> from keras_mha.cli import main
    >>> main(["cards"])  # doctest: +SKIP
    0
"""

from __future__ import annotations

import argparse

from keras_mha.commands.output import write_stdout
from keras_mha.hub.bundled import bundled_source, list_bundled


def add_parser(subcommands) -> argparse.ArgumentParser:
    """Register `cards` on the CLI's subparsers.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> cards = add_parser(parser.add_subparsers(dest="command"))
        >>> parser.parse_args(["cards"]).run is run
        True
    """
    parser = subcommands.add_parser(
        "cards",
        help="list the bundled model cards",
        description=(
            "List the model cards bundled with keras-mha: curated config.json snapshots of "
            "popular Hub models, one `org/name<TAB>revision` per line. `keras-mha inspect "
            "bundled:org/name` reads one without network; a Hub id answers from its card "
            "when the Hub cannot be reached."
        ),
    )
    parser.set_defaults(run=run)
    return parser


def run(arguments: argparse.Namespace | None = None) -> int:
    """Print every bundled card's repo id and snapshot revision; returns the exit status.

    Example:
        >>> run()  # doctest: +SKIP
        EleutherAI/pythia-1b\t...
        0
    """
    lines = [
        f"{repo_id}\t{bundled_source(repo_id).get('revision') or ''}" for repo_id in list_bundled()
    ]
    write_stdout("\n".join(lines))
    return 0
