"""The `--html` page: one self-contained file with the role grid and each head's attention.

Everything is inline: the data as JSON, the CSS and the JavaScript (`page/`), with no
link to the network (no CDN, no font, no image). Clicking a cell of the layers x heads
grid draws that head's attention for the chosen sentence token to token, in the
manner of bertviz's head view: queries on the left, keys on the right, a line per
weight of at least 0.02, its opacity the weight; hovering a query token keeps only
its lines. The sentences are the first few of the text (`attention_examples`); their
maps are kept as one byte per weight (`round(255 * p)`), so that the page of a big
model stays a few megabytes.

Example:
    >>> examples = attention_examples(model, tokenizer, text, causal=False)  # doctest: +SKIP
    >>> Path("heads.html").write_text(render_page(result, examples))  # doctest: +SKIP
"""

from __future__ import annotations

import base64
import html
import json
from importlib import resources

import numpy as np

from keras_mha.analysis.result import ROLE_COLORS, SHORT_LABELS, role_color, short_label

#: Sentences shown on the page, and their most tokens (longer ones are passed over).
PAGE_SENTENCES = 6
PAGE_MAX_TOKENS = 40
_DARK = ("previous-token", "first-token")
# The page may load nothing: no script, style, font, image or connection from anywhere.
_POLICY = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'"


def _token_text(tokenizer, token_id):
    text = tokenizer.decode([int(token_id)], skip_special_tokens=False).strip()
    return text or tokenizer.id_to_token(int(token_id)) or str(int(token_id))


def attention_examples(model, tokenizer, text, *, causal, count=PAGE_SENTENCES):
    """`[{"text", "tokens", "attention"}]` for the first `count` sentences of `text` that
    have 3 to `PAGE_MAX_TOKENS` tokens; `attention` is `(layers, max heads, T, T)` uint8,
    base64-encoded.

    Each sentence is encoded as the model reads text: with the tokenizer's special
    tokens for encoders; with its prefix (BOS) only for decoders. keras-mha's whole
    models read them in one padded batch; other models one sentence at a time.
    """
    from keras_mha.analysis.calls import model_inputs, takes_padding_mask
    from keras_mha.analysis.recording import record_attention
    from keras_mha.data.text import prefix_tokens, split_sentences
    from keras_mha.pruning.discovery import require_attention_layers
    from keras_mha.pruning.gate_gradients import no_gradient_tracking

    layers = require_attention_layers(model)
    heads = max(layer.num_heads for layer in layers.values())
    prefix = prefix_tokens(tokenizer) if causal else []
    chosen = []
    for sentence in split_sentences(text):
        if causal:
            ids = prefix + tokenizer.encode(sentence, add_special_tokens=False).ids
        else:
            ids = tokenizer.encode(sentence, add_special_tokens=True).ids
        if 3 <= len(ids) <= PAGE_MAX_TOKENS:
            chosen.append((sentence, ids))
        if len(chosen) == count:
            break
    groups = [chosen] if takes_padding_mask(model) else [[item] for item in chosen]
    to_inputs = model_inputs(model)
    examples = []
    for group in groups if chosen else []:
        length = max(len(ids) for _, ids in group)
        token_ids = np.zeros((len(group), length), dtype="int32")
        mask = np.zeros((len(group), length), dtype=bool)
        for row, (_, ids) in enumerate(group):
            token_ids[row, : len(ids)], mask[row, : len(ids)] = ids, True
        with record_attention(model) as probe, no_gradient_tracking():
            model(to_inputs(token_ids, mask), training=False)
        for row, (sentence, ids) in enumerate(group):
            n = len(ids)
            weights = np.zeros((len(layers), heads, n, n), dtype="uint8")
            for index, path in enumerate(layers):
                maps = probe.attention[path][row, :, :n, :n]
                weights[index, : maps.shape[0]] = np.round(np.clip(maps, 0, 1) * 255)
            examples.append(
                {
                    "text": sentence,
                    "tokens": [_token_text(tokenizer, i) for i in ids],
                    "attention": base64.b64encode(weights.tobytes()).decode("ascii"),
                }
            )
    return examples


def page_data(result, examples):
    """The JSON the page's script reads: layers, heads (role, colour, statistics), legend."""
    layers = []
    for path, layer in zip(result.layers, result.layer_roles, strict=True):
        heads = []
        for head, role in enumerate(layer.roles):
            statistics = {
                name: None if values is None else round(float(values[head]), 4)
                for name, values in layer.statistics.items()
            }
            if result.importance is not None:
                statistics["importance"] = float(result.importance[path][head])
            heads.append(
                {
                    "role": role,
                    "label": short_label(role),
                    "color": role_color(role),
                    "dark": role.startswith("syntactic:") or role in _DARK,
                    "statistics": statistics,
                }
            )
        layers.append({"name": path, "heads": heads})
    legend = [
        {"role": role, "label": SHORT_LABELS[role], "color": color}
        for role, color in ROLE_COLORS.items()
    ]
    if result.syntax is not None:
        legend.append(
            {"role": "syntactic:<relation>", "label": "RELATION", "color": role_color("syntactic:")}
        )
    return {
        "model": result.model,
        "layers": layers,
        "heads_per_layer_max": max(layer.num_heads for layer in result.layer_roles),
        "legend": legend,
        "examples": examples,
    }


def _asset(name):
    return resources.files("keras_mha.analysis").joinpath("page", name).read_text("utf-8")


def render_page(result, examples):
    """The whole page as a string (UTF-8 HTML, no external resource).

    Example:
        >>> "<script" in render_page(result, [])  # doctest: +SKIP
        True
    """
    # JSON inside <script>: "<" escaped so that no text can close the element.
    payload = json.dumps(page_data(result, examples), allow_nan=False).replace("<", "\\u003c")
    title = html.escape(f"{result.model}: attention heads")
    summary = html.escape(result.summary())
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{_POLICY}">
<title>{title}</title>
<style>
{_asset("heads.css")}
</style>
</head>
<body>
<h1>{title}</h1>
<div class="summary">{summary}</div>
<div class="legend" id="legend"></div>
<div class="layout">
  <div><table class="grid" id="grid"></table></div>
  <div>
    <div class="controls">sentence: <select id="sentence"></select></div>
    <div id="head-title">click a cell to see that head's attention</div>
    <div id="head-stats"></div>
    <div id="attention"></div>
  </div>
</div>
<script type="application/json" id="heads-data">{payload}</script>
<script>
{_asset("heads.js")}
</script>
</body>
</html>
"""


__all__ = ["PAGE_MAX_TOKENS", "PAGE_SENTENCES", "attention_examples", "page_data", "render_page"]
