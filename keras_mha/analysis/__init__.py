"""What each attention head does: statistics and roles on real text, tied to pruning.

- `classify_heads(attention, ...)`: statistics and roles from one layer's maps (NumPy).
- `head_roles(model, data, ...)`: run a keras-mha model over data and classify every
  head of every layer; returns a `HeadRoles` (`.to_dict()`, `.table()`).

Example:
    >>> from keras_mha.analysis import head_roles
    >>> roles = head_roles(model, "Some text. More text.", tokenizer=tokenizer)  # doctest: +SKIP
    >>> print(roles.table())  # doctest: +SKIP
"""

from keras_mha.analysis.roles import ROLE_RULES, ROLES, LayerRoles, classify_heads
from keras_mha.analysis.statistics import STATISTICS

__all__ = ["ROLES", "ROLE_RULES", "STATISTICS", "LayerRoles", "classify_heads"]
