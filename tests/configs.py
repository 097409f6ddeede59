"""Model configs shared by the tests, written once.

Example:
    >>> tiny_llama(num_key_value_heads=1)["num_key_value_heads"]
    1
"""


def tiny_llama(**overrides) -> dict:
    """A tiny Llama `config.json` as a dict: 4 query heads sharing 2 KV heads of size 8,
    32 features, 2 layers, a gated MLP of 48, 50 tokens, a 128-token context, an untied
    LM head. `overrides` replace or add keys.

    Example:
        >>> tiny_llama(hidden_size=64)["hidden_size"]
        64
    """
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": 50,
        "max_position_embeddings": 128,
        "tie_word_embeddings": False,
        **overrides,
    }
