"""Multi-query attention: `GroupedQueryAttention` with a single KV head."""

from __future__ import annotations

import keras

from keras_mha.layers.grouped_query_attention import GroupedQueryAttention


@keras.saving.register_keras_serializable(package="keras_mha")
class MultiQueryAttention(GroupedQueryAttention):
    """Multi-query attention (MQA): all query heads share one key/value head.

    Same arguments, call arguments and returns as `GroupedQueryAttention`,
    without `num_key_value_heads` (always 1). Its KV cache is `num_heads`
    times smaller than multi-head attention's (Falcon-7B, StarCoder, PaLM).

    Example:
        >>> layer = MultiQueryAttention(num_heads=8, head_dim=16)
        >>> tuple(layer(keras.random.normal((2, 10, 64))).shape)
        (2, 10, 64)
    """

    def __init__(self, num_heads, **kwargs):
        kv_heads = kwargs.pop("num_key_value_heads", None)
        # Accepted only when it says what MQA is (older saved configs carry it).
        if kv_heads is not None and (isinstance(kv_heads, bool) or kv_heads != 1):
            raise ValueError(
                "`num_key_value_heads` must be None or 1 for MultiQueryAttention, whose query "
                f"heads share one key/value head; received {kv_heads!r}. Use "
                "GroupedQueryAttention for more KV heads."
            )
        super().__init__(num_heads=num_heads, num_key_value_heads=1, **kwargs)

    def get_config(self):
        config = super().get_config()
        del config["num_key_value_heads"]
        return config
