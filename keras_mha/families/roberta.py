"""RoBERTa (FacebookAI/roberta-*): BERT's encoder with position ids offset by the
padding index.

RoBERTa numbers the positions of the tokens that are not `pad_token_id` from
`pad_token_id + 1` on, and gives padding the position `pad_token_id`:
`position_ids = cumsum(mask) * mask + pad_token_id` with `mask = token_ids !=
pad_token_id`, as transformers' `RobertaEmbeddings` does; so its position table has
`pad_token_id + 1` more rows than the longest input (514 for 512 tokens).

Example:
    >>> FAMILY.weights.prefixes, FAMILY.defaults["pad_token_id"]
    (('', 'roberta.'), 1)
"""

from dataclasses import replace

from keras_mha.families.bert import FAMILY as BERT
from keras_mha.families.bert import bert


def padding_offset_positions(reader, fields: dict) -> None:
    """RoBERTa: positions count from `pad_token_id + 1`; the table must hold them."""
    padding = reader.integer("pad_token_id", "token_id", high=fields["vocab_size"] - 1)
    rows = fields["max_position_embeddings"]
    reader.require(
        padding + 1 < rows,
        reader.found.get("max_position_embeddings", "max_position_embeddings"),
        rows,
        f"must exceed pad_token_id + 1 = {padding + 1} (RoBERTa's positions start after the "
        f"padding index)",
    )
    fields["position_padding_idx"] = padding


FAMILY = replace(
    BERT,
    name="roberta",
    hooks=(bert, padding_offset_positions),
    # RobertaConfig's defaults are BertConfig's, with RoBERTa's vocabulary and padding id.
    defaults={**BERT.defaults, "vocab_size": 50265, "pad_token_id": 1},
    # RobertaForMaskedLM keeps its head in lm_head.*; task heads in classifier.* / qa_outputs.*.
    weights=BERT.weights.with_prefixes(
        "",
        "roberta.",
        ignored=(r"(^|\.)pooler\.", r"^lm_head\.", r"^classifier\.", r"^qa_outputs\."),
    ),
)
