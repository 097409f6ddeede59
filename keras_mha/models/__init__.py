"""Whole pretrained models of keras-mha layers, from a Hub checkpoint, on every backend.

- `from_pretrained(source, dtype=None, revision=None, token=None)`: a `DecoderModel`
  (causal LMs: Llama, Mistral, Qwen2/3, Gemma 1/2/3, Phi-3) or an `EncoderModel`
  (BERT, sentence-transformers) filled from safetensors.
- `generate(model, token_ids, max_new_tokens, ...)`: greedy or seeded sampling on the
  layers' KV cache, one compiled decode step.
- `build_model(spec)`: the same architectures with random weights.
- `save_pretrained(model, out_dir, max_shard_size="5GB")`: back to a Hub checkpoint
  (config.json, safetensors, tokenizer files) that transformers loads, pruned heads
  included.
- `weight_names`: the Hub tensor names of each family, as data, both directions.

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
}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'keras_mha.models' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_EXPORTS))


__all__ = sorted(_EXPORTS)
