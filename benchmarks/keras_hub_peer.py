"""keras-hub's `generate` as a peer in `bench model`, on the same checkpoint.

keras-hub converts a transformers checkpoint folder itself (`Backbone.from_preset(folder)`,
its `utils/transformers` converters), so it reads the very weights keras-mha and
transformers run. Its `CausalLM.generate` (here with `preprocessor=None` and greedy
sampling) pads the prompt to `max_length` (prompt + new tokens), runs the whole padded
sequence once to seed its cache, then samples inside one compiled program on JAX
(`jax.jit`) and TensorFlow (`tf.function` with XLA, asked for here: Keras's default leaves
XLA off on a CPU-only machine); on PyTorch it runs eagerly under `torch.no_grad()`.
Its compiled function is cached per input shape, so the untimed warm-up call of
`time_rounds` compiles each shape once.

Example:
    >>> sorted(PEERS)
    ['gemma', 'llama', 'mistral', 'qwen2', 'qwen3']
    >>> config = {"rms_norm_eps": 1e-5, "rope_parameters": {"rope_type": "default"}}
    >>> overrides(PEERS["llama"], config)
    {'layer_norm_epsilon': 1e-05}
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os

#: The key of keras-hub's row in `bench model`'s results.
KERAS_HUB = "keras_hub"

_LLAMA3_ROPE = "rope_parameters"


@dataclasses.dataclass(frozen=True)
class Peer:
    """keras-hub's classes for one family, and the values its converter drops.

    `overrides` maps a keras-hub backbone argument to its key path in the checkpoint's
    `config.json`; each is passed to `from_preset` when the path is there.
    """

    backbone: str
    causal_lm: str
    overrides: dict = dataclasses.field(default_factory=dict)


#: `model_type` -> keras-hub's classes, for the families whose greedy tokens equal
#: keras-mha's on the bench cards (checked on the scaled Llama-3.2-1B, Mistral-7B,
#: Qwen2.5-0.5B, Qwen3-8B and gemma-2b, keras-hub 0.32). keras-hub 0.32's Llama converter
#: keeps its own RMS epsilon (1e-6) and reads llama3 RoPE scaling from `rope_scaling`,
#: which transformers 5 writes as `rope_parameters`: both are passed here.
PEERS = {
    "llama": Peer(
        "Llama3Backbone",
        "Llama3CausalLM",
        {
            "layer_norm_epsilon": ("rms_norm_eps",),
            "rope_frequency_adjustment_factor": (_LLAMA3_ROPE, "factor"),
            "rope_low_freq_factor": (_LLAMA3_ROPE, "low_freq_factor"),
            "rope_high_freq_factor": (_LLAMA3_ROPE, "high_freq_factor"),
            "rope_pretraining_sequence_length": (
                _LLAMA3_ROPE,
                "original_max_position_embeddings",
            ),
        },
    ),
    "mistral": Peer("MistralBackbone", "MistralCausalLM"),
    "qwen2": Peer("QwenBackbone", "QwenCausalLM"),
    "qwen3": Peer("Qwen3Backbone", "Qwen3CausalLM"),
    "gemma": Peer("GemmaBackbone", "GemmaCausalLM", {"layer_norm_epsilon": ("rms_norm_eps",)}),
}


def unavailable(model_type: str) -> str | None:
    """Why keras-hub cannot run this family here, or None when it can.

    Example:
        >>> unavailable("phi3")
        "keras-hub's generate is not a peer for model_type 'phi3' (no row in PEERS)"
    """
    if model_type not in PEERS:
        return f"keras-hub's generate is not a peer for model_type {model_type!r} (no row in PEERS)"
    if importlib.util.find_spec("keras_hub") is None:
        return "keras-hub is not installed"
    return None


def overrides(peer: Peer, config: dict) -> dict:
    """The backbone arguments of `peer.overrides` found in a checkpoint's `config`."""
    found = {}
    for argument, path in peer.overrides.items():
        value = config
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            found[argument] = value
    return found


def load(folder: str, dtype: str):
    """keras-hub's causal LM for the transformers checkpoint in `folder`, compiled for
    greedy sampling, without a preprocessor (it takes token ids)."""
    import warnings

    import keras
    import keras_hub

    with open(os.path.join(folder, "config.json"), encoding="utf-8") as file:
        config = json.load(file)
    peer = PEERS[config["model_type"]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        backbone = getattr(keras_hub.models, peer.backbone).from_preset(
            folder, dtype=dtype, **overrides(peer, config)
        )
    causal_lm = getattr(keras_hub.models, peer.causal_lm)(backbone=backbone, preprocessor=None)
    # Keras's "auto" turns XLA off on a CPU-only TensorFlow; keras-hub's generate step is
    # written for XLA and runs 2x faster under it there (Llama-3.2-1B / 8, 32 tokens).
    jit = "auto" if keras.backend.backend() == "torch" else True
    causal_lm.compile(sampler="greedy", jit_compile=jit)
    return causal_lm


def generator(causal_lm, ids, new_tokens: int):
    """A call of keras-hub's `generate` on the prompts `ids` (batch, length) for
    `new_tokens` greedy tokens; it returns the prompts and the new tokens as NumPy, as
    keras-mha's `generate` does (so the device work is finished when it returns)."""
    import keras
    import numpy as np

    batch, length = ids.shape
    token_ids = np.zeros((batch, length + new_tokens), dtype="int32")
    token_ids[:, :length] = ids
    prompt = np.arange(length + new_tokens) < length
    inputs = {"token_ids": token_ids, "padding_mask": np.broadcast_to(prompt, token_ids.shape)}

    def run():
        outputs = causal_lm.generate(inputs, stop_token_ids=None)
        return keras.ops.convert_to_numpy(outputs["token_ids"])

    return run


def compiled_as(causal_lm) -> str:
    """How keras-hub's `generate` runs on the current backend (its `make_generate_function`)."""
    import keras

    backend = keras.backend.backend()
    if causal_lm.run_eagerly or backend == "torch":
        return "eager"
    if backend == "tensorflow":
        return "tf.function, XLA" if getattr(causal_lm, "jit_compile", True) else "tf.function"
    return "jax.jit" if backend == "jax" else backend
