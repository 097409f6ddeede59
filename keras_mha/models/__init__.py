"""Whole pretrained models of keras-mha layers, from a Hub checkpoint, on every backend.

- `from_pretrained(source, dtype=None, revision=None, token=None)`: a `DecoderModel`
  (causal LMs: Llama, Mistral, Qwen2/3, Gemma 1/2/3, Phi-3, GPT-2, GPT-NeoX / Pythia) or
  an `EncoderModel` (BERT, RoBERTa / XLM-RoBERTa, sentence-transformers) filled from
  safetensors.
- `generate(model, token_ids, max_new_tokens, ...)`: greedy or seeded sampling on the
  layers' KV cache, one compiled decode step.
- `build_model(spec)`: the same architectures with random weights.
- `save_pretrained(model, out_dir, max_shard_size="5GB")`: back to a Hub checkpoint
  (config.json, safetensors, tokenizer files) that transformers loads, pruned heads
  included.
- `build_attention(spec, layer_index)` and `load_attention_weights(layer, checkpoint_dir,
  layer_index)`: one attention layer of a Hub model, rebuilt and filled through the same
  tensor names whole models use.
- `weight_names`: the transforms between Hub tensors and model variables (each family's
  names are data in its module of `keras_mha.families`).

Example:
    >>> from keras_mha.models import from_pretrained, generate
    >>> model = from_pretrained("path/to/checkpoint")  # doctest: +SKIP
    >>> generate(model, [[1, 2, 3]], max_new_tokens=5)  # doctest: +SKIP
"""

_EXPORTS = {
    "from_pretrained": "keras_mha.models.loading",
    "build_model": "keras_mha.models.loading",
    "load_weights": "keras_mha.models.loading",
    "save_pretrained": "keras_mha.models.export",
    "generate": "keras_mha.models.generation",
    "generation_stats": "keras_mha.models.generation",
    "DecoderModel": "keras_mha.models.decoder",
    "EncoderModel": "keras_mha.models.encoder",
    "DecoderBlock": "keras_mha.models.blocks",
    "EncoderBlock": "keras_mha.models.blocks",
    "RMSNorm": "keras_mha.models.blocks",
    "build_attention": "keras_mha.models.rebuild",
    "attention_layer_arguments": "keras_mha.models.rebuild",
    "load_attention_weights": "keras_mha.models.checkpoint_weights",
}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'keras_mha.models' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_EXPORTS))


__all__ = sorted(_EXPORTS)
