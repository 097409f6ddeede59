"""GPT-2 (openai-community/gpt2, distilgpt2): pre-norm LayerNorm blocks, learned
absolute positions, a `gelu_new` MLP, a head tied to the embeddings.

Its checkpoint keeps torch `Conv1D` weights (`(in, out)`, a Dense kernel's layout) and
one fused `c_attn` whose columns are q, k, v. transformers derives the head size as
n_embd / n_head, so a pruned GPT-2 exports with its removed heads as zero weights.

Example:
    >>> FAMILY.traits["position_embedding"], FAMILY.blocks.default_activation
    ('learned', 'gelu_new')
"""

from keras_mha.families._family import Blocks, Family
from keras_mha.families._presets import CLASSIC_TRAITS, COMMON_KEYS, LEARNED_POSITIONS
from keras_mha.families._weights import (
    ATTENTION,
    WeightNames,
    WeightRule,
    dense,
    fused_qkv,
    layer_norm,
    output_projection,
)


def gpt2(reader, fields: dict) -> None:
    """GPT-2: a learned position table, optional unscaled or per-layer-scaled attention."""
    fields["learned_position_rows"] = fields["max_position_embeddings"]
    if not reader.flag("scale_attn_weights", True):
        fields["attention_scale"] = 1.0
    fields["inverse_layer_scale"] = reader.flag("scale_attn_by_inverse_layer_idx", False)


_LAYER = "{prefix}h.{layer}"
_BLOCK = "blocks.{layer}"

FAMILY = Family(
    "gpt2",
    keys={**COMMON_KEYS, "intermediate_size": ("n_inner",)},
    traits={**CLASSIC_TRAITS, **LEARNED_POSITIONS},
    ffn_factor=4,
    hooks=(gpt2,),
    defaults={
        "vocab_size": 50257,
        "n_positions": 1024,
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "scale_attn_weights": True,
        "tie_word_embeddings": True,
    },
    blocks=Blocks("decoder", default_activation="gelu_new", default_norm_epsilon=1e-5),
    weights=WeightNames(
        # GPT2LMHeadModel keeps the model under transformer.; the Hub's gpt2 has no stem.
        prefixes=("transformer.", ""),
        anchor="{prefix}wte.weight",
        rules=(
            WeightRule("{prefix}wte.weight", ("token_embedding.embeddings",)),
            WeightRule("{prefix}wpe.weight", ("position_embedding.embeddings",)),
            *layer_norm("{prefix}ln_f", "final_norm"),
            WeightRule("lm_head.weight", ("lm_head.kernel",), "transpose"),
            *layer_norm(f"{_LAYER}.ln_1", f"{_BLOCK}.attention_norm"),
            *fused_qkv(f"{_LAYER}.attn.c_attn", "columns"),
            *output_projection(f"{_LAYER}.attn.c_proj", ATTENTION, conv1d=True),
            *layer_norm(f"{_LAYER}.ln_2", f"{_BLOCK}.mlp_norm"),
            *dense(f"{_LAYER}.mlp.c_fc", f"{_BLOCK}.up_proj", conv1d=True),
            *dense(f"{_LAYER}.mlp.c_proj", f"{_BLOCK}.down_proj", conv1d=True),
        ),
        # Older checkpoints store the causal mask (attn.bias) and its fill (masked_bias).
        buffers=(r"\.attn\.bias$", r"\.attn\.masked_bias$"),
    ),
    head_size_in_config="derived",
)
