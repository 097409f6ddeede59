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
    >>> from keras_mha.pruning import HeadPruning, prune_heads
    >>> pruning = HeadPruning(target=0.5, data=(x_val, y_val), start_epoch=2, end_epoch=4)
    >>> model.fit(x, y, epochs=8, callbacks=[pruning])
    >>> prune_heads(model)
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
