"""Tiny random Hub checkpoints written by transformers, shared by the tests/test_models_* files.

Each case is a transformers config class, its arguments, the model class to save and the
keras-mha family it loads as (the registry test checks that every family keras_mha.models
builds has a case here). `checkpoint(tmp_path_factory, case)` writes it once per test
session (every weight perturbed so norms and biases are not trivial), with transformers'
reference logits / hidden states for one padded and one unpadded batch, and caches the
result for every test module of the session. Decoders of RoPE families are left-padded
(RoPE sees only distances); encoders and the decoders with learned positions or
introduced with them (GPT-2, GPT-NeoX) are right-padded, where every real token has the
same position in transformers' forward as in keras-mha. `loaded(tmp_path_factory, case)`
is the checkpoint with its keras-mha model from `from_pretrained`, also read once per
session (CI time): tests must not change that model (build their own to prune or train).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

SMALL = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 96,
    "vocab_size": 128,
}
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # Small, so that the test positions reach the scaled frequencies.
    "original_max_position_embeddings": 8,
}

GPT2_SMALL = {"n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 128, "n_positions": 32}
ROBERTA_SMALL = {**SMALL, "max_position_embeddings": 34, "type_vocab_size": 1, "pad_token_id": 1}

# case -> (config class, arguments, model class, keras-mha family)
CASES = {
    "llama": (
        "LlamaConfig",
        {
            **SMALL,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "rope_scaling": LLAMA3_SCALING,
            "tie_word_embeddings": False,
        },
        "LlamaForCausalLM",
        "llama",
    ),
    "llama_plain": (
        "LlamaConfig",
        {**SMALL, "num_key_value_heads": 2, "tie_word_embeddings": False},
        "LlamaForCausalLM",
        "llama",
    ),
    "llama_tied_bias": (
        "LlamaConfig",
        {
            **SMALL,
            "num_key_value_heads": 4,
            "attention_bias": True,
            "mlp_bias": True,
            "tie_word_embeddings": True,
        },
        "LlamaForCausalLM",
        "llama",
    ),
    "mistral": (
        "MistralConfig",
        {**SMALL, "num_key_value_heads": 1, "head_dim": 16, "sliding_window": 4},
        "MistralForCausalLM",
        "mistral",
    ),
    "qwen2": ("Qwen2Config", {**SMALL, "num_key_value_heads": 2}, "Qwen2ForCausalLM", "qwen2"),
    "qwen3": (
        "Qwen3Config",
        {**SMALL, "num_key_value_heads": 2, "head_dim": 16},
        "Qwen3ForCausalLM",
        "qwen3",
    ),
    "gemma": (
        "GemmaConfig",
        {**SMALL, "num_key_value_heads": 1, "head_dim": 24, "hidden_act": "gelu_pytorch_tanh"},
        "GemmaForCausalLM",
        "gemma",
    ),
    "gemma2": (
        "Gemma2Config",
        {
            **SMALL,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "sliding_window": 4,
            "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 3.0,
        },
        "Gemma2ForCausalLM",
        "gemma2",
    ),
    "gemma3": (
        "Gemma3TextConfig",
        {
            **SMALL,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "sliding_window": 4,
            "query_pre_attn_scalar": 24,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        },
        "Gemma3ForCausalLM",
        "gemma3_text",
    ),
    "phi3": (
        "Phi3Config",
        {
            **SMALL,
            "num_key_value_heads": 2,
            "pad_token_id": 0,
            "eos_token_id": 1,
            "bos_token_id": 1,
        },
        "Phi3ForCausalLM",
        "phi3",
    ),
    "bert": (
        "BertConfig",
        {**SMALL, "max_position_embeddings": 32, "type_vocab_size": 2},
        "BertModel",
        "bert",
    ),
    # n_inner is left out: GPT-2 then uses 4 * n_embd.
    "gpt2": (
        "GPT2Config",
        {**GPT2_SMALL, "bos_token_id": 0, "eos_token_id": 0},
        "GPT2LMHeadModel",
        "gpt2",
    ),
    "gpt_neox": (
        "GPTNeoXConfig",
        {**SMALL, "rotary_pct": 0.25, "max_position_embeddings": 64, "tie_word_embeddings": False},
        "GPTNeoXForCausalLM",
        "gpt_neox",
    ),
    "gpt_neox_sequential": (
        "GPTNeoXConfig",
        {**SMALL, "rotary_pct": 0.5, "use_parallel_residual": False, "attention_bias": False},
        "GPTNeoXForCausalLM",
        "gpt_neox",
    ),
    "roberta": ("RobertaConfig", ROBERTA_SMALL, "RobertaModel", "roberta"),
    "xlm_roberta": ("XLMRobertaConfig", ROBERTA_SMALL, "XLMRobertaModel", "xlm-roberta"),
}
ENCODERS = ("bert", "roberta", "xlm_roberta")
# Padded on the right (the rest on the left): see the module docstring.
RIGHT_PADDED = (*ENCODERS, "gpt2", "gpt_neox", "gpt_neox_sequential")
# RoBERTa's positions skip its pad token: the padded positions hold it, as a tokenizer writes.
PAD_TOKEN = {"roberta": 1, "xlm_roberta": 1}
DECODERS = [case for case in CASES if case not in ENCODERS]
BATCH, LENGTH = 2, 9


@dataclass
class Checkpoint:
    """A written checkpoint and transformers' outputs on `token_ids`."""

    case: str
    directory: Path
    token_ids: np.ndarray
    padding_mask: np.ndarray  # row 1 padded by 3, on the left or right (`RIGHT_PADDED`)
    reference: np.ndarray  # logits or last hidden state, without padding
    reference_padded: np.ndarray  # with `padding_mask`
    model: object  # the transformers model (eval mode)


_CACHE: dict[str, Checkpoint] = {}


def checkpoint(tmp_path_factory, case: str, num_key_value_heads=None) -> Checkpoint:
    """The checkpoint of `case`, written on first use in this session; with
    `num_key_value_heads`, the same family with that many KV heads (e.g. multi-head)."""
    key = case if num_key_value_heads is None else f"{case}_kv{num_key_value_heads}"
    if key in _CACHE:
        return _CACHE[key]
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config_class, arguments, model_class, _ = CASES[case]
    if num_key_value_heads is not None:
        arguments = {**arguments, "num_key_value_heads": num_key_value_heads}
    torch.manual_seed(sum(map(ord, case)))
    # Eager attention: the formula as written, whatever the installed transformers picks by
    # default (its SDPA attention drops Gemma 2's logit soft cap).
    config = getattr(transformers, config_class)(**arguments, attn_implementation="eager")
    model = getattr(transformers, model_class)(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    directory = tmp_path_factory.mktemp(f"checkpoint_{key}")
    model.save_pretrained(directory)

    generator = np.random.default_rng(0)
    token_ids = generator.integers(2, SMALL["vocab_size"], (BATCH, LENGTH)).astype(np.int64)
    padding_mask = np.ones((BATCH, LENGTH), dtype=np.int64)
    if case in RIGHT_PADDED:
        padding_mask[1, -3:] = 0
    else:
        padding_mask[1, :3] = 0
    if case in PAD_TOKEN:
        token_ids[1, -3:] = PAD_TOKEN[case]

    def run(mask):
        with torch.no_grad():
            output = model(
                input_ids=torch.from_numpy(token_ids), attention_mask=torch.from_numpy(mask)
            )
        result = output.logits if hasattr(output, "logits") else output.last_hidden_state
        return result.numpy()

    made = Checkpoint(
        case,
        directory,
        token_ids,
        padding_mask,
        run(np.ones_like(padding_mask)),
        run(padding_mask),
        model,
    )
    _CACHE[key] = made
    return made


_LOADED: dict[str, tuple[Checkpoint, object]] = {}


def loaded(tmp_path_factory, case: str):
    """`(checkpoint, from_pretrained(checkpoint.directory))` for `case`, read once per session."""
    if case not in _LOADED:
        from keras_mha.models import from_pretrained

        made = checkpoint(tmp_path_factory, case)
        _LOADED[case] = (made, from_pretrained(made.directory))
    return _LOADED[case]
