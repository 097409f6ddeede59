"""PNG heatmaps (layers x heads) of head importance and of the pruned heads.

Drawn with matplotlib's Agg canvas directly, so that saving a figure never
touches the global pyplot backend of the caller (or needs a display).
"""

from __future__ import annotations

import numpy as np

from keras_mha.errors import PruningError


def _matrix(per_layer, fill=np.nan):
    width = max(len(values) for values in per_layer.values())
    matrix = np.full((len(per_layer), width), fill, dtype="float64")
    for row, values in enumerate(per_layer.values()):
        matrix[row, : len(values)] = values
    return matrix


def save_head_heatmap(path, importance, gates, title=None):
    """Save a two-panel PNG: importance per head, and which heads are pruned.

    Rows are layers, columns query heads. Layers with fewer heads leave their
    extra cells blank. Pruned means gate 0.

    Args:
        path: file to write (`.png`).
        importance: `{layer path: scores}` as from `head_importance`, or None
            to draw the pruned heads only.
        gates: `{layer path: gate values}` as from `get_head_gates`.
        title: figure title.

    Returns:
        `path`.

    Example:
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "heads.png"
        >>> importance = {"block_0": np.array([0.3, 0.1]), "block_1": np.array([0.2, 0.4])}
        >>> gates = {"block_0": np.array([1.0, 0.0]), "block_1": np.array([1.0, 1.0])}
        >>> pathlib.Path(save_head_heatmap(path, importance, gates)).is_file()
        True
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("Heatmaps need matplotlib: pip install 'keras-mha[plot]'.") from error
    if not gates:
        raise ValueError("`gates` is empty; expected {layer path: gate values}.")
    layer_names = list(gates)
    pruned = _matrix({path: (np.asarray(g) == 0).astype("float64") for path, g in gates.items()})
    panels = [("pruned (gate = 0)", pruned, "Reds")]
    if importance:
        ordered = {path: np.asarray(importance[path], dtype="float64") for path in layer_names}
        for layer_path, scores in ordered.items():
            if not np.isfinite(scores).all():
                # A NaN cell would be drawn blank, like a head the layer does not have.
                raise PruningError(
                    f"`importance[{layer_path!r}]` has non-finite scores {scores.tolist()}; "
                    "expected finite scores (as head_importance returns).",
                    key=layer_path,
                )
        panels.insert(0, ("importance", _matrix(ordered), "viridis"))
    num_heads = pruned.shape[1]
    figure = Figure(
        figsize=(1.5 + 0.35 * num_heads * len(panels) + 2.5, 1.2 + 0.35 * len(layer_names))
    )
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for axis, (name, matrix, colormap) in zip(axes, panels, strict=True):
        image = axis.imshow(np.ma.masked_invalid(matrix), cmap=colormap, aspect="auto")
        axis.set_title(name, fontsize=9)
        axis.set_xlabel("head")
        axis.set_xticks(range(num_heads))
        axis.set_yticks(range(len(layer_names)))
        axis.set_yticklabels(layer_names if axis is axes[0] else [], fontsize=7)
        figure.colorbar(image, ax=axis, fraction=0.05)
    if title:
        figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=100)
    return path
