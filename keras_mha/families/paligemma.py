"""PaliGemma (google/paligemma-*): a SigLIP tower, one linear projector, a Gemma decoder.

Example:
    >>> FAMILY.wrapper.text_model_type, FAMILY.wrapper.vision_model_type
    ('gemma', 'siglip_vision_model')
"""

from keras_mha.families._family import Family, Wrapper, linear_parameters


def _projection(top) -> dict:
    return {"projection_dim": top.integer("projection_dim", "width", default=2048)}


FAMILY = Family(
    "paligemma",
    wrapper=Wrapper(
        text_model_type="gemma",
        vision_model_type="siglip_vision_model",
        tie_word_embeddings=True,
        # One linear layer to `projection_dim`.
        projector_parameters=lambda vision, text: linear_parameters(
            vision.hidden_size, vision.projection_dim, True
        ),
        read_projector=_projection,
    ),
)
