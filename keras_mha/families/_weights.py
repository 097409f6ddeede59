"""Checkpoint tensor names as data: `WeightRule`, `WeightNames` and the layouts families share.

A family's `weights` is one `WeightNames` table: a list of `WeightRule`s, each tying one
Hub tensor name (with `{prefix}` and `{layer}` placeholders) to one or more variables of
a keras-mha model (dotted attribute paths from the model,
`blocks.{layer}.attention.query_kernel`) through a named transform. The same table
loads a whole model (`keras_mha.models.from_pretrained`), writes it back
(`save_pretrained`) and fills a single rebuilt attention layer
(`keras_mha.models.load_attention_weights`, which keeps the rules under
`blocks.{layer}.attention.`). The transforms themselves are NumPy code in
`keras_mha.models.weight_names.TRANSFORMS`; here they are only named:

| transform | Hub tensor | model variable(s) |
|---|---|---|
| `identity` | `x` | `x` |
| `transpose` | torch Linear `(out, in)` | Dense kernel `(in, out)` |
| `to_heads` | `(H * D, F)` | `(F, H, D)` (q/k/v kernels) |
| `bias_to_heads` | `(H * D,)` | `(H, D)` |
| `from_heads` | `(F, H * D)` | `(H, D, F)` (output kernel) |
| `conv1d_from_heads` | Conv1D `(H * D, F)` | `(H, D, F)` (GPT-2's `c_proj`) |
| `one_plus` | `w` | `1 + w` (q/k norms of families whose norms multiply by `1 + w`) |
| `split_qkv` | `(Hq * D + 2 * Hkv * D, F)`, rows q, k, v | query, key, value kernels |
| `split_qkv_columns` | Conv1D `(F, Hq * D + 2 * Hkv * D)` | query, key, value kernels |
| `split_qkv_bias` | `(Hq * D + 2 * Hkv * D,)` | query, key, value biases |
| `split_qkv_per_group` | per KV head: its query heads, its key, its value | q, k, v kernels |
| `split_qkv_bias_per_group` | the same, for biases | q, k, v biases |
| `split_gate_up` | `(2 * I, F)` | gate and up Dense kernels `(F, I)` |

Shapes are never stored in a table: they come from the model's variables, so a model
whose heads were pruned exports its smaller tensors unchanged.

Example:
    >>> names = llama_style()
    >>> names.rule_for("model.layers.3.self_attn.q_proj.weight", prefix="model.").variables
    ('blocks.3.attention.query_kernel',)
"""

from __future__ import annotations

import re
from collections import namedtuple

TRANSFORM_NAMES = (
    "identity",
    "transpose",
    "to_heads",
    "bias_to_heads",
    "from_heads",
    "conv1d_from_heads",
    "one_plus",
    "split_qkv",
    "split_qkv_columns",
    "split_qkv_bias",
    "split_qkv_per_group",
    "split_qkv_bias_per_group",
    "split_gate_up",
)
QKV = ("query", "key", "value")


# Named tuples, not dataclasses: `keras-mha inspect` imports these, and a dataclass costs
# about a millisecond to define (its methods are compiled with `exec`).
class WeightRule(namedtuple("WeightRule", "hub variables transform", defaults=("identity",))):
    """One Hub tensor and the model variable(s) it becomes.

    Attributes:
        hub: the Hub name with `{prefix}` (the model's stem, e.g. `model.`) and, for
            per-layer tensors, `{layer}` placeholders.
        variables: dotted attribute paths from the model to each variable, with `{layer}`.
        transform: one of `TRANSFORM_NAMES`.
    """

    __slots__ = ()

    def __new__(cls, hub: str, variables: tuple[str, ...], transform: str = "identity"):
        if transform not in TRANSFORM_NAMES:
            raise ValueError(f"WeightRule({hub!r}): unknown transform {transform!r}")
        return super().__new__(cls, hub, tuple(variables), transform)

    @property
    def per_layer(self) -> bool:
        return "{layer}" in self.hub

    def hub_name(self, prefix: str, layer: int | None = None) -> str:
        return self.hub.format(prefix=prefix, layer=layer)

    def variable_paths(self, layer: int | None = None) -> tuple[str, ...]:
        return tuple(v.format(layer=layer) for v in self.variables)

    def pattern(self, prefix: str) -> re.Pattern:
        """A regex matching this rule's Hub names, capturing the layer index."""
        text = re.escape(self.hub.replace("{prefix}", "\0P").replace("{layer}", "\0L"))
        text = text.replace(re.escape("\0P"), re.escape(prefix)).replace(
            re.escape("\0L"), r"(?P<layer>\d+)"
        )
        return re.compile(text)


class BoundRule(namedtuple("BoundRule", "rule hub_name variables layer")):
    """A rule for one concrete Hub tensor (prefix and layer filled in)."""

    __slots__ = ()

    @property
    def transform(self) -> str:
        return self.rule.transform


class WeightNames(
    namedtuple("WeightNames", "prefixes anchor rules ignored buffers", defaults=((), ()))
):
    """A family's checkpoint layout.

    Attributes:
        prefixes: candidate stems tried in order; the first for which `anchor` exists wins
            (multimodal checkpoints keep the language model under a longer stem).
        anchor: a Hub name (with `{prefix}`) present in every checkpoint of the layout.
        rules: the tensors.
        ignored: regexes of tensors the keras-mha model does not hold but that belong to
            the checkpoint (BERT's pooler, a masked-LM head): skipped when loading, copied
            unchanged by `save_pretrained`.
        buffers: regexes of tensors that are not weights (rotary caches, causal-mask
            buffers, position ids): skipped when loading, never written.
    """

    __slots__ = ()

    def rule_for(self, hub_name: str, *, prefix: str) -> BoundRule | None:
        """The rule (bound to its layer) that `hub_name` belongs to, or None."""
        for rule in self.rules:
            match = rule.pattern(prefix).fullmatch(hub_name)
            if match:
                layer = int(match.group("layer")) if rule.per_layer else None
                return BoundRule(rule, hub_name, rule.variable_paths(layer), layer)
        return None

    def is_ignored(self, hub_name: str) -> bool:
        return any(re.search(pattern, hub_name) for pattern in self.ignored)

    def is_buffer(self, hub_name: str) -> bool:
        return any(re.search(pattern, hub_name) for pattern in self.buffers)

    def find_prefix(self, keys) -> str | None:
        """The first of `prefixes` whose anchor is among `keys`, or None."""
        keys = set(keys)
        for prefix in self.prefixes:
            if self.anchor.format(prefix=prefix) in keys:
                return prefix
        return None

    def with_prefixes(self, *prefixes: str, **changes) -> WeightNames:
        """The same layout under other stems (and other fields `changes`)."""
        return self._replace(prefixes=prefixes, **changes)


# -- layouts several families share ---------------------------------------------------------------

ATTENTION = "blocks.{layer}.attention"
# Llama's norms: one before attention, one before the MLP.
PRE_NORMS = {"input_layernorm": "attention_norm", "post_attention_layernorm": "mlp_norm"}
# Gemma 2/3 normalise each sublayer's input and output; note the shifted meaning of
# `post_attention_layernorm` (Llama's pre-MLP norm, Gemma 2's post-attention norm).
SANDWICH_NORMS = {
    "input_layernorm": "attention_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "mlp_norm",
    "post_feedforward_layernorm": "post_mlp_norm",
}
# Multimodal checkpoints keep the language model under model.language_model. (transformers
# 5) or language_model.model. (earlier).
LLAMA_PREFIXES = ("model.", "model.language_model.", "language_model.model.", "")
ROTARY_BUFFERS = (r"rotary_emb\.inv_freq$",)


def projections(hub_block: str, stem: str = ATTENTION, *, output: str = "o_proj") -> list:
    """Separate q/k/v/output Linear projections with optional biases (Llama's `q_proj`, ...)."""
    rules = []
    for hub, ours in zip(("q_proj", "k_proj", "v_proj"), QKV, strict=True):
        rules += [
            WeightRule(f"{hub_block}.{hub}.weight", (f"{stem}.{ours}_kernel",), "to_heads"),
            WeightRule(f"{hub_block}.{hub}.bias", (f"{stem}.{ours}_bias",), "bias_to_heads"),
        ]
    return rules + output_projection(f"{hub_block}.{output}", stem)


def output_projection(hub: str, stem: str = ATTENTION, *, conv1d: bool = False) -> list:
    """The output projection `hub` (`.weight`, `.bias`) of the attention at `stem`."""
    return [
        WeightRule(
            f"{hub}.weight",
            (f"{stem}.output_kernel",),
            "conv1d_from_heads" if conv1d else "from_heads",
        ),
        WeightRule(f"{hub}.bias", (f"{stem}.output_bias",)),
    ]


def fused_qkv(hub: str, layout: str, stem: str = ATTENTION, *, bias: bool = True) -> list:
    """One fused q/k/v tensor `hub` (`.weight`, and `.bias` when `bias`).

    `layout` is "rows" (q, k, v stacked: Phi-3), "columns" (GPT-2's Conv1D) or
    "per_group" (per KV head its queries, key and value: GPT-NeoX, Falcon, GPTBigCode).
    """
    weights = {"rows": "split_qkv", "columns": "split_qkv_columns"}
    kernels = tuple(f"{stem}.{name}_kernel" for name in QKV)
    biases = tuple(f"{stem}.{name}_bias" for name in QKV)
    per_group = layout == "per_group"
    rules = [WeightRule(f"{hub}.weight", kernels, weights.get(layout, "split_qkv_per_group"))]
    if bias:
        transform = "split_qkv_bias_per_group" if per_group else "split_qkv_bias"
        rules.append(WeightRule(f"{hub}.bias", biases, transform))
    return rules


def qk_norms(hub_block: str, transform: str = "identity", stem: str = ATTENTION) -> list:
    """RMS q/k norms (`q_norm`, `k_norm`) of the attention at `stem`."""
    return [
        WeightRule(f"{hub_block}.{hub}.weight", (f"{stem}.{ours}_norm_scale",), transform)
        for hub, ours in (("q_norm", "query"), ("k_norm", "key"))
    ]


def layer_norm(hub: str, ours: str) -> list:
    """A LayerNorm with bias (`hub.weight`, `hub.bias`) as a Keras LayerNormalization."""
    return [
        WeightRule(f"{hub}.weight", (f"{ours}.gamma",)),
        WeightRule(f"{hub}.bias", (f"{ours}.beta",)),
    ]


def dense(hub: str, ours: str, *, conv1d: bool = False) -> list:
    """A Linear (`(out, in)`, transposed) or Conv1D (`(in, out)`) layer with optional bias."""
    return [
        WeightRule(f"{hub}.weight", (f"{ours}.kernel",), "identity" if conv1d else "transpose"),
        WeightRule(f"{hub}.bias", (f"{ours}.bias",)),
    ]


def llama_style(
    *, norms: dict | None = None, fused: bool = False, norm_scale_offset: float = 0.0
) -> WeightNames:
    """The `model.layers.{i}.self_attn` / `mlp` layout of Llama and the families built like it.

    Args:
        norms: Hub norm name -> block attribute (`PRE_NORMS` or `SANDWICH_NORMS`).
        fused: Phi-3's fused `qkv_proj` and `gate_up_proj`.
        norm_scale_offset: the family's `Blocks.norm_scale_offset`: with 1, norms multiply
            by `1 + w`, so q/k norm weights load as `1 + w` (the attention layer's q/k
            norm multiplies by its scale alone).
    """
    qk_norm = "one_plus" if norm_scale_offset == 1.0 else "identity"
    layer = "{prefix}layers.{layer}"
    attention = f"{layer}.self_attn"
    if fused:
        rules = fused_qkv(f"{attention}.qkv_proj", "rows", bias=False)
        rules += output_projection(f"{attention}.o_proj")
        rules.append(
            WeightRule(
                f"{layer}.mlp.gate_up_proj.weight",
                ("blocks.{layer}.gate_proj.kernel", "blocks.{layer}.up_proj.kernel"),
                "split_gate_up",
            )
        )
    else:
        rules = projections(attention)
        rules += dense(f"{layer}.mlp.gate_proj", "blocks.{layer}.gate_proj")
        rules += dense(f"{layer}.mlp.up_proj", "blocks.{layer}.up_proj")
    rules += [
        *dense(f"{layer}.mlp.down_proj", "blocks.{layer}.down_proj"),
        *qk_norms(attention, qk_norm),
        *(
            WeightRule(f"{layer}.{hub}.weight", (f"blocks.{{layer}}.{ours}.scale",))
            for hub, ours in (norms or PRE_NORMS).items()
        ),
        WeightRule("{prefix}embed_tokens.weight", ("token_embedding.embeddings",)),
        WeightRule("{prefix}norm.weight", ("final_norm.scale",)),
        WeightRule("lm_head.weight", ("lm_head.kernel",), "transpose"),
    ]
    return WeightNames(
        prefixes=LLAMA_PREFIXES,
        anchor="{prefix}embed_tokens.weight",
        rules=tuple(rules),
        buffers=ROTARY_BUFFERS,
    )


def attention_only(prefixes: tuple[str, ...], anchor: str, rules: list) -> WeightNames:
    """The attention tensors of a family keras-mha does not build whole (single-layer
    `load_attention_weights` reads them; rotary caches are buffers)."""
    return WeightNames(prefixes, anchor, tuple(rules), buffers=ROTARY_BUFFERS)


def bert_style() -> WeightNames:
    """BERT's `embeddings` / `encoder.layer.{i}.attention.self.query` / ... layout (no stem
    for `BertModel` and sentence-transformers, `bert.` under a task head)."""
    layer = "{prefix}encoder.layer.{layer}"
    blocks = "blocks.{layer}"
    rules = [
        WeightRule("{prefix}embeddings.word_embeddings.weight", ("token_embedding.embeddings",)),
        WeightRule(
            "{prefix}embeddings.position_embeddings.weight", ("position_embedding.embeddings",)
        ),
        WeightRule(
            "{prefix}embeddings.token_type_embeddings.weight",
            ("token_type_embedding.embeddings",),
        ),
        *layer_norm("{prefix}embeddings.LayerNorm", "embeddings_norm"),
    ]
    for name in QKV:
        rules += [
            WeightRule(
                f"{layer}.attention.self.{name}.weight",
                (f"{ATTENTION}.{name}_kernel",),
                "to_heads",
            ),
            WeightRule(
                f"{layer}.attention.self.{name}.bias",
                (f"{ATTENTION}.{name}_bias",),
                "bias_to_heads",
            ),
        ]
    rules += [
        *output_projection(f"{layer}.attention.output.dense"),
        *layer_norm(f"{layer}.attention.output.LayerNorm", f"{blocks}.attention_norm"),
        *dense(f"{layer}.intermediate.dense", f"{blocks}.intermediate"),
        *dense(f"{layer}.output.dense", f"{blocks}.output_dense"),
        *layer_norm(f"{layer}.output.LayerNorm", f"{blocks}.output_norm"),
    ]
    return WeightNames(
        prefixes=("", "bert."),
        anchor="{prefix}embeddings.word_embeddings.weight",
        rules=tuple(rules),
        # The pooler and task heads (BertForMaskedLM's cls.*) are not part of the encoder.
        ignored=(r"(^|\.)pooler\.", r"^cls\."),
        buffers=(r"embeddings\.position_ids$", r"embeddings\.token_type_ids$"),
    )


__all__ = [
    "ATTENTION",
    "BoundRule",
    "LLAMA_PREFIXES",
    "PRE_NORMS",
    "SANDWICH_NORMS",
    "TRANSFORM_NAMES",
    "WeightNames",
    "WeightRule",
    "attention_only",
    "bert_style",
    "dense",
    "fused_qkv",
    "layer_norm",
    "llama_style",
    "output_projection",
    "projections",
    "qk_norms",
]
