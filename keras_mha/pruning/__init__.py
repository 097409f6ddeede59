"""Attention-head pruning for keras-mha models, on TensorFlow, JAX and PyTorch.

- `head_importance(model, data, method=...)`: one score per query head
  (`"taylor"`, `"ablation"`, `"magnitude"`).
- `HeadPruning`: a callback that gates heads off step by step during `fit`.
- `heads_to_prune(model, importance, target)`: pick heads in one go (no `fit`).
- `prune_heads(model)`: physically remove gated-off heads (smaller kernels,
  same outputs).
- `find_attention_layers`, `get_head_gates`, `set_head_gates`,
  `model_attention_flops`, `save_head_heatmap`: the pieces they are made of.

Example:
    >>> from keras_mha.layers import MultiHeadAttention
    >>> from keras_mha.pruning import HeadPruning, prune_heads
    >>> inputs = keras.Input((8, 16))
    >>> model = keras.Model(inputs, MultiHeadAttention(4, name="attention")(inputs))
    >>> model.compile("sgd", "mse")
    >>> x = np.random.default_rng(0).normal(size=(16, 8, 16)).astype("float32")
    >>> pruning = HeadPruning(target=0.5, data=(x, x), start_epoch=1, end_epoch=2)
    >>> _ = model.fit(x, x, epochs=3, callbacks=[pruning], verbose=0)
    >>> prune_heads(model)
    {'attention': [...]}
"""

from keras_mha.pruning.callback import HeadPruning
from keras_mha.pruning.discovery import find_attention_layers
from keras_mha.pruning.flops import attention_flops, model_attention_flops
from keras_mha.pruning.gates import get_head_gates, set_head_gates
from keras_mha.pruning.heatmap import save_head_heatmap
from keras_mha.pruning.importance import head_importance
from keras_mha.pruning.selection import heads_to_prune
from keras_mha.pruning.surgery import prune_heads

__all__ = [
    "HeadPruning",
    "attention_flops",
    "find_attention_layers",
    "get_head_gates",
    "head_importance",
    "heads_to_prune",
    "model_attention_flops",
    "prune_heads",
    "save_head_heatmap",
    "set_head_gates",
]
