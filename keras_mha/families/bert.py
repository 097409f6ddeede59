"""BERT (google-bert/*, sentence-transformers MiniLM, ...): a post-norm bidirectional
encoder with absolute learned positions and token types.

transformers derives BERT's head size as hidden_size / heads, so a pruned BERT exports
with its removed heads as zero weights (the outputs are the pruned model's).

Example:
    >>> FAMILY.blocks.kind, FAMILY.head_size_in_config
    ('encoder', 'derived')
"""

from keras_mha.families._family import Blocks, Family
from keras_mha.families._presets import CLASSIC_TRAITS, COMMON_KEYS, LEARNED_POSITIONS
from keras_mha.families._weights import bert_style


def bert(reader, fields: dict) -> None:
    """BERT: absolute positions, token types, encoder-only unless `is_decoder`."""
    fields["learned_position_rows"] = fields["max_position_embeddings"]
    fields["token_type_vocab_size"] = reader.integer("type_vocab_size", "count", default=0)
    position_type = reader.text("position_embedding_type", "absolute")
    if position_type != "absolute":
        fields["notes"].append(
            f"position_embedding_type={position_type!r} is counted as absolute positions"
        )


FAMILY = Family(
    "bert",
    keys={**COMMON_KEYS, "intermediate_size": ("intermediate_size",)},
    traits={
        **CLASSIC_TRAITS,
        **LEARNED_POSITIONS,
        "final_norms": 0,
        "embedding_norms": 1,
        "is_decoder": False,
    },
    switches={"is_decoder": ("is_decoder",)},
    hooks=(bert,),
    defaults={
        "vocab_size": 30522,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "hidden_act": "gelu",
        "max_position_embeddings": 512,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "is_decoder": False,
        "tie_word_embeddings": True,
    },
    default_head="base",
    base_pooler=True,
    blocks=Blocks("encoder", default_activation="gelu", default_norm_epsilon=1e-12),
    weights=bert_style(),
    head_size_in_config="derived",
)
