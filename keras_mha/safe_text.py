"""Make untrusted text safe to show: secrets redacted, control characters made visible.

Messages keras-mha prints can quote text it did not write: a server's error message,
an exception from an HTTP client that names the URL (with `user:password@` in it), a
string from a stranger's `config.json`. Before such text reaches a terminal it passes
through here:

- `redact_secrets` replaces passwords in URLs (`https://user:***@host`; a user name with
  no password, often a token, entirely: `https://***@host`), query strings
  (`?***`), `Bearer` tokens, Hugging Face tokens (`hf_...`) and any secret the caller
  names (the token in use) with `***`.
- `visible` turns every character a terminal would act on (C0/C1 controls, ESC,
  DEL, bidi overrides, zero-width and line-separator characters) into a visible
  escape such as `\\x1b` or `\\u202e`, so text cannot recolour, move the cursor,
  hide or reorder what is printed.
- `one_line` does both and joins everything on one line: the shape of every
  `keras-mha: error:` message.

Only the standard library is imported.

Example:
    >>> one_line("GET https://me:s3cret@hub.example/x?sig=abc failed\\n\\x1b[31mred")
    'GET https://me:***@hub.example/x?*** failed \\\\x1b[31mred'
    >>> visible("gpt2\\u202e")
    'gpt2\\\\u202e'
"""

from __future__ import annotations

import re
from collections.abc import Iterable

REDACTED = "***"

# userinfo in a URL: scheme://user:password@host -> scheme://user:***@host
_URL_PASSWORD = re.compile(r"(?P<prefix>[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*):[^/\s@]*@")
# userinfo without a password is often the token itself (https://TOKEN@host): all of it.
_URL_USER_ONLY = re.compile(r"(?P<prefix>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s:@]+@")
# A query string may carry a signature or a token (signed CDN URLs, ?token=...).
_URL_QUERY = re.compile(r"(?P<prefix>[a-zA-Z][a-zA-Z0-9+.-]*://[^\s?#]*)\?[^\s#]*")
_BEARER = re.compile(r"(?i)(?P<prefix>\b(?:bearer|basic|token)[\s:=]+)[A-Za-z0-9._~+/=-]{6,}")
# Hugging Face user and OAuth tokens: hf_ followed by a long run of letters and digits.
_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9_]{8,}\b")

# Characters a terminal interprets: C0 controls (except none: tab and newline are
# handled by the caller), DEL, C1 controls, bidirectional embeddings/overrides/isolates,
# zero-width characters, line and paragraph separators, the byte-order mark, and lone
# surrogates (undecodable bytes of a command-line argument, which no stream can encode).
_INVISIBLE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u2069\ufeff"
    "\ufff9-\ufffb\ud800-\udfff]"
)


def redact_secrets(text: str, secrets: Iterable[str | None] = ()) -> str:
    """`text` with passwords in URLs, query strings, bearer and Hub tokens and the given
    `secrets` replaced by `***`.

    Example:
        >>> redact_secrets("token hf_abcdefghijklmnop rejected by https://u:p@h/a?t=1")
        'token *** rejected by https://u:***@h/a?***'
        >>> redact_secrets("my-private-value leaked", secrets=["my-private-value"])
        '*** leaked'
    """
    text = str(text)
    # Longest first, so a secret that contains another is replaced whole.
    for secret in sorted({s for s in secrets if isinstance(s, str) and len(s) >= 4}, key=len)[::-1]:
        text = text.replace(secret, REDACTED)
    text = _URL_PASSWORD.sub(lambda match: f"{match['prefix']}:{REDACTED}@", text)
    text = _URL_USER_ONLY.sub(lambda match: f"{match['prefix']}{REDACTED}@", text)
    text = _URL_QUERY.sub(lambda match: f"{match['prefix']}?{REDACTED}", text)
    text = _BEARER.sub(lambda match: f"{match['prefix']}{REDACTED}", text)
    return _HF_TOKEN.sub(REDACTED, text)


def visible(text: str) -> str:
    """`text` with every control, bidi-override and invisible character shown as an escape.

    Tabs and newlines are escaped too: callers that keep lines split first.

    Example:
        >>> visible("llama\\x1b[2J\\u202egpt")
        'llama\\\\x1b[2J\\\\u202egpt'
    """
    return _INVISIBLE.sub(_escape_character, str(text))


def one_line(text: str, secrets: Iterable[str | None] = ()) -> str:
    """One printable line: secrets redacted, whitespace runs (newlines included) joined by
    one space, other control characters shown as escapes.

    Example:
        >>> one_line("first line\\n  second\\tline")
        'first line second line'
    """
    joined = " ".join(redact_secrets(text, secrets).split())
    return visible(joined)


def _escape_character(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


__all__ = ["REDACTED", "one_line", "redact_secrets", "visible"]
