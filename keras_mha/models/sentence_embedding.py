"""Sentence embeddings from an `EncoderModel`: mean over real tokens, then L2 normalisation.

This is sentence-transformers' pooling (all-MiniLM-L6-v2's `1_Pooling` and
`2_Normalize`). The model class is made on first use, so that importing this module
does not import keras.

Example:
    >>> embed = sentence_embedding_model(from_pretrained("all-MiniLM-L6-v2"))  # doctest: +SKIP
    >>> embed({"token_ids": ids, "padding_mask": mask}).shape  # doctest: +SKIP
    (2, 384)
"""

from __future__ import annotations


def _sentence_embedding_class():
    import keras

    class SentenceEmbedding(keras.Model):
        """An encoder followed by mean pooling over real tokens and L2 normalisation."""

        def __init__(self, encoder, **kwargs):
            super().__init__(**kwargs)
            self.encoder = encoder

        def call(self, inputs, training=False):
            hidden = self.encoder(inputs, training=training)
            mask = keras.ops.cast(inputs["padding_mask"], hidden.dtype)[..., None]
            pooled = keras.ops.sum(hidden * mask, axis=1) / keras.ops.maximum(
                keras.ops.sum(mask, axis=1), 1e-9
            )
            pooled = keras.ops.cast(pooled, "float32")
            return pooled / keras.ops.maximum(
                keras.ops.sqrt(keras.ops.sum(pooled * pooled, axis=-1, keepdims=True)), 1e-12
            )

    return SentenceEmbedding


def sentence_embedding_model(encoder):
    """`encoder` followed by mean pooling over real tokens and L2 normalisation.

    Its attention layers are the encoder's own, so scores taken on it are the encoder's.

    Example:
        >>> embed = sentence_embedding_model(from_pretrained("all-MiniLM-L6-v2"))  # doctest: +SKIP
        >>> embed({"token_ids": ids, "padding_mask": mask}).shape  # doctest: +SKIP
        (2, 384)
    """
    return _sentence_embedding_class()(encoder)
