"""`EncoderModel`: a BERT-style bidirectional encoder of keras-mha blocks.

Word, absolute position and token-type embeddings, a LayerNorm, then post-norm
`EncoderBlock`s; the output is the last hidden state (what `BertModel` returns as
`last_hidden_state`, and what sentence-transformers mean-pools). BERT numbers positions
`0 .. T - 1`; RoBERTa (`position_padding_idx`) numbers the tokens that are not padding
from `position_padding_idx + 1` and gives padding `position_padding_idx`, as
transformers' `RobertaEmbeddings` does.

Example:
    >>> from keras_mha.models import from_pretrained
    >>> model = from_pretrained("path/to/all-MiniLM-L6-v2")  # doctest: +SKIP
    >>> model({"token_ids": ids, "padding_mask": mask}).shape  # doctest: +SKIP
    (4, 17, 384)
"""

from __future__ import annotations

import keras
from keras import ops

from keras_mha.errors import UsageError
from keras_mha.models.blocks import EncoderBlock
from keras_mha.models.inputs import CheckedInputs, as_arrays, check_token_ids, unpack_inputs
from keras_mha.models.quantize import QuantizeBlocks
from keras_mha.models.sublayer_policies import policy_for, quantized_policies


@keras.saving.register_keras_serializable(package="keras_mha")
class EncoderModel(CheckedInputs, QuantizeBlocks, keras.Model):
    """A BERT-style encoder returning the last hidden state `(B, T, hidden_size)`.

    Args:
        vocab_size: rows of the token embedding (the vocabulary).
        hidden_size: model width.
        blocks: `EncoderBlock` layers (or their serialized configs).
        max_position_embeddings: rows of the position table.
        type_vocab_size: rows of the token-type table.
        norm_epsilon: epsilon of the embeddings' LayerNorm.
        family: as in `DecoderModel`.
        hub_prefix: as in `DecoderModel`.
        hub_config: as in `DecoderModel`.
        embeddings_initializer: for models not loaded from a checkpoint.
        position_padding_idx: RoBERTa's `pad_token_id`: positions are
            `cumsum(mask) * mask + position_padding_idx` with `mask = token_ids !=
            position_padding_idx`; None numbers positions `0 .. T - 1` (BERT).
        weight_naming: ignored (0.2 `.keras` files name their table here).
        sublayer_dtypes: quantized policies of the embeddings by name (`sublayer_policies.py`).

    Call arguments:
        inputs: `{"token_ids", "padding_mask", "segment_ids" (optional token types)}`
            or the token ids alone.
    """

    def __init__(
        self,
        vocab_size,
        hidden_size,
        blocks,
        max_position_embeddings=512,
        type_vocab_size=2,
        norm_epsilon=1e-12,
        family=None,
        hub_prefix="",
        hub_config=None,
        embeddings_initializer="uniform",
        position_padding_idx=None,
        weight_naming=None,
        sublayer_dtypes=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocab_size = int(vocab_size)
        self.hidden_size = int(hidden_size)
        self.max_position_embeddings = int(max_position_embeddings)
        self.type_vocab_size = int(type_vocab_size)
        self.norm_epsilon = float(norm_epsilon)
        self.family = family
        self.hub_prefix = hub_prefix
        self.position_padding_idx = (
            None if position_padding_idx is None else int(position_padding_idx)
        )
        self.hub_config = dict(hub_config) if hub_config else None
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        dtype = self.dtype_policy

        def embedding(rows, name):
            layer = keras.layers.Embedding(
                rows,
                self.hidden_size,
                embeddings_initializer=self.embeddings_initializer,
                dtype=policy_for(sublayer_dtypes, name, dtype),
                name=name,
            )
            layer.build((None, None))
            return layer

        with keras.name_scope(self.name):
            self.token_embedding = embedding(self.vocab_size, "token_embedding")
            self.position_embedding = embedding(self.max_position_embeddings, "position_embedding")
            self.token_type_embedding = embedding(self.type_vocab_size, "token_type_embedding")
            self.embeddings_norm = keras.layers.LayerNormalization(
                epsilon=self.norm_epsilon, dtype=dtype, name="embeddings_norm"
            )
            self.embeddings_norm.build((None, None, self.hidden_size))
            self.blocks = [
                block
                if isinstance(block, keras.layers.Layer)
                else keras.saving.deserialize_keras_object(block)
                for block in blocks
            ]
            for block in self.blocks:
                if not block.built:
                    block.build((None, None, self.hidden_size))
        self.built = True

    def check_inputs(self, inputs):
        """`inputs` with Python lists made arrays; refused when an id or segment id is
        outside its table or the sequence is longer than the position table
        (`CheckedInputs` runs this on every call and every batch)."""
        inputs = as_arrays(inputs)
        token_ids, _, segment_ids = unpack_inputs(inputs, allow_segments=True)
        check_token_ids(token_ids, self.vocab_size)
        length = token_ids.shape[1]
        # RoBERTa's positions start after the padding index.
        usable = self.max_position_embeddings - (
            0 if self.position_padding_idx is None else self.position_padding_idx + 1
        )
        if isinstance(length, int) and length > usable:
            raise UsageError(
                f"token_ids has {length} positions; this model takes at most {usable} "
                f"(max_position_embeddings={self.max_position_embeddings})",
                key="token_ids",
            )
        if segment_ids is not None:
            check_token_ids(segment_ids, self.type_vocab_size, argument="segment_ids")
        return inputs

    def call(self, inputs, training=None):
        token_ids, padding_mask, segment_ids = unpack_inputs(inputs, allow_segments=True)
        hidden = self.embed(token_ids, segment_ids)
        attention_mask = None
        if padding_mask is not None:
            attention_mask = ops.cast(padding_mask, "bool")[:, None, :]
        for block in self.blocks:
            hidden = block(hidden, attention_mask=attention_mask)
        return hidden

    def embed(self, token_ids, segment_ids=None):
        """The normalised sum of token, position and segment embeddings: the first
        block's input."""
        if segment_ids is None:
            segment_ids = ops.zeros_like(token_ids)
        hidden = (
            self.token_embedding(token_ids)
            + self.position_embedding(self.positions(token_ids))
            + self.token_type_embedding(segment_ids)
        )
        return self.embeddings_norm(hidden)

    def block_inputs(self, token_ids):
        """The first block's input for `token_ids` (one segment, no padding)."""
        return self.embed(token_ids)

    def positions(self, token_ids):
        """`(B, T)` position ids (see the class docstring)."""
        if self.position_padding_idx is None:
            return ops.arange(ops.shape(token_ids)[1], dtype="int32")[None, :]
        mask = ops.cast(ops.not_equal(token_ids, self.position_padding_idx), "int32")
        return ops.cumsum(mask, axis=1) * mask + self.position_padding_idx

    def hidden_states(self, inputs):
        """Same as calling the model: the last hidden state."""
        return self(inputs)

    def compute_output_shape(self, input_shape):
        shape = input_shape["token_ids"] if isinstance(input_shape, dict) else input_shape
        return (*tuple(shape), self.hidden_size)

    def get_config(self):
        return {
            "name": self.name,
            "dtype": keras.saving.serialize_keras_object(self.dtype_policy),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "blocks": [keras.saving.serialize_keras_object(block) for block in self.blocks],
            "max_position_embeddings": self.max_position_embeddings,
            "type_vocab_size": self.type_vocab_size,
            "norm_epsilon": self.norm_epsilon,
            "family": self.family,
            "hub_prefix": self.hub_prefix,
            "hub_config": self.hub_config,
            "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
            "position_padding_idx": self.position_padding_idx,
            "sublayer_dtypes": quantized_policies(
                (self.token_embedding, self.position_embedding, self.token_type_embedding)
            ),
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if "dtype" in config and isinstance(config["dtype"], dict):
            config["dtype"] = keras.saving.deserialize_keras_object(config["dtype"])
        return cls(**config)


__all__ = ["EncoderBlock", "EncoderModel"]
