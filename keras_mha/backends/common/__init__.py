"""The tensor-level pieces every backend shares with the layers, in `keras.ops`.

As in Keras (`keras/src/backend/common`), they sit at the bottom: the backend modules
(`keras_mha.backends.torch`, `.jax`, `.tensorflow`) and the layers above both import
them, and they import nothing of the layers or the models. The KV cache and its writes
(`kv_cache`), the attention kernels (`attention_kernels`, `decode_attention`), masks
(`masks`, `padding_masks`), the projections (`linear`) and the attention recorder's
registry (`attention_probe`). Where a backend has a faster primitive they ask
`keras_mha.backends.current()` for it.
"""
