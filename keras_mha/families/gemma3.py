"""Gemma 3's multimodal wrapper (google/gemma-3-4b-it, ...): a SigLIP vision tower, a
one-matrix projector and Gemma 3's language model (`gemma3_text`) in `text_config`.

Example:
    >>> FAMILY.wrapper.text_model_type, FAMILY.wrapper.vision_model_type
    ('gemma3_text', 'siglip_vision_model')
"""

from keras_mha.families._family import Family, Wrapper

FAMILY = Family(
    "gemma3",
    wrapper=Wrapper(
        text_model_type="gemma3_text",
        vision_model_type="siglip_vision_model",
        tie_word_embeddings=True,
        # An RMS norm over the vision width and a (vision width, text width) matrix.
        projector_parameters=lambda vision, text: vision.hidden_size * text + vision.hidden_size,
    ),
)
