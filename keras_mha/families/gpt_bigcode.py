"""GPTBigCode (bigcode/starcoder, santacoder): GPT-2's blocks with multi-query attention
and torch Linear weights.

Its fused `c_attn` holds, per KV head, that head's queries, key and value: all queries
then one key and one value with `multi_query`, q/k/v per head without. Described by
`inspect` and rebuilt layer by layer; not built whole.

Example:
    >>> FAMILY.weights.rules[0].transform
    'split_qkv_per_group'
"""

from dataclasses import replace

from keras_mha.families._weights import attention_only, fused_qkv, output_projection
from keras_mha.families.gpt2 import FAMILY as GPT2
from keras_mha.families.gpt2 import gpt2


def multi_query(reader, fields: dict) -> None:
    """GPTBigCode: one KV head unless `multi_query` is false."""
    if reader.flag("multi_query", True):
        fields["num_key_value_heads"] = 1


_ATTENTION = "{prefix}h.{layer}.attn"

FAMILY = replace(
    GPT2,
    name="gpt_bigcode",
    hooks=(gpt2, multi_query),
    defaults={**GPT2.defaults, "activation_function": "gelu_pytorch_tanh", "multi_query": True},
    blocks=None,
    not_built="GPT-2 blocks with multi-query attention (only its attention layers load)",
    weights=attention_only(
        ("transformer.", ""),
        "{prefix}wte.weight",
        fused_qkv(f"{_ATTENTION}.c_attn", "per_group") + output_projection(f"{_ATTENTION}.c_proj"),
    ),
    head_size_in_config=None,
)
