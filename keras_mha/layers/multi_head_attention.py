"""Multi-head attention: `GroupedQueryAttention` with one KV head per query head."""

from __future__ import annotations

import keras

from keras_mha.layers.grouped_query_attention import GroupedQueryAttention


@keras.saving.register_keras_serializable(package="keras_mha")
class MultiHeadAttention(GroupedQueryAttention):
    """Multi-head attention (MHA): every query head has its own key/value head.

    Same arguments, call arguments and returns as `GroupedQueryAttention`,
    without `num_key_value_heads` (always `num_heads`). With the same weights
    it computes what `keras.layers.MultiHeadAttention` computes; see
    `keras_mha.layers.copy_weights_from_keras`.

    Example:
        >>> layer = MultiHeadAttention(num_heads=4, causal=True)
        >>> tuple(layer(keras.random.normal((2, 10, 32))).shape)
        (2, 10, 32)
    """

    def __init__(self, num_heads, **kwargs):
        kv_heads = kwargs.pop("num_key_value_heads", None)
        # Accepted only when it says what MHA is (older saved configs carry it).
        if kv_heads is not None and (isinstance(kv_heads, bool) or kv_heads != num_heads):
            raise ValueError(
                f"`num_key_value_heads` must be None or `num_heads` ({num_heads!r}) for "
                f"MultiHeadAttention, which gives every query head its own key/value head; "
                f"received {kv_heads!r}. Use GroupedQueryAttention for fewer KV heads."
            )
        super().__init__(num_heads=num_heads, num_key_value_heads=num_heads, **kwargs)

    def get_config(self):
        config = super().get_config()
        del config["num_key_value_heads"]
        return config
