"""LLaVA (llava-hf/*): a CLIP tower, a two-layer projector, a Llama decoder.

The projector reads one vision layer, or the concatenation of the layers listed in
`vision_feature_layer`; `multimodal_projector_bias` switches its biases.

Example:
    >>> FAMILY.wrapper.tie_word_embeddings is None  # takes the text config's when false
    True
"""

from keras_mha.families._family import Family, Wrapper, linear_parameters


def _projector(top) -> dict:
    feature_layers = top.config.get("vision_feature_layer", -2)
    if isinstance(feature_layers, list):
        top.require(
            0 < len(feature_layers) <= 64 and all(type(index) is int for index in feature_layers),
            "vision_feature_layer",
            feature_layers,
            "must be an integer or a list of up to 64 integers",
        )
    else:
        top.require(
            type(feature_layers) is int,
            "vision_feature_layer",
            feature_layers,
            "must be an integer or a list of integers",
        )
    return {
        "projector_bias": top.flag("multimodal_projector_bias", True),
        "projector_input_layers": len(feature_layers) if isinstance(feature_layers, list) else 1,
    }


FAMILY = Family(
    "llava",
    wrapper=Wrapper(
        text_model_type="llama",
        vision_model_type="clip_vision_model",
        tie_word_embeddings=None,
        # linear_1 (over the concatenated feature layers), GELU, linear_2.
        projector_parameters=lambda vision, text: (
            linear_parameters(
                vision.hidden_size * vision.projector_input_layers, text, vision.projector_bias
            )
            + linear_parameters(text, text, vision.projector_bias)
        ),
        read_projector=_projector,
    ),
)
