"""`HeadRoles`: what `head_roles` found, as a JSON-ready dict, a text table or markdown.

`HeadRoles.to_dict()` keys (documented in `docs/guides/head-roles.md`):

- `model`, `architecture` (`"encoder"` | `"decoder"`), `backend`;
- `data`: `tokens` (real tokens read), `sequences`, `queries` (real queries the
  statistics average over, per layer: the same for every layer);
- `thresholds`: `{role: {"statistics": [...], "at_least": x}}`, and `syntax_margin`,
  `min_relation_words`;
- `layers`: `[{"name", "index", "heads": [{"head", "role", "statistics": {name: value or
  null}, "importance": value or null}]}]`;
- `role_counts`: `{role: heads}`;
- `importance`: null or `{"method"}`; `survival`: null or `{"25%": {role: {"heads",
  "kept"}}, "50%": ...}` (see `survival`);
- `syntax`: null or the treebank report (see `syntax.SyntaxReport.to_dict`).

Example:
    >>> result = head_roles(model, text)  # doctest: +SKIP
    >>> print(result.table())  # doctest: +SKIP
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from keras_mha.analysis.roles import (
    MIXED,
    ROLE_RULES,
    ROLES,
    SYNTACTIC_PREFIX,
    LayerRoles,
)
from keras_mha.planning.render.text import DEFAULT_WIDTH, wrap

#: Colours of the roles in the pictures (Okabe-Ito, readable with colour blindness).
ROLE_COLORS = {
    "previous-token": "#0072B2",
    "next-token": "#56B4E9",
    "self": "#009E73",
    "first-token": "#D55E00",
    "delimiter": "#E69F00",
    "rare-token": "#CC79A7",
    "broad": "#F0E442",
    "local": "#A6D96A",
    MIXED: "#D9D9D9",
}
SYNTACTIC_COLOR = "#7B3294"


def role_color(role):
    """The colour of `role` (every syntactic role shares one).

    Example:
        >>> role_color("syntactic:det") == SYNTACTIC_COLOR
        True
    """
    return SYNTACTIC_COLOR if role.startswith(SYNTACTIC_PREFIX) else ROLE_COLORS[role]


#: Grid labels of the roles (syntactic heads show their relation in upper case).
SHORT_LABELS = {
    "previous-token": "prev",
    "next-token": "next",
    "self": "self",
    "first-token": "first",
    "delimiter": "delim",
    "rare-token": "rare",
    "broad": "broad",
    "local": "local",
    MIXED: "mixed",
}
CELL_WIDTH = 6


def short_label(role):
    """The grid label of `role` (at most 5 characters).

    Example:
        >>> short_label("previous-token"), short_label("syntactic:nsubj")
        ('prev', 'NSUBJ')
    """
    if role.startswith(SYNTACTIC_PREFIX):
        return role[len(SYNTACTIC_PREFIX) :][: CELL_WIDTH - 1].upper()
    return SHORT_LABELS[role]


def _number(value):
    return None if value is None else float(value)


@dataclass
class HeadRoles:
    """Statistics and roles of every head of a model, with importance and syntax if asked.

    Attributes:
        layers: attention layer paths in model order.
        layer_roles: a `LayerRoles` per layer.
        model: the model's name or source.
        architecture: `"encoder"` or `"decoder"`.
        backend: the Keras backend that ran the model.
        tokens, sequences: real tokens and sequences read.
        importance: `{path: scores}` or None; `importance_method` names the scorer.
        survival: as `survival.roles_surviving` returns, or None.
        syntax: a `syntax.SyntaxReport` or None.
    """

    layers: list
    layer_roles: list
    model: str = ""
    architecture: str = "encoder"
    backend: str = ""
    tokens: int = 0
    sequences: int = 0
    importance: dict | None = None
    importance_method: str | None = None
    survival: dict | None = None
    syntax: object = None

    @property
    def roles(self):
        """`{path: [role per head]}`."""
        return {
            path: list(layer.roles)
            for path, layer in zip(self.layers, self.layer_roles, strict=True)
        }

    @property
    def statistics(self):
        """`{path: {statistic: np.ndarray (heads,) or None}}`."""
        return {
            path: layer.statistics
            for path, layer in zip(self.layers, self.layer_roles, strict=True)
        }

    def role_counts(self):
        """`{role: number of heads}`, in precedence order, syntactic roles last.

        Example:
            >>> result.role_counts()  # doctest: +SKIP
            {'previous-token': 3, 'broad': 20, 'mixed': 49}
        """
        counts = Counter(role for layer in self.layer_roles for role in layer.roles)
        ordered = {role: counts[role] for role in ROLES if counts[role]}
        ordered.update(sorted((r, n) for r, n in counts.items() if r.startswith(SYNTACTIC_PREFIX)))
        return ordered

    def to_dict(self):
        """Everything as JSON-ready Python values (keys in the module docstring)."""
        from keras_mha.analysis import syntax as syntax_module

        layers = []
        for index, (path, layer) in enumerate(zip(self.layers, self.layer_roles, strict=True)):
            scores = None if self.importance is None else self.importance[path]
            heads = [
                {
                    "head": head,
                    "role": role,
                    "statistics": {
                        name: None if values is None else _number(values[head])
                        for name, values in layer.statistics.items()
                    },
                    "importance": None if scores is None else _number(scores[head]),
                }
                for head, role in enumerate(layer.roles)
            ]
            layers.append({"name": path, "index": index, "heads": heads})
        return {
            "model": self.model,
            "architecture": self.architecture,
            "backend": self.backend,
            "data": {
                "tokens": int(self.tokens),
                "sequences": int(self.sequences),
                "queries": int(self.layer_roles[0].queries) if self.layer_roles else 0,
            },
            "thresholds": {
                **{
                    rule.role: {"statistics": list(rule.statistics), "at_least": rule.threshold}
                    for rule in ROLE_RULES
                },
                "syntax_margin": syntax_module.SYNTAX_MARGIN,
                "min_relation_words": syntax_module.MIN_RELATION_WORDS,
            },
            "layers": layers,
            "role_counts": self.role_counts(),
            "importance": None if self.importance is None else {"method": self.importance_method},
            "survival": self.survival,
            "syntax": None if self.syntax is None else self.syntax.to_dict(),
        }

    # -------------------------------------------------------------- rendering
    def _grid_rows(self, cell):
        width = max(len(self.layer_roles[i].roles) for i in range(len(self.layers)))
        header = ["layer", *(str(head) for head in range(width))]
        rows = [
            [str(index), *(cell(index, head) for head in range(len(layer.roles)))]
            for index, layer in enumerate(self.layer_roles)
        ]
        return header, rows

    def _importance_cell(self, index, head):
        scores = self.importance[self.layers[index]]
        scale = max(
            float(np.max(np.abs(values))) for values in self.importance.values() if len(values)
        )
        value = float(scores[head]) / scale if scale > 0 else 0.0
        mark = ""
        if self.survival is not None:
            removed = self.survival.get("removed", {})
            path = self.layers[index]
            if head in removed.get("25%", {}).get(path, []):
                mark = "x"
            elif head in removed.get("50%", {}).get(path, []):
                mark = "o"
        return f"{value:.2f}{mark}"

    def _sections(self):
        """[(title, header, rows, notes)] shared by `table` and `markdown`."""
        sections = []
        header, rows = self._grid_rows(lambda i, h: short_label(self.layer_roles[i].roles[h]))
        legend = ", ".join(f"{label} = {role}" for role, label in SHORT_LABELS.items())
        notes = [legend]
        if self.syntax is not None:
            notes.append("UPPER CASE = syntactic head for that relation (see below)")
        notes.append("layers: " + ", ".join(f"{i} = {p}" for i, p in enumerate(self.layers)))
        sections.append(("roles (layer x head)", header, rows, notes))

        counts = self.role_counts()
        total = sum(counts.values())
        sections.append(
            (
                "heads per role",
                ["role", "heads", "share"],
                [[role, str(n), f"{n / total:.0%}"] for role, n in counts.items()],
                [],
            )
        )
        if self.importance is not None:
            header, rows = self._grid_rows(self._importance_cell)
            notes = [
                f"{self.importance_method} importance / largest |importance|; "
                "x = removed at 25%, o = removed at 50% (global ranking)"
            ]
            sections.append(("importance (layer x head)", header, rows, notes))
        if self.survival is not None:
            rows = []
            for role in counts:
                cells = [role, str(self.survival["25%"][role]["heads"])]
                for level in ("25%", "50%"):
                    entry = self.survival[level][role]
                    cells.append(f"{entry['kept']} ({entry['kept'] / entry['heads']:.0%})")
                rows.append(cells)
            sections.append(
                (
                    "which roles survive pruning",
                    ["role", "heads", "kept at 25%", "kept at 50%"],
                    rows,
                    [],
                )
            )
        if self.syntax is not None:
            sections.append(self.syntax.section(self.layers))
        return sections

    def summary(self):
        """One line: model, architecture, layers, heads, tokens read, backend."""
        heads = sum(layer.num_heads for layer in self.layer_roles)
        return (
            f"{self.model}: {self.architecture}, {len(self.layers)} attention layers, {heads} "
            f"heads; {self.tokens:,} tokens in {self.sequences:,} sequences ({self.backend})"
        )

    def table(self, width=DEFAULT_WIDTH):
        """Plain-text tables: the role grid, heads per role, importance, survival, syntax,
        within `width` columns (`UNLIMITED`: `--wide`): a grid too wide for it continues in
        blocks of heads, its layer column repeated; notes wrap.

        Example:
            >>> print(result.table())  # doctest: +SKIP
        """
        from keras_mha.safe_text import one_line

        lines = wrap(one_line(self.summary()), width, "", "  ")
        for title, header, rows, notes in self._sections():
            lines += ["", title]
            lines += _columns_in_blocks([header, *rows], width)
            for note in notes:
                lines += wrap(one_line(note), width, "  ", "    ")
        return "\n".join(lines)

    def markdown(self):
        """The same tables in GitHub markdown (values escaped).

        Example:
            >>> print(result.markdown())  # doctest: +SKIP
        """
        from keras_mha.planning.render.report import markdown_text as markdown_cell

        lines = [f"# {markdown_cell(self.summary())}"]
        for title, header, rows, notes in self._sections():
            lines += ["", f"## {title}", ""]
            lines.append("| " + " | ".join(markdown_cell(c) for c in header) + " |")
            lines.append("|" + "---|" * len(header))
            for row in rows:
                padded = [*row, *[""] * (len(header) - len(row))]
                lines.append("| " + " | ".join(markdown_cell(c) for c in padded) + " |")
            if notes:
                lines.append("")
                lines += [f"- {markdown_cell(note)}" for note in notes]
        return "\n".join(lines)


def _columns_in_blocks(rows, width):
    """Rows of cells (the first column a label) as aligned lines within `width`: columns
    one space apart in a layer x head grid (its cells are short labels, and 12 heads then
    fit 80 columns), two otherwise; the columns after the first continue in further
    blocks, each repeating the first column."""
    count = max(len(row) for row in rows)
    widths = [
        max(CELL_WIDTH - 1, *(len(str(row[column])) for row in rows if column < len(row)))
        for column in range(count)
    ]
    gap = " " if str(rows[0][0]) == "layer" else "  "
    blocks, block, used = [], [], widths[0]
    for column in range(1, count):
        if block and used + len(gap) + widths[column] > width:
            blocks.append(block)
            block, used = [], widths[0]
        block.append(column)
        used += len(gap) + widths[column]
    blocks.append(block)
    lines = []
    for number, block in enumerate(blocks):
        if number:
            lines.append("")
        for row in rows:
            cells = [str(row[0]).ljust(widths[0])] + [
                str(row[column]).ljust(widths[column]) if column < len(row) else ""
                for column in block
            ]
            lines.append(gap.join(cells).rstrip())
    return lines


__all__ = [
    "ROLE_COLORS",
    "SHORT_LABELS",
    "SYNTACTIC_COLOR",
    "HeadRoles",
    "LayerRoles",
    "role_color",
    "short_label",
]
