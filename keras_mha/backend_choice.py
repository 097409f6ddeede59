"""Which Keras backend `import keras` will load, decided before Keras decides it.

Keras takes its backend from `KERAS_BACKEND`, else from `~/.keras/keras.json` (which Keras
writes on its first import, naming its default), else TensorFlow. After
`pip install "keras-mha[jax]"` that default is not installed, and `import keras` fails with
a 40-line traceback ending in `No module named 'tensorflow'`. So, once, just before the
first `import keras` that follows `import keras_mha`:

- `KERAS_BACKEND` names a backend that is not installed: `MissingDependencyError`, one
  line naming the backends that are installed and the extra that installs it;
- `KERAS_BACKEND` is unset and the backend Keras would pick is not installed: the first
  installed of `PREFERENCE` is set in `KERAS_BACKEND`, with one `UserWarning` saying so;
- no backend at all is installed: `MissingDependencyError` naming the extras.

Nothing is imported to find out: `importlib.util.find_spec` only looks for the packages.
A backend name Keras itself does not know is left to Keras (`keras-mha` reports it).

Example:
    >>> choose({"KERAS_BACKEND": "jax"}, installed=lambda name: True)
    >>> environ = {}
    >>> print(choose(environ, installed=lambda name: name == "torch", configured=None))
    ... # doctest: +NORMALIZE_WHITESPACE
    KERAS_BACKEND is not set and Keras would use tensorflow (its default), which is not
    installed: using torch, the one installed (set KERAS_BACKEND to choose)
    >>> environ
    {'KERAS_BACKEND': 'torch'}
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import warnings

from keras_mha.errors import MissingDependencyError

#: The backends keras-mha supports, in the order one is picked when Keras's is missing.
PREFERENCE = ("jax", "torch", "tensorflow")
KERAS_DEFAULT = "tensorflow"
_EXTRAS = "pip install 'keras-mha[jax]' (or [torch], [tensorflow])"


def is_installed(name: str) -> bool:
    """Whether `import name` can find the package (without importing it).

    Example:
        >>> is_installed("json"), is_installed("no_such_package_here")
        (True, False)
    """
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def configured_backend() -> str | None:
    """The backend `keras.json` names (in `KERAS_HOME`, else `~/.keras`), or None.

    Example:
        >>> configured_backend() in (None, *PREFERENCE) or True
        True
    """
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json"), encoding="utf-8") as file:
            backend = json.load(file).get("backend")
    except (OSError, ValueError, AttributeError):
        return None
    return backend if isinstance(backend, str) else None


def choose(environ, *, installed=is_installed, configured=configured_backend) -> str | None:
    """Check the backend Keras will load and, when `KERAS_BACKEND` is unset and that one is
    missing, set `environ["KERAS_BACKEND"]` to an installed one. Returns the line that
    says so (None when nothing changed).

    Args:
        environ: the environment to read and update (`os.environ`).
        installed: `name -> bool`, whether a package can be imported.
        configured: `() -> str | None`, the backend `keras.json` names (a callable), or
            that value itself.

    Raises:
        MissingDependencyError: `KERAS_BACKEND` names a supported backend that is not
            installed, or no backend is installed.
    """
    present = [name for name in PREFERENCE if installed(name)]
    named = environ.get("KERAS_BACKEND")
    if named:
        if named in PREFERENCE and named not in present:
            choice = (
                f"set KERAS_BACKEND to {' or '.join(present)}, or install it"
                if present
                else "install it"
            )
            raise MissingDependencyError(
                f"KERAS_BACKEND={named} but {named} is not installed; {choice}: "
                f"pip install 'keras-mha[{named}]'"
            )
        return None
    keras_json = configured() if callable(configured) else configured
    wanted = keras_json or KERAS_DEFAULT
    if wanted not in PREFERENCE or wanted in present:
        return None
    if not present:
        raise MissingDependencyError(
            f"no Keras backend is installed (Keras would use {wanted}); {_EXTRAS}"
        )
    source = "~/.keras/keras.json" if keras_json else "its default"
    environ["KERAS_BACKEND"] = present[0]
    others = "the one installed" if len(present) == 1 else f"installed: {', '.join(present)}"
    return (
        f"KERAS_BACKEND is not set and Keras would use {wanted} ({source}), which is not "
        f"installed: using {present[0]}, {others} (set KERAS_BACKEND to choose)"
    )


class _BeforeKeras:
    """A `sys.meta_path` entry that runs `choose` once, on the first `import keras`, then
    steps aside (it never finds a module itself)."""

    def find_spec(self, name, path=None, target=None):
        if name != "keras":
            return None
        uninstall()
        message = choose(os.environ)
        if message:
            warnings.warn(message, UserWarning, stacklevel=2)
        return None


_HOOK = _BeforeKeras()


def install() -> None:
    """Run `choose` before the first `import keras` (nothing when keras is imported already)."""
    if "keras" not in sys.modules and _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)


def uninstall() -> None:
    """Remove the hook of `install` (idempotent)."""
    while _HOOK in sys.meta_path:
        sys.meta_path.remove(_HOOK)


__all__ = ["KERAS_DEFAULT", "PREFERENCE", "choose", "configured_backend", "install", "is_installed"]
