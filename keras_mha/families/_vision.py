"""The vision towers multimodal wrappers use (SigLIP, CLIP): transformers' defaults.

Not families of their own (keras-mha counts their parameters, it does not rebuild
them): `cards.spec` reads a wrapper's `vision_config` with these defaults.

Example:
    >>> VISION_TOWER_DEFAULTS["clip_vision_model"]["patch_size"]
    32
    >>> VISION_TOWER_LAYOUTS["clip_vision_model"].class_token
    True
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class VisionLayout:
    """What a tower holds besides its encoder layers, as transformers builds it.

    Attributes:
        patch_bias: the patch convolution has a bias (SigLIP) or not (CLIP).
        class_token: a class embedding plus its own position row (CLIP).
        pre_layernorm: a LayerNorm before the encoder (CLIP's `pre_layrnorm`).
        pooling_head: the config may add an attention-pooling head (SigLIP's
            `vision_use_head`).
    """

    patch_bias: bool
    class_token: bool
    pre_layernorm: bool
    pooling_head: bool


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

VISION_TOWER_LAYOUTS = {
    "siglip_vision_model": VisionLayout(
        patch_bias=True, class_token=False, pre_layernorm=False, pooling_head=True
    ),
    "clip_vision_model": VisionLayout(
        patch_bias=False, class_token=True, pre_layernorm=True, pooling_head=False
    ),
}

__all__ = ["VISION_TOWER_DEFAULTS", "VISION_TOWER_LAYOUTS", "VisionLayout"]
