"""The conversion report describes the model the command produced.

For every decoder family, whether or not its Hub config can state KV heads (GPT-2 and
GPT-NeoX cannot), the report's KV cache after conversion is the original's times
`kv_heads / heads`: what the converted Keras model holds (the reference is the
definition, `layers x (K + V) x kv_heads x head_dim x bytes`). Encoders keep no cache.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_mha.conversion.report import kv_cache_figures, render_table

pytestmark = pytest.mark.backend_independent


def _config(family, heads, layers, head_dim):
    hidden = heads * head_dim
    if family == "gpt2":
        return {"model_type": "gpt2", "n_embd": hidden, "n_head": heads, "n_layer": layers,
                "vocab_size": 100, "n_positions": 64}  # fmt: skip
    common = {"hidden_size": hidden, "num_attention_heads": heads, "num_hidden_layers": layers,
              "intermediate_size": 2 * hidden, "vocab_size": 100,
              "max_position_embeddings": 64}  # fmt: skip
    if family == "llama":
        return {"model_type": "llama", "num_key_value_heads": heads, **common}
    return {"model_type": family, **common}


@settings(max_examples=15, deadline=None)
@given(
    family=st.sampled_from(["gpt2", "gpt_neox", "llama", "bert"]),
    heads=st.sampled_from([1, 2, 4, 8, 12]),
    layers=st.integers(1, 4),
    head_dim=st.sampled_from([4, 8, 16]),
    data=st.data(),
)
def test_kv_cache_after_is_the_converted_models(family, heads, layers, head_dim, data):
    kv_heads = data.draw(st.sampled_from([d for d in range(1, heads + 1) if heads % d == 0]))
    figures = kv_cache_figures(
        _config(family, heads, layers, head_dim), kv_heads, kv_dtype="float32"
    )
    assert figures["describes"] == "keras_model"
    if family == "bert":
        assert not figures["applicable"] and figures["after"]["bytes_per_token"] == 0
        return
    before = figures["before"]["bytes_per_token"]
    assert before == layers * 2 * heads * head_dim * 4
    assert figures["after"]["bytes_per_token"] == layers * 2 * kv_heads * head_dim * 4
    assert figures["after"]["bytes_at_context"] == 64 * figures["after"]["bytes_per_token"]


def test_the_table_names_the_model_each_row_describes():
    config = _config("gpt2", 8, 1, 16)
    report = {
        "source": "gpt2-tiny", "architecture": "decoder", "backend": "torch", "dtype": "float32",
        "method": "mean", "num_layers": 1, "num_attention_heads": 8,
        "kv_heads": {"before": 8, "after": 2},
        "kv_cache": kv_cache_figures(config, 2, kv_dtype="float32"),
        "parameters": {"before": 10, "after": 8}, "quality": None, "data": None,
        "uptraining": None,
        "seconds": {"load": 0, "measure": 0, "convert": 0, "uptrain": None, "export": 0,
                    "total": 0},
        "export": {"format": "hub", "path": "out", "files": ["config.json"],
                   "num_attention_heads": 8, "num_key_value_heads": 8},
    }  # fmt: skip
    table = render_table(report)
    row = next(line for line in table.splitlines() if line.startswith("KV cache / token"))
    assert row.split() == ["KV", "cache", "/", "token", "(float32,", "Keras", "model)", "1.00",
                           "KiB", "256", "B"]  # fmt: skip
    assert "the figures above describe the Keras model, of 2 KV heads per layer" in " ".join(
        table.split()
    )  # the line wraps at the terminal's width
