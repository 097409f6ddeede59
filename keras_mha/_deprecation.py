"""One warning for the modules that moved in 0.3 and still import from their old paths.

Example:
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn_moved("keras_mha.cards.rebuild", "keras_mha.models.rebuild")
    >>> str(caught[0].message).split(";")[0]
    'keras_mha.cards.rebuild is deprecated and will be removed in 0.4'
"""

import warnings


def warn_moved(old: str, new: str) -> None:
    """A `DeprecationWarning` at the importer of `old`: use `new` instead."""
    warnings.warn(
        f"{old} is deprecated and will be removed in 0.4; use {new}",
        DeprecationWarning,
        stacklevel=3,
    )
