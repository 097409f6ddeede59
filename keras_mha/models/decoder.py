"""`DecoderModel`: a causal language model of keras-mha blocks, for every decoder family.

One class serves Llama, Mistral, Qwen2/3, Gemma 1/2/3, Phi-3, GPT-2 and GPT-NeoX: the
differences are the spec's attention settings (in each block's attention layer), the
spec's block traits (norm type, MLP kind, learned positions, parallel residual, tying)
and the family's `Blocks` (norm offset, embedding scale, sandwich norms), all
constructor arguments, so `.keras` files rebuild the same model.

Learned positions (GPT-2) are numbered over the real tokens: a left-padded row's first
token is at position 0, as in transformers' `generate` (`cumsum(padding_mask) - 1`).

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

from keras_mha import backends
from keras_mha.backends.common import decode_copies
from keras_mha.errors import UsageError
from keras_mha.models.blocks import DecoderBlock, make_norm
from keras_mha.models.direct_calls import run
from keras_mha.models.inputs import CheckedInputs, as_arrays, check_token_ids, unpack_inputs
from keras_mha.models.kept_logits import check_logits_to_keep, keep_positions
from keras_mha.models.quantize import QuantizeBlocks
from keras_mha.models.sublayer_policies import policy_for, quantized_policies


@keras.saving.register_keras_serializable(package="keras_mha")
class DecoderModel(CheckedInputs, QuantizeBlocks, keras.Model):
    """A decoder-only causal LM: embeddings, `DecoderBlock`s, final norm, LM head.

    Args:
        vocab_size: rows of the token embedding (the vocabulary).
        hidden_size: model width.
        blocks: `DecoderBlock` layers (or their serialized configs), in order.
        tie_word_embeddings: the LM head reuses the token embeddings.
        norm_epsilon: epsilon of the final norm.
        norm_scale_offset: scale offset of the final norm (1 for Gemma's `1 + w`; see
            `RMSNorm`).
        embedding_scale: multiply the embeddings by sqrt(hidden_size) (Gemma).
        final_logit_soft_cap: `c * tanh(logits / c)` (Gemma 2), or None.
        family: the family the weights came from, whose module names the checkpoint's
            tensors; kept for `save_pretrained`, None for a model built by hand.
        hub_prefix: the checkpoint's tensor-name stem, kept for `save_pretrained`.
        hub_config: the checkpoint's `config.json`, kept for `save_pretrained`.
        embeddings_initializer: for models not loaded from a checkpoint.
        kernel_initializer: for models not loaded from a checkpoint.
        norm_type: the final norm, "rms" or "layer".
        norm_bias: whether a "layer" final norm has a bias.
        max_position_embeddings: rows of a learned position table (GPT-2); None for
            models that rotate queries and keys (RoPE) instead.
        weight_naming: ignored (0.2 `.keras` files name their table here).
        sublayer_dtypes: quantized policies of the embeddings and LM head by name, as
            `get_config` records them after `quantize` (`sublayer_policies.py`).

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
        family=None,
        hub_prefix="model.",
        hub_config=None,
        embeddings_initializer="uniform",
        kernel_initializer="glorot_uniform",
        norm_type="rms",
        norm_bias=False,
        max_position_embeddings=None,
        weight_naming=None,
        sublayer_dtypes=None,
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
        self.hub_prefix = hub_prefix
        self.hub_config = dict(hub_config) if hub_config else None
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.norm_type = norm_type
        self.norm_bias = bool(norm_bias)
        self.max_position_embeddings = (
            None if max_position_embeddings is None else int(max_position_embeddings)
        )
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
            self.position_embedding = None
            if self.max_position_embeddings is not None:
                self.position_embedding = embedding(
                    self.max_position_embeddings, "position_embedding"
                )
            self.blocks = [
                block
                if isinstance(block, keras.layers.Layer)
                else keras.saving.deserialize_keras_object(block)
                for block in blocks
            ]
            for block in self.blocks:
                if not block.built:
                    block.build((None, None, self.hidden_size))
            self.final_norm = make_norm(
                norm_type,
                self.norm_epsilon,
                scale_offset=self.norm_scale_offset,
                bias=self.norm_bias,
                dtype=dtype,
                name="final_norm",
            )
            self.final_norm.build((None, None, self.hidden_size))
            self.lm_head = None
            if not self.tie_word_embeddings:
                self.lm_head = keras.layers.Dense(
                    self.vocab_size,
                    use_bias=False,
                    kernel_initializer=self.kernel_initializer,
                    dtype=policy_for(sublayer_dtypes, "lm_head", dtype),
                    name="lm_head",
                )
                self.lm_head.build((None, None, self.hidden_size))
        self.built = True

    # -------------------------------------------------------------------- pieces
    def embed(self, token_ids, positions=None):
        """Token embeddings (scaled for Gemma), plus the learned positions' rows."""
        hidden = run(self.token_embedding, token_ids)
        if self.embedding_scale:
            # Gemma rounds sqrt(hidden) to the activations' dtype first.
            hidden = hidden * ops.cast(math.sqrt(self.hidden_size), hidden.dtype)
        if self.position_embedding is not None:
            hidden = hidden + run(self.position_embedding, positions)
        return hidden

    def block_inputs(self, token_ids):
        """The first block's input for `token_ids` (no padding)."""
        positions = None
        if self.position_embedding is not None:
            positions = self.positions(None, ops.shape(token_ids)[1])
        return self.embed(token_ids, positions)

    @staticmethod
    def positions(padding_mask, length):
        """`(B, T)` positions of the real tokens: `cumsum(mask) - 1` (padding at 0), or
        `0 .. T - 1` without a mask."""
        if padding_mask is None:
            return ops.arange(length, dtype="int32")[None, :]
        counts = ops.cumsum(ops.cast(padding_mask, "int32"), axis=1)
        return ops.maximum(counts - 1, 0)

    def logits(self, hidden):
        """The LM head (tied or not) and the final soft cap, on normalised hidden states."""
        head = decode_copies.current_head()  # the table's (D, V) copy, in a decode loop
        if self.lm_head is None and head is not None:
            logits = ops.matmul(hidden, ops.cast(head, hidden.dtype))
        elif self.lm_head is None:
            embeddings = ops.cast(self._embedding_table(), hidden.dtype)
            logits = backends.current().tied_logits(hidden, embeddings)
        else:
            logits = run(self.lm_head, hidden)
        if self.final_logit_soft_cap is not None:
            cap = self.final_logit_soft_cap
            logits = ops.tanh(logits / cap) * cap
        return logits

    def _embedding_table(self):
        """The token embeddings as floats; a quantized table through Keras's own lookup."""
        if self.token_embedding.quantization_mode is None:
            return self.token_embedding.embeddings
        return self.token_embedding(ops.arange(self.vocab_size, dtype="int32"))

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
        self.check_length(token_ids.shape[1])
        return inputs

    def check_length(self, length, argument="token_ids"):
        """UsageError (a ValueError) when `length` positions exceed a learned position table."""
        rows = self.max_position_embeddings
        if rows is not None and isinstance(length, int) and length > rows:
            raise UsageError(
                f"{argument} needs {length} positions; this model has "
                f"max_position_embeddings={rows}",
                key=argument,
                value=length,
            )

    def hidden_states(self, inputs):
        """The final norm's output `(B, T, hidden_size)` (keras-hub backbones' output)."""
        token_ids, padding_mask, _ = unpack_inputs(inputs)
        return self.final_norm(self._block_outputs(token_ids, padding_mask))

    def _block_outputs(self, token_ids, padding_mask):
        positions = None
        if self.position_embedding is not None:
            positions = self.positions(padding_mask, ops.shape(token_ids)[1])
        hidden = self.embed(token_ids, positions)
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
    def init_caches(self, batch_size, max_length, variables=False, dtype=None):
        """One KV cache per block (opaque: whatever the attention layer's `init_cache` makes).

        `variables=True` (TensorFlow): caches of variables that the steps update in
        place; `dtype`: None (the compute dtype), `"int8"` or `"float8_e4m3fn"` (see
        `GroupedQueryAttention.init_cache`).
        """
        return [
            block.attention.init_cache(
                batch_size, max_length, dtype=dtype or self.compute_dtype, variables=variables
            )
            for block in self.blocks
        ]

    def call_with_cache(self, token_ids, key_mask, caches, cache_index, logits_to_keep=None):
        """Logits of `token_ids` written at `cache_index`, and the updated caches.

        Args:
            token_ids: `(B, T)` new tokens.
            key_mask: boolean `(B, max_length)`: False at padded prompt positions; None
                when no position is padded (the attention is then plainly causal, which
                the fused kernels compute without a mask).
            caches: from `init_caches` (or a previous call).
            cache_index: position of the first new token.
            logits_to_keep: as in `call` (`generate`'s prefill keeps 1).
        """
        kept = check_logits_to_keep(logits_to_keep, ops.shape(token_ids)[1])
        positions = None
        if self.position_embedding is not None:
            # The new tokens' columns of the positions over the whole cache.
            columns = cache_index + ops.arange(ops.shape(token_ids)[1], dtype="int32")
            if key_mask is None:
                positions = columns[None, :]
            else:
                positions = ops.take(self.positions(key_mask, None), columns, axis=1)
        hidden = self.embed(token_ids, positions)
        attention_mask = self._key_mask(key_mask)
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
            "hub_prefix": self.hub_prefix,
            "hub_config": self.hub_config,
            "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "norm_type": self.norm_type,
            "norm_bias": self.norm_bias,
            "max_position_embeddings": self.max_position_embeddings,
            "sublayer_dtypes": quantized_policies(
                (self.token_embedding, self.position_embedding, self.lm_head)
            ),
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if "dtype" in config and isinstance(config["dtype"], dict):
            config["dtype"] = keras.saving.deserialize_keras_object(config["dtype"])
        return cls(**config)


__all__ = ["DecoderModel", "DecoderBlock"]
