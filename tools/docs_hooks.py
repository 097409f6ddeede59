"""MkDocs hooks that write the reference pages from the code at build time, so they cannot drift.

A page asks for a generated section with a marker alone on a line:

    <!-- generated: cli -->                      every `keras-mha` subcommand, from argparse
    <!-- generated: exit-codes -->               `keras_mha.errors`' classes and exit codes
    <!-- generated: gpus -->                     the planner's `--gpu` table
    <!-- generated: cards -->                    the bundled cards, one row each
    <!-- generated: export-sizes -->             which families export a smaller pruned checkpoint
    <!-- generated: api keras_mha.models -->     every name in a module's `__all__`

and each bundled card's `card.md` becomes a page `reference/cards/<org>/<name>.md`. The
generators are plain functions returning Markdown; `tests/test_docs_site.py` calls them too.
mkdocs.yml names this file under `hooks:`.

Example:
    >>> "| 9 | `ConfigError`" in exit_codes()  # doctest: +SKIP
    True
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import inspect
import io
import json
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- generated: ([\w-]+)(?: ([\w.]+))? -->$", re.M)
CARD_PAGES = "reference/cards"
# Where the `--gpu` table lives.
GPU_TABLE_MODULE = "keras_mha.planning.planner.gpus"
# Width argparse wraps usage lines at, so the page does not depend on the terminal.
USAGE_COLUMNS = "88"


def cell(text: object) -> str:
    """Text made safe for one Markdown table cell.

    Example:
        >>> cell("a | b\\nc")
        'a \\\\| b c'
    """
    return " ".join(str(text).split()).replace("|", "\\|")


def table(header: list[str], rows: list[list[object]]) -> str:
    """A Markdown table.

    Example:
        >>> print(table(["a", "b"], [[1, 2]]))
        | a | b |
        |---|---|
        | 1 | 2 |
    """
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


@contextlib.contextmanager
def _columns(width: str):
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = width
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous


def _cli_output(argv: list[str]) -> str:
    """What `keras-mha ARGV` prints on stdout (run in this process)."""
    from keras_mha.cli import main

    stdout = io.StringIO()
    with _columns(USAGE_COLUMNS), contextlib.redirect_stdout(stdout):
        main(argv)
    return stdout.getvalue().rstrip("\n")


# ----------------------------------------------------------------------------- the CLI
def _argument_rows(parser: argparse.ArgumentParser) -> list[list[str]]:
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings:
            name = ", ".join(action.option_strings)
            if action.nargs != 0:
                name += " " + formatter._format_args(action, action.dest.upper())
        else:
            name = formatter._format_args(action, action.dest)
        help_text = formatter._expand_help(action) if action.help else ""
        if action.choices and "{" not in name:  # a metavar hides the choices
            help_text += f" (one of: {', '.join(map(str, action.choices))})"
        rows.append([f"`{name}`", help_text])
    return rows


def _code(text: str) -> str:
    return f"```text\n{text}\n```"


def _usage(parser: argparse.ArgumentParser) -> str:
    with _columns(USAGE_COLUMNS):
        return parser.format_usage().strip()


def cli_reference() -> str:
    """Every `keras-mha` subcommand: what it does, its usage line and its arguments, read
    from the parser `keras_mha.cli.build_parser()` builds (and `bench`'s own `--help`).

    Example:
        >>> "## keras-mha inspect" in cli_reference()  # doctest: +SKIP
        True
    """
    from keras_mha.cli import build_parser

    with _columns(USAGE_COLUMNS):
        parser = build_parser()
    sections = [_code(_usage(parser)), table(["argument", "meaning"], _argument_rows(parser))]
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    summaries = {choice.dest: choice.help for choice in subcommands._choices_actions}
    for name, subparser in subcommands.choices.items():
        sections.append(f"## keras-mha {name}\n\n{summaries.get(name) or ''}")
        if not subparser.add_help:  # `bench`: each benchmark parses its own flags
            sections.append(_bench_reference())
            continue
        if subparser.description:
            sections.append(subparser.description)
        sections.append(_code(_usage(subparser)))
        rows = _argument_rows(subparser)
        if rows:
            sections.append(table(["argument", "meaning"], rows))
    return "\n\n".join(sections)


def _bench_reference() -> str:
    overview = _cli_output(["bench", "--help"])
    sections = [_code(overview)]
    for target in re.findall(r"^  (\w+)  ", overview, flags=re.M):
        sections.append(f"### keras-mha bench {target}")
        sections.append(_code(_cli_output(["bench", target, "--help"])))
    return "\n\n".join(sections)


# ----------------------------------------------------------------------------- errors
def _summary(docstring: str | None) -> str:
    return " ".join((docstring or "").strip().split("\n\n")[0].split())


def exit_codes() -> str:
    """The exit codes and error classes of `keras_mha.errors`, one row per class, then the
    codes that belong to no class (read with their `#:` comments).

    Example:
        >>> "`UsageError`" in exit_codes()  # doctest: +SKIP
        True
    """
    from keras_mha import errors

    base = errors.KerasMHAError
    classes = [value for value in vars(errors).values() if isinstance(value, type)]
    classes = sorted((c for c in classes if issubclass(c, base)), key=lambda c: c.exit_code)
    rows = []
    for error in classes:
        builtins = [b.__name__ for b in error.__mro__[1:] if b.__module__ == "builtins"]
        rows.append(
            [error.exit_code, f"`{error.__name__}`", f"`{builtins[0]}`", _summary(error.__doc__)]
        )
    # `#: comment` lines above a constant document it (the Sphinx convention).
    source = Path(errors.__file__).read_text(encoding="utf-8")
    for comment, name in re.findall(r"((?:^#:.*\n)+)^(\w+_EXIT_CODE) =", source, flags=re.M):
        rows.append([getattr(errors, name), "", "", _summary(comment.replace("#:", ""))])
    return table(["exit code", "error class", "builtin base", "when"], rows)


# ----------------------------------------------------------------------------- GPUs
def _gpu_module():
    return importlib.import_module(GPU_TABLE_MODULE)


def _gpu_value(field: str, value: object) -> str:
    if field.endswith("_bytes") and isinstance(value, int):
        return f"{value // 2**20:,} MiB"
    if isinstance(value, (tuple, list)):
        return ", ".join(f"`{item}`" for item in value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1e4:
        return si_number(value)
    return str(value)


def si_number(value: float) -> str:
    """A large number with an SI prefix, the unit left to the column's name.

    Example:
        >>> si_number(3.35e12), si_number(989_000_000_000_000)
        ('3.35 T', '989 T')
    """
    for exponent, prefix in ((18, "E"), (15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k")):
        if value >= 10**exponent:
            return f"{value / 10**exponent:.4g} {prefix}"
    return f"{value:g}"


def gpu_table() -> str:
    """The accelerators `--gpu` knows, every field of the planner's table as a column.

    Example:
        >>> "H100 80GB SXM" in gpu_table()  # doctest: +SKIP
        True
    """
    module = _gpu_module()
    rows = list(module.GPUS)
    fields = [field.name for field in dataclasses.fields(rows[0])]
    header = [field.replace("_bytes", "").replace("_", " ") for field in fields]
    return table(header, [[_gpu_value(f, getattr(gpu, f)) for f in fields] for gpu in rows])


# ----------------------------------------------------------------------------- cards
def _card_directories() -> dict[str, Path]:
    return {
        str(path.parent.relative_to(ROOT / "cards")): path.parent
        for path in sorted((ROOT / "cards").glob("*/*/card.md"))
    }


def cards_table() -> str:
    """One row per bundled card, from `keras-mha inspect bundled:ID --format json` (the
    JSON keys other tools rely on), each linking to the card's page.

    Example:
        >>> "meta-llama/Meta-Llama-3-8B" in cards_table()  # doctest: +SKIP
        True
    """
    rows = []
    for model_id in _card_directories():
        report = json.loads(_cli_output(["inspect", f"bundled:{model_id}", "--format", "json"]))
        attention = report["attention"]
        heads = f"{attention['num_attention_heads']} / {attention['num_key_value_heads']}"
        rows.append(
            [
                f"[{model_id}](cards/{model_id}.md)",
                report["model_type"],
                attention["kind"],
                heads,
                f"{report['parameters']['total']:,}",
                f"{report['context_length']:,}" if report.get("context_length") else "",
                f"{report['kv_cache']['bytes_per_token']:,}",
            ]
        )
    header = ["model", "type", "attention", "heads / KV heads", "parameters", "context",
              "KV bytes per token (bfloat16)"]  # fmt: skip
    return table(header, rows)


# ----------------------------------------------------------------------------- pruned exports
# What each `Family.head_size_in_config` layout means for a pruned export (the rule itself:
# `keras_mha.models.export`): what the config can state, and what the export holds.
EXPORT_LAYOUTS = {
    "explicit": (
        "`head_dim`",
        "fewer `num_attention_heads` / `num_key_value_heads`, `head_dim` explicit: genuinely "
        "smaller, and so is its KV cache",
    ),
    "explicit_divisor": (
        "`head_dim`, and transformers requires `hidden_size % num_attention_heads == 0`",
        "smaller when the heads left divide `hidden_size` (e.g. 50%); otherwise zero heads are "
        "added inside each KV group up to the next count that does (the KV heads, and so the "
        "KV cache, stay pruned), with a warning",
    ),
    "derived": (
        "nothing: the head size is `hidden_size / num_attention_heads`",
        "every head kept, the removed heads' weights zeroed: the same outputs, a file of the "
        "same size, a warning and a note in the report",
    ),
}


def export_sizes() -> str:
    """One row per `head_size_in_config` layout, naming the families of the registry that
    `from_pretrained` builds with it.

    Example:
        >>> "`mistral`" in export_sizes().split("\\n")[2]  # doctest: +SKIP
        True
    """
    from keras_mha.families import unique_families
    from keras_mha.families._family import HEAD_SIZE_LAYOUTS

    rows = []
    for layout in HEAD_SIZE_LAYOUTS:
        states, export = EXPORT_LAYOUTS[layout]
        names = sorted(f.name for f in unique_families() if f.head_size_in_config == layout)
        rows.append([", ".join(f"`{name}`" for name in names), states, export])
    return table(["families (`model_type`)", "the config states", "the pruned export"], rows)


# ----------------------------------------------------------------------------- Python API
# The modules that have an API page ({module: page}), found by on_files; a name several of
# them export is documented once, on the page of the module it is defined under.
API_PAGES: dict[str, str] = {}


def _public_names(module_name: str) -> list[str]:
    """A module's `__all__`, or else the names defined in it."""
    module = importlib.import_module(module_name)
    return getattr(module, "__all__", None) or [
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == module_name
    ]


def _owner(name: str, defined_in: str, pages: dict[str, str]) -> str | None:
    """The API page that documents `name`: the deepest page module it is defined under
    that also exports it (`keras_mha.plan` lives under `keras_mha.planning`, which does not
    export it, so `keras_mha`'s page documents it)."""
    candidates = [
        m
        for m in pages
        if (defined_in == m or defined_in.startswith(m + ".")) and name in _public_names(m)
    ]
    return max(candidates, key=len, default=None)


def api_reference(module_name: str, pages: dict[str, str] | None = None) -> str:
    """A mkdocstrings entry for every public name of `module_name` (its `__all__`, lazy
    names included), at the path where it is defined; a name that another API page owns
    (it is defined under that page's module) is a link to it instead.

    Example:
        >>> text = api_reference("keras_mha.pruning")  # doctest: +SKIP
        >>> "::: keras_mha.pruning.callback.HeadPruning" in text  # doctest: +SKIP
        True
    """
    pages = API_PAGES if pages is None else pages
    module = importlib.import_module(module_name)
    entries, elsewhere = [], []
    for name in _public_names(module_name):
        value = getattr(module, name)
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            entries.append(f"## {name}\n\n{constant_reference(f'{module_name}.{name}', value)}")
            continue
        path = f"{value.__module__}.{value.__qualname__}"
        owner = _owner(name, value.__module__, pages)
        if owner in (None, module_name):
            entries.append(f"::: {path}")
        else:
            elsewhere.append(f"[`{name}`][{path}] ({owner})")
    if elsewhere:
        entries.insert(0, "Also importable from here: " + ", ".join(elsewhere) + ".")
    # The module's own docstring first, without its members (they follow, one by one).
    options = "    options:\n      members: false\n      show_root_heading: false"
    entries.insert(0, f"::: {module_name}\n{options}")
    return "\n\n".join(entries)


# A constant whose repr is longer is summarised (a registry of records is pages long).
CONSTANT_REPR_LIMIT = 200


def constant_reference(path: str, value: object) -> str:
    """A public constant: a sequence of dataclass records (a rule table) as a Markdown table
    of their fields; a short value as its repr; a long mapping by its keys, another long
    value by its type and length.

    Example:
        >>> Rule = dataclasses.make_dataclass("Rule", ["role", "threshold"])
        >>> print(constant_reference("m.RULES", (Rule("self", 0.5),)))
        `m.RULES`: a tuple of `Rule`
        <BLANKLINE>
        | role | threshold |
        |---|---|
        | self | 0.5 |
        >>> constant_reference("m.TABLE", {str(n): "x" * 50 for n in range(5)})
        '`m.TABLE`: a dict of 5 entries, keyed by `0`, `1`, `2`, `3`, `4`'
    """
    records = list(value) if isinstance(value, (tuple, list)) else []
    if records and all(dataclasses.is_dataclass(record) for record in records):
        fields = [field.name for field in dataclasses.fields(records[0])]
        rows = [[_record_value(getattr(record, f)) for f in fields] for record in records]
        kind = f"a {type(value).__name__} of `{type(records[0]).__name__}`"
        return f"`{path}`: {kind}\n\n" + table(fields, rows)
    text = repr(value)
    if len(text) <= CONSTANT_REPR_LIMIT:
        return f"`{path}` = `{text}`"
    if isinstance(value, dict):
        keys = ", ".join(f"`{key}`" for key in value)
        return f"`{path}`: a dict of {len(value)} entries, keyed by {keys}"
    return f"`{path}`: a {type(value).__name__} of {len(value)} items"


def _record_value(value: object) -> str:
    if isinstance(value, (tuple, list)):
        return ", ".join(map(str, value))
    return str(value)


GENERATORS = {
    "cli": cli_reference,
    "exit-codes": exit_codes,
    "gpus": gpu_table,
    "cards": cards_table,
    "export-sizes": export_sizes,
    "api": api_reference,
}


def expand(markdown: str) -> str:
    """`markdown` with every `<!-- generated: ... -->` marker replaced by its section.

    Example:
        >>> expand("no markers here")
        'no markers here'
    """
    return MARKER.sub(lambda match: GENERATORS[match[1]](*filter(None, [match[2]])), markdown)


# ----------------------------------------------------------------------------- MkDocs events
def on_files(files, config):
    """Add one page per bundled card, its `card.md` as it ships."""
    from mkdocs.structure.files import File, InclusionLevel

    API_PAGES.clear()
    for file in files.documentation_pages():
        for match in MARKER.finditer(Path(file.abs_src_path).read_text(encoding="utf-8")):
            if match[1] == "api":
                API_PAGES[match[2]] = file.src_uri
    for model_id, directory in _card_directories().items():
        content = (directory / "card.md").read_text(encoding="utf-8")
        page = File.generated(config, f"{CARD_PAGES}/{model_id}.md", content=content)
        page.inclusion = InclusionLevel.NOT_IN_NAV  # reached from the bundled-cards table
        files.append(page)
    return files


def on_page_markdown(markdown, page, config, files):
    return expand(markdown)
