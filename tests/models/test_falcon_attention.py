"""Falcon's fused `self_attention.query_key_value` loaded into keras-mha attention layers.

Falcon stores q, k and v in one weight, grouped per KV head: a group's query heads,
then its key, then its value. The three Falcon layouts (multi-query Falcon-7B,
`new_decoder_architecture` GQA of Falcon-40B/180B, and plain multi-head) are written by
transformers as tiny random checkpoints; each attention layer is rebuilt with
`build_attention`, filled with `load_attention_weights`, and must reproduce the output
of transformers' `FalconAttention` (captured with a forward hook) on the same input.
"""

import json

import keras
import numpy as np
import pytest

from keras_mha.models import build_attention, load_attention_weights
from keras_mha.planning.spec import from_config

ATOL = 1e-5
BASE = {
    "hidden_size": 64,
    "num_attention_heads": 8,
    "num_hidden_layers": 2,
    "vocab_size": 100,
    "alibi": False,
    "bias": True,
}
CASES = {
    "multi_query": {"multi_query": True, "new_decoder_architecture": False},
    "grouped_new_architecture": {"new_decoder_architecture": True, "num_kv_heads": 2},
    "multi_head": {"multi_query": False, "new_decoder_architecture": False, "bias": False},
}


@pytest.mark.parametrize("case", list(CASES))
def test_falcon_attention_equals_transformers(case, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.FalconConfig(**{**BASE, **CASES[case]})
    model = transformers.FalconForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    model.save_pretrained(tmp_path)
    spec = from_config(json.loads((tmp_path / "config.json").read_text()))

    captured = {}

    def hook(module, args, kwargs, output, index):
        hidden = args[0] if args else kwargs["hidden_states"]
        captured[index] = (hidden.numpy(), output[0].numpy())

    handles = [
        block.self_attention.register_forward_hook(
            lambda m, a, k, o, i=i: hook(m, a, k, o, i), with_kwargs=True
        )
        for i, block in enumerate(model.transformer.h)
    ]
    ids = torch.randint(0, 100, (2, 7))
    with torch.no_grad():
        model(input_ids=ids)
    for handle in handles:
        handle.remove()

    for index, (hidden, expected) in captured.items():
        layer = build_attention(spec, index)
        sources = load_attention_weights(layer, tmp_path, index)
        assert sources["query_kernel"].endswith(f"h.{index}.self_attention.query_key_value.weight")
        assert ("query_bias" in sources) == config.bias
        output = keras.ops.convert_to_numpy(layer(hidden))
        np.testing.assert_allclose(output, expected, atol=ATOL, rtol=0)
