"""The `--plot` picture: a layers x heads grid coloured by role, importance beside it.

Drawn with matplotlib's Agg canvas directly, so saving never touches the caller's
pyplot backend or needs a display (as `keras_mha.pruning.heatmap`).

Example:
    >>> save_roles_plot(result, "heads.png")  # doctest: +SKIP
    'heads.png'
"""

from __future__ import annotations

import numpy as np

from keras_mha.analysis.result import ROLE_COLORS, SYNTACTIC_COLOR, role_color, short_label


def _legend_entries(result):
    present = {role for layer in result.layer_roles for role in layer.roles}
    entries = [(role, color) for role, color in ROLE_COLORS.items() if role in present]
    if any(role.startswith("syntactic:") for role in present):
        entries.append(("syntactic:<relation>", SYNTACTIC_COLOR))
    return entries


def save_roles_plot(result, path, title=None):
    """Save a PNG of `result` (a `HeadRoles`): roles per layer and head, and importance.

    Args:
        result: from `head_roles`.
        path: a file name or a binary file object.
        title: the figure's title (default: the model's name).

    Returns:
        `path`.

    Raises:
        ImportError: matplotlib is not installed (`pip install 'keras-mha[plot]'`).
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.colors import to_rgb
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("--plot needs matplotlib: pip install 'keras-mha[plot]'") from error
    num_layers = len(result.layers)
    num_heads = max(layer.num_heads for layer in result.layer_roles)
    colors = np.ones((num_layers, num_heads, 3))
    for row, layer in enumerate(result.layer_roles):
        for head, role in enumerate(layer.roles):
            colors[row, head] = to_rgb(role_color(role))
    panels = 2 if result.importance is not None else 1
    cell = 0.42
    figure = Figure(
        figsize=(1.2 + panels * (cell * num_heads + 1.0) + 1.8, 1.3 + cell * num_layers),
        dpi=100,
    )
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, panels, squeeze=False)[0]
    roles_axis = axes[0]
    roles_axis.imshow(colors, aspect="auto", interpolation="nearest")
    for row, layer in enumerate(result.layer_roles):
        for head, role in enumerate(layer.roles):
            label = short_label(role)
            dark = role.startswith("syntactic:") or role in ("previous-token", "first-token")
            roles_axis.text(
                head, row, label, ha="center", va="center", fontsize=5.5,
                color="white" if dark else "black",
            )  # fmt: skip
    roles_axis.set_title("role", fontsize=9)
    if result.importance is not None:
        matrix = np.full((num_layers, num_heads), np.nan)
        for row, layer_path in enumerate(result.layers):
            scores = np.asarray(result.importance[layer_path], dtype="float64")
            matrix[row, : len(scores)] = scores
        image = axes[1].imshow(np.ma.masked_invalid(matrix), cmap="viridis", aspect="auto")
        figure.colorbar(image, ax=axes[1], fraction=0.05)
        removed = (result.survival or {}).get("removed", {})
        for marker, level in (("x", "25%"), ("o", "50%")):
            for row, layer_path in enumerate(result.layers):
                for head in removed.get(level, {}).get(layer_path, []):
                    if marker == "o" and head in removed.get("25%", {}).get(layer_path, []):
                        continue
                    axes[1].text(head, row, marker, ha="center", va="center", color="white")
        axes[1].set_title(
            f"{result.importance_method or ''} importance (x: pruned at 25%, o: at 50%)",
            fontsize=9,
        )
    for axis in axes:
        axis.set_xlabel("head")
        axis.set_xticks(range(num_heads))
        axis.set_yticks(range(num_layers))
        axis.tick_params(labelsize=7)
    roles_axis.set_ylabel("layer")
    figure.legend(
        handles=[Patch(color=color, label=role) for role, color in _legend_entries(result)],
        loc="center right",
        fontsize=7,
        frameon=False,
    )
    figure.suptitle(title or result.model, fontsize=10)
    figure.tight_layout(rect=(0, 0, 1 - 1.8 / figure.get_figwidth(), 1))
    figure.savefig(path, format="png")
    return path


__all__ = ["save_roles_plot"]
