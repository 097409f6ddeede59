"""The vision towers multimodal wrappers use (SigLIP, CLIP): transformers' defaults.

Not families of their own (keras-mha counts their parameters, it does not rebuild
them): `cards.spec` reads a wrapper's `vision_config` with these defaults.

Example:
    >>> VISION_TOWER_DEFAULTS["clip_vision_model"]["patch_size"]
    32
"""

# The ViT-Base shape both configs default to.
_VIT_BASE = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_channels": 3,
    "image_size": 224,
}

VISION_TOWER_DEFAULTS = {
    "siglip_vision_model": {
        **_VIT_BASE,
        "patch_size": 16,
        "layer_norm_eps": 1e-6,
        "vision_use_head": True,
    },
    "clip_vision_model": {**_VIT_BASE, "patch_size": 32, "layer_norm_eps": 1e-5},
}

__all__ = ["VISION_TOWER_DEFAULTS"]
