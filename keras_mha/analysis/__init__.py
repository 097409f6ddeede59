"""What each attention head does: statistics and roles on real text, tied to pruning.

- `classify_heads(attention, ...)`: statistics and roles from one layer's maps (NumPy).
- `head_roles(model, data, ...)`: run a keras-mha model over data and classify every
  head of every layer; returns a `HeadRoles` (`.to_dict()`, `.table()`, `.markdown()`).
- `STATISTICS`, `ROLE_RULES`: the statistics and the role thresholds, as data.

The definitions and thresholds are in `docs/concepts/head-statistics.md`, the user guide
in `docs/guides/head-roles.md`.

Example:
    >>> from keras_mha.analysis import head_roles
    >>> result = head_roles(model, "Some text. More text.")  # doctest: +SKIP
    >>> print(result.table())  # doctest: +SKIP
"""

from keras_mha.analysis.result import HeadRoles
from keras_mha.analysis.roles import ROLE_RULES, ROLES, LayerRoles, classify_heads
from keras_mha.analysis.run import head_roles
from keras_mha.analysis.statistics import STATISTICS

__all__ = [
    "ROLES",
    "ROLE_RULES",
    "STATISTICS",
    "HeadRoles",
    "LayerRoles",
    "classify_heads",
    "head_roles",
]
