"""`DecoderModel`: a causal language model of keras-mha blocks, for every decoder family.

One class serves Llama, Mistral, Qwen2/3, Gemma 1/2/3 and Phi-3: the differences
are the spec's attention settings (in each block's attention layer) and the traits
of `families.FAMILY_TRAITS` (norm offset, embedding scale, sandwich norms, soft cap,
tying), all constructor arguments, so `.keras` files rebuild the same model.

Example:
    >>> from keras_mha.models import from_pretrained
    >>> model = from_pretrained("path/to/tiny-llama")  # doctest: +SKIP
    >>> model({"token_ids": ids, "padding_mask": mask}).shape  # doctest: +SKIP
    (2, 9, 100)
"""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_mha.models.blocks import DecoderBlock, RMSNorm
from keras_mha.models.direct_calls import run
from keras_mha.models.inputs import CheckedInputs, as_arrays, check_token_ids, unpack_inputs
from keras_mha.models.kept_logits import check_logits_to_keep, keep_positions


@keras.saving.register_keras_serializable(package="keras_mha")
class DecoderModel(CheckedInputs, keras.Model):
    """A decoder-only causal LM: embeddings, `DecoderBlock`s, final norm, LM head.

    Args:
        vocab_size, hidden_size: vocabulary and model width.
        blocks: `DecoderBlock` layers (or their serialized configs), in order.
        tie_word_embeddings: the LM head reuses the token embeddings.
        norm_epsilon, norm_scale_offset: of the final `RMSNorm`.
        embedding_scale: multiply the embeddings by sqrt(hidden_size) (Gemma).
        final_logit_soft_cap: `c * tanh(logits / c)` (Gemma 2), or None.
        family, weight_naming, hub_prefix, hub_config: where the weights came from
            (the family, the `weight_names` table, the checkpoint's name stem and its
            `config.json`), kept for `save_pretrained`.
        embeddings_initializer, kernel_initializer: for models not loaded from a checkpoint.

    Call arguments:
        inputs: `{"token_ids": (B, T) int, "padding_mask": (B, T) bool/int}` or the
            token ids alone.
        logits_to_keep: which positions get logits (the LM head is skipped for the
            others): 0 or None for all, an int `n` for the last `n`, or a 1-D list of
            positions, as in transformers.

    Returns:
        Logits `(B, T, vocab_size)`, or `(B, kept, vocab_size)` with `logits_to_keep`.

    Example:
        >>> model({"token_ids": ids, "padding_mask": mask}, logits_to_keep=1).shape
        ... # doctest: +SKIP
        (2, 1, 100)
    """

    def __init__(
        self,
        vocab_size,
        hidden_size,
        blocks,
        tie_word_embeddings=False,
        norm_epsilon=1e-6,
        norm_scale_offset=0.0,
        embedding_scale=False,
        final_logit_soft_cap=None,
        family="llama",
        weight_naming="llama",
        hub_prefix="model.",
        hub_config=None,
        embeddings_initializer="uniform",
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vocab_size = int(vocab_size)
        self.hidden_size = int(hidden_size)
        self.tie_word_embeddings = bool(tie_word_embeddings)
        self.norm_epsilon = float(norm_epsilon)
        self.norm_scale_offset = float(norm_scale_offset)
        self.embedding_scale = bool(embedding_scale)
        self.final_logit_soft_cap = (
            None if final_logit_soft_cap is None else float(final_logit_soft_cap)
        )
        self.family = family
        self.weight_naming = weight_naming
        self.hub_prefix = hub_prefix
        self.hub_config = dict(hub_config) if hub_config else None
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        dtype = self.dtype_policy
        with keras.name_scope(self.name):
            self.token_embedding = keras.layers.Embedding(
                self.vocab_size,
                self.hidden_size,
                embeddings_initializer=self.embeddings_initializer,
                dtype=dtype,
                name="token_embedding",
            )
            self.token_embedding.build((None, None))
            self.blocks = [
                block
                if isinstance(block, keras.layers.Layer)
                else keras.saving.deserialize_keras_object(block)
                for block in blocks
            ]
            for block in self.blocks:
                if not block.built:
                    block.build((None, None, self.hidden_size))
            self.final_norm = RMSNorm(
                self.norm_epsilon, self.norm_scale_offset, dtype=dtype, name="final_norm"
            )
            self.final_norm.build((None, None, self.hidden_size))
            self.lm_head = None
            if not self.tie_word_embeddings:
                self.lm_head = keras.layers.Dense(
                    self.vocab_size,
                    use_bias=False,
                    kernel_initializer=self.kernel_initializer,
                    dtype=dtype,
                    name="lm_head",
                )
                self.lm_head.build((None, None, self.hidden_size))
        self.built = True

    # -------------------------------------------------------------------- pieces
    def embed(self, token_ids):
        hidden = run(self.token_embedding, token_ids)
        if self.embedding_scale:
            # Gemma rounds sqrt(hidden) to the activations' dtype first.
            hidden = hidden * ops.cast(math.sqrt(self.hidden_size), hidden.dtype)
        return hidden

    def logits(self, hidden):
        """The LM head (tied or not) and the final soft cap, on normalised hidden states."""
        if self.lm_head is None:
            embeddings = ops.cast(self.token_embedding.embeddings, hidden.dtype)
            logits = ops.matmul(hidden, ops.transpose(embeddings))
        else:
            logits = run(self.lm_head, hidden)
        if self.final_logit_soft_cap is not None:
            cap = self.final_logit_soft_cap
            logits = ops.tanh(logits / cap) * cap
        return logits

    @staticmethod
    def _key_mask(padding_mask):
        return None if padding_mask is None else ops.cast(padding_mask, "bool")[:, None, :]

    def __call__(self, inputs, *args, logits_to_keep=None, **kwargs):
        if logits_to_keep is not None:
            # Checked before Keras's __call__, which would wrap the error in a long report.
            token_ids, _, _ = unpack_inputs(as_arrays(inputs))
            check_logits_to_keep(logits_to_keep, token_ids.shape[1])
            kwargs["logits_to_keep"] = logits_to_keep
        return super().__call__(inputs, *args, **kwargs)

    def check_inputs(self, inputs):
        """`inputs` with Python lists made arrays; refused when an id is outside the
        vocabulary (`CheckedInputs` runs this on every call and every batch)."""
        inputs = as_arrays(inputs)
        token_ids, _, _ = unpack_inputs(inputs)
        check_token_ids(token_ids, self.vocab_size)
        return inputs

    def hidden_states(self, inputs):
        """The final norm's output `(B, T, hidden_size)` (keras-hub backbones' output)."""
        token_ids, padding_mask, _ = unpack_inputs(inputs)
        return self.final_norm(self._block_outputs(token_ids, padding_mask))

    def _block_outputs(self, token_ids, padding_mask):
        hidden = self.embed(token_ids)
        attention_mask = self._key_mask(padding_mask)
        for block in self.blocks:
            hidden = block(hidden, attention_mask=attention_mask)
        return hidden

    def call(self, inputs, training=None, logits_to_keep=None):
        token_ids, padding_mask, _ = unpack_inputs(inputs)
        kept = check_logits_to_keep(logits_to_keep, ops.shape(token_ids)[1])
        hidden = keep_positions(self._block_outputs(token_ids, padding_mask), kept)
        return self.logits(self.final_norm(hidden))

    # ------------------------------------------------------------------ decoding
    def init_caches(self, batch_size, max_length, variables=False):
        """One KV cache per block (opaque: whatever the attention layer's `init_cache` makes).

        `variables=True` (TensorFlow): caches of variables that the steps update in
        place (see `GroupedQueryAttention.init_cache`).
        """
        return [
            block.attention.init_cache(
                batch_size, max_length, dtype=self.compute_dtype, variables=variables
            )
            for block in self.blocks
        ]

    def call_with_cache(self, token_ids, key_mask, caches, cache_index, logits_to_keep=None):
        """Logits of `token_ids` written at `cache_index`, and the updated caches.

        Args:
            token_ids: `(B, T)` new tokens.
            key_mask: boolean `(B, max_length)`: False at padded prompt positions.
            caches: from `init_caches` (or a previous call).
            cache_index: position of the first new token.
            logits_to_keep: as in `call` (`generate`'s prefill keeps 1).
        """
        kept = check_logits_to_keep(logits_to_keep, ops.shape(token_ids)[1])
        hidden = self.embed(token_ids)
        attention_mask = ops.cast(key_mask, "bool")[:, None, :]
        new_caches = []
        for block, cache in zip(self.blocks, caches, strict=True):
            hidden, cache = run(
                block, hidden, attention_mask=attention_mask, cache=cache, cache_index=cache_index
            )
            new_caches.append(cache)
        hidden = keep_positions(hidden, kept)
        return self.logits(run(self.final_norm, hidden)), new_caches

    def compute_output_shape(self, input_shape):
        shape = input_shape["token_ids"] if isinstance(input_shape, dict) else input_shape
        return (*tuple(shape), self.vocab_size)

    def get_config(self):
        return {
            "name": self.name,
            "dtype": keras.saving.serialize_keras_object(self.dtype_policy),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "blocks": [keras.saving.serialize_keras_object(block) for block in self.blocks],
            "tie_word_embeddings": self.tie_word_embeddings,
            "norm_epsilon": self.norm_epsilon,
            "norm_scale_offset": self.norm_scale_offset,
            "embedding_scale": self.embedding_scale,
            "final_logit_soft_cap": self.final_logit_soft_cap,
            "family": self.family,
            "weight_naming": self.weight_naming,
            "hub_prefix": self.hub_prefix,
            "hub_config": self.hub_config,
            "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if "dtype" in config and isinstance(config["dtype"], dict):
            config["dtype"] = keras.saving.deserialize_keras_object(config["dtype"])
        return cls(**config)


__all__ = ["DecoderModel", "DecoderBlock"]
