"""How keras-mha reads the Hub settings huggingface_hub reads: offline mode, the endpoint,
the deadline of one exchange and the token, from the arguments first and the environment
(`HF_HUB_OFFLINE`, `HF_ENDPOINT`, `HF_HUB_ETAG_TIMEOUT`, `HF_TOKEN`) at call time.

Example:
    >>> deadline_seconds(DEFAULT_TIMEOUT_SECONDS)
    10.0
"""

from __future__ import annotations

import math
import os

from keras_mha.errors import InvalidTokenError, UsageError
from keras_mha.hub.inputs import validate_token
from keras_mha.safe_text import one_line

DEFAULT_TIMEOUT_SECONDS = 10.0
#: The longest `timeout` accepted (a day); anything longer is a typo, not a wish.
MAX_TIMEOUT_SECONDS = 86400.0

_TRUE_STRINGS = {"1", "on", "yes", "true"}
# Timeouts huggingface_hub reads from the environment once, at import, with `int()`: a
# value it cannot read would fail that import, so each is checked before.
TIMEOUT_VARIABLES = ("HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT")


def env_flag(name: str) -> bool:
    """Whether the environment variable `name` is set to a true value (1, on, yes, true).

    Example:
        >>> from unittest import mock
        >>> with mock.patch.dict("os.environ", {"DEMO_FLAG": " Yes "}):
        ...     env_flag("DEMO_FLAG")
        True
    """
    return os.environ.get(name, "").strip().lower() in _TRUE_STRINGS


def offline_requested() -> bool:
    """Whether `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`) asks for offline mode.

    Example:
        >>> from unittest import mock
        >>> with mock.patch.dict("os.environ", {"HF_HUB_OFFLINE": "1"}):
        ...     offline_requested()
        True
    """
    # Read the environment at call time: huggingface_hub reads HF_HUB_OFFLINE once, at import.
    return env_flag("HF_HUB_OFFLINE") or env_flag("TRANSFORMERS_OFFLINE")


def configured_endpoint() -> str | None:
    """`HF_ENDPOINT` when set, else None (huggingface_hub's default, huggingface.co).

    Example:
        >>> from unittest import mock
        >>> with mock.patch.dict("os.environ", {"HF_ENDPOINT": "https://hub.example"}):
        ...     configured_endpoint()
        'https://hub.example'
    """
    return os.environ.get("HF_ENDPOINT") or None


def environment_timeout(name: str) -> int | None:
    """The whole number of seconds in environment variable `name`, None when unset.

    Raises:
        UsageError: not a whole number of seconds from 1 to a day (what huggingface_hub
            reads with `int()`; 0 or a negative value would never time out or fail).

    Example:
        >>> environment_timeout("KERAS_MHA_UNSET_VARIABLE") is None
        True
    """
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        seconds = int(text)
    except ValueError:
        seconds = None
    if seconds is None or not 1 <= seconds <= MAX_TIMEOUT_SECONDS:
        raise UsageError(
            f"{name}={one_line(text)[:40]!r} is not a timeout; expected a whole number of "
            f"seconds from 1 to {MAX_TIMEOUT_SECONDS:g}, e.g. {name}=10 (or unset it)",
            key=name,
            value=text,
        )
    return seconds


def check_hub_environment() -> None:
    """Refuse, in one line, an environment huggingface_hub would fail to import with.

    Example:
        >>> check_hub_environment()
    """
    for name in TIMEOUT_VARIABLES:
        environment_timeout(name)


def deadline_seconds(timeout: float) -> float:
    """The deadline for the whole Hub exchange; `HF_HUB_ETAG_TIMEOUT` wins when set.

    Example:
        >>> from unittest import mock
        >>> with mock.patch.dict("os.environ", {"HF_HUB_ETAG_TIMEOUT": "5"}):
        ...     deadline_seconds(30)
        5.0
    """
    from_environment = environment_timeout("HF_HUB_ETAG_TIMEOUT")
    if from_environment is not None:
        return float(from_environment)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or not 0 < timeout <= MAX_TIMEOUT_SECONDS
    ):
        raise UsageError(
            f"--timeout {timeout!r} must be a number of seconds in (0, {MAX_TIMEOUT_SECONDS:g}]",
            key="timeout",
            value=timeout,
        )
    return float(timeout)


def resolve_token(huggingface_hub, token) -> tuple[str | None, str]:
    """(the token to send or None, how messages name it); malformed tokens are refused.

    `token` as `load_config` takes it: a string, False (send none), True (the stored one
    must exist) or None (`HF_TOKEN` or the stored login, unless implicit tokens are off).

    Example:
        >>> import huggingface_hub
        >>> resolve_token(huggingface_hub, False)
        (None, 'no token')
    """
    if isinstance(token, str):
        return token, "--token"
    if token is False:
        return None, "no token"
    from huggingface_hub import constants

    if token is None and constants.HF_HUB_DISABLE_IMPLICIT_TOKEN:
        return None, "no token"
    from_environment = bool(os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN"))
    named = "HF_TOKEN" if from_environment else "the stored Hub token"
    try:
        resolved = huggingface_hub.get_token()
    except Exception as error:  # noqa: BLE001 - e.g. an OIDC exchange that failed
        raise InvalidTokenError(
            f"{named}: cannot be read ({type(error).__name__}); log in again with "
            "`hf auth login` or set HF_TOKEN"
        ) from None
    if resolved is None:
        if token is True:
            raise InvalidTokenError(
                "token=True but no Hub token is stored; log in with `hf auth login` or set HF_TOKEN"
            )
        return None, "no token"
    validate_token(resolved, argument=named)
    return resolved, named
