"""Check what a user hands the Hub path before any request: revision, token, endpoint, URL.

Everything here is refused before a byte goes on the wire, so that a revision such as
`../../x` can never become a path in the HF cache, a token with a newline can never
become a broken HTTP header, and a pasted Hub page URL becomes a repo id and revision.

- `validate_revision`: a branch or tag name (git's `check-ref-format` rules), `refs/pr/N`
  or a commit hash; anything else is `InvalidRevisionError` (exit 11).
- `validate_token`: printable ASCII without spaces, at most 4096 characters; anything
  else is `InvalidTokenError` (exit 12). The token itself never appears in a message.
- `validate_endpoint`: an `http(s)://host[:port][/path]` URL; else `UsageError`.
- `parse_hub_url`: `https://huggingface.co/org/name[/tree/REV | /blob/REV/config.json]`
  -> `("org/name", "REV")`.

Example:
    >>> validate_revision("refs/pr/12")
    'refs/pr/12'
    >>> parse_hub_url("https://huggingface.co/openai-community/gpt2/tree/main")
    ('openai-community/gpt2', 'main')
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

from keras_mha.errors import InvalidRevisionError, InvalidTokenError, UsageError
from keras_mha.safe_text import one_line, visible

MAX_REVISION_LENGTH = 255
MAX_TOKEN_LENGTH = 4096
CONFIG_FILENAME = "config.json"
COMMIT_HASH = re.compile(r"[0-9a-f]{40}")
# A Hub pull request's ref; `refs/pr/...` in any other shape names nothing.
_PULL_REQUEST_REF = re.compile(r"refs/pr/[1-9][0-9]{0,9}")

# Hosts whose model pages `parse_hub_url` understands (besides the configured endpoint's).
HUB_HOSTS = frozenset({"huggingface.co", "www.huggingface.co", "hf.co", "www.hf.co"})
# Characters git refuses in a ref name (git-check-ref-format(1), rules 4, 5 and 10), plus
# the characters a terminal would act on (shown by `safe_text.visible`).
_FORBIDDEN_IN_REF = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")
_TOKEN_CHARACTERS = re.compile(r"[\x21-\x7e]+")
_REPO_TYPE_PREFIXES = {"datasets": "a dataset", "spaces": "a Space", "buckets": "a bucket"}


def revision_problem(revision: str) -> str | None:
    """Why `revision` is not a branch, tag, `refs/pr/N` or commit hash, or None if it is one.

    Example:
        >>> revision_problem("v1.0"), revision_problem("../../x")
        (None, "contains '..'")
    """
    if not isinstance(revision, str):
        return f"is a {type(revision).__name__}, not a string"
    if not revision:
        return "is empty"
    if len(revision) > MAX_REVISION_LENGTH:
        return f"is {len(revision)} characters long (at most {MAX_REVISION_LENGTH})"
    forbidden = _FORBIDDEN_IN_REF.search(revision)
    if forbidden:
        character = forbidden.group()
        name = "a space" if character == " " else f"{visible(character)!r}"
        return f"contains {name}"
    if visible(revision) != revision:
        return "contains an invisible or control character"
    if ".." in revision:
        return "contains '..'"
    if revision.startswith("/") or revision.endswith("/"):
        return "starts or ends with '/'"
    if "//" in revision:
        return "contains '//'"
    if "@{" in revision or revision == "@":
        return "is '@' or contains '@{'"
    if revision.endswith("."):
        return "ends with '.'"
    if (revision + "/").startswith("refs/pr/") and not _PULL_REQUEST_REF.fullmatch(revision):
        return "is not refs/pr/N with N the pull request's number"
    for component in revision.split("/"):
        if component.startswith("."):
            return f"has a component starting with '.' ({component!r})"
        if component.endswith(".lock"):
            return f"has a component ending with '.lock' ({component!r})"
    return None


def validate_revision(revision: str, *, argument: str = "--revision") -> str:
    """`revision` unchanged when it is a branch, tag, `refs/pr/N` or commit hash.

    Raises:
        InvalidRevisionError: naming the argument, the (escaped) value and the rule broken.

    Example:
        >>> validate_revision("main")
        'main'
        >>> try:
        ...     validate_revision("../../x")
        ... except ValueError as error:
        ...     print(error.exit_code, str(error)[:35])
        11 --revision '../../x' contains '..';
    """
    problem = revision_problem(revision)
    if problem is None:
        return revision
    shown = one_line(repr(revision[:80] if isinstance(revision, str) else revision))
    raise InvalidRevisionError(
        f"{argument} {shown} {problem}; expected a branch, tag, refs/pr/N or a "
        "40-character commit hash",
        revision=revision if isinstance(revision, str) else None,
    )


def validate_token(token, *, argument: str = "--token") -> None:
    """Refuse a malformed Hub token before it becomes an HTTP header; the message never
    quotes the token.

    Example:
        >>> validate_token("hf_abcdefghijklmnopqrstuvwxyz012345")
        >>> try:
        ...     validate_token("hf_abc\\n")
        ... except ValueError as error:
        ...     print(error.exit_code, str(error)[:43])
        12 --token is malformed: it contains a newline
    """
    if not isinstance(token, str):
        raise InvalidTokenError(f"{argument} is a {type(token).__name__}, expected a string")
    problem = None
    if not token:
        problem = "it is empty"
    elif len(token) > MAX_TOKEN_LENGTH:
        problem = f"it is {len(token)} characters long (at most {MAX_TOKEN_LENGTH})"
    elif not _TOKEN_CHARACTERS.fullmatch(token):
        if any(character in token for character in "\r\n") or visible(token) != token:
            problem = "it contains a newline or control character"
        elif any(character.isspace() for character in token):
            problem = "it contains a space"
        else:
            problem = "it contains a non-ASCII character"
    if problem is not None:
        raise InvalidTokenError(
            f"{argument} is malformed: {problem}; expected one word of printable ASCII "
            "(e.g. hf_...)"
        )


def validate_endpoint(endpoint: str, *, argument: str = "--endpoint") -> str:
    """The endpoint without a trailing slash, when it is an `http(s)://host` URL.

    Example:
        >>> validate_endpoint("https://hf-mirror.example/")
        'https://hf-mirror.example'
    """
    problem = None
    try:
        parts = urlsplit(endpoint)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except (ValueError, TypeError, AttributeError):
        parts, problem = None, "is not a URL"
    if problem is None and parts.scheme.lower() not in ("http", "https"):
        problem = "is not an http:// or https:// URL"
    elif problem is None and not parts.hostname:
        problem = "names no host"
    elif problem is None and (parts.query or parts.fragment or visible(endpoint) != endpoint):
        problem = "holds a query, fragment or control character"
    if problem is not None:
        raise UsageError(
            f"{argument} {one_line(repr(str(endpoint)[:200]))} {problem}; expected e.g. "
            "https://huggingface.co",
            key=argument,
        )
    return endpoint.rstrip("/")


def looks_like_hub_url(text: str) -> bool:
    """True for `http(s)://...` and for `huggingface.co/...` / `hf.co/...` without a scheme.

    Example:
        >>> looks_like_hub_url("hf.co/org/name"), looks_like_hub_url("org/name")
        (True, False)
    """
    lowered = text.lower()
    return lowered.startswith(("http://", "https://")) or any(
        lowered.startswith(f"{host}/") for host in HUB_HOSTS
    )


def parse_hub_url(url: str, *, endpoint: str | None = None) -> tuple[str, str | None]:
    """`(repo_id, revision or None)` from a model page URL pasted from the browser.

    Accepted: `https://huggingface.co/ORG/NAME`, `.../tree/REV`, `.../blob/REV/config.json`,
    `.../resolve/REV/config.json`, `.../commit/SHA` (also on `hf.co`, without the scheme,
    and on the configured endpoint's host). `REV` may be percent-encoded (`refs%2Fpr%2F3`).

    Raises:
        UsageError: not a Hub model URL (another host, a dataset or Space, another file).
        InvalidRevisionError: the revision in the URL is not a valid ref.

    Example:
        >>> parse_hub_url("https://huggingface.co/org/name/blob/refs%2Fpr%2F3/config.json")
        ('org/name', 'refs/pr/3')
        >>> parse_hub_url("huggingface.co/gpt2")
        ('gpt2', None)
    """
    shown = one_line(repr(url[:200]))
    text = url if "://" in url else f"https://{url}"
    try:
        parts = urlsplit(text)
        host = (parts.hostname or "").lower()
    except ValueError:
        raise UsageError(f"MODEL {shown} is not a valid URL", key="MODEL") from None
    hosts = set(HUB_HOSTS)
    if endpoint:
        try:
            hosts.add((urlsplit(endpoint).hostname or "").lower())
        except ValueError:
            pass
    if parts.scheme.lower() not in ("http", "https") or host not in hosts:
        raise UsageError(
            f"MODEL {shown} is not a Hugging Face Hub model URL; expected "
            "https://huggingface.co/ORG/NAME (optionally /tree/REVISION), a model id, a "
            "local path or bundled:ORG/NAME",
            key="MODEL",
        )
    segments = [unquote(segment) for segment in parts.path.split("/") if segment]
    if segments and segments[0] in _REPO_TYPE_PREFIXES:
        raise UsageError(
            f"MODEL {shown} is {_REPO_TYPE_PREFIXES[segments[0]]}, not a model; keras-mha reads "
            "model repositories",
            key="MODEL",
        )
    if segments and segments[0] == "models":
        segments = segments[1:]
    if not segments:
        raise UsageError(f"MODEL {shown} names no repository; expected .../ORG/NAME", key="MODEL")
    if len(segments) == 1:
        return segments[0], None
    repo_id, rest = f"{segments[0]}/{segments[1]}", segments[2:]
    if not rest:
        return repo_id, None
    view, arguments = rest[0], rest[1:]
    if view in ("tree", "commit") and len(arguments) == 1:
        return repo_id, validate_revision(arguments[0], argument=f"the revision in {shown}")
    if view in ("blob", "resolve", "raw") and len(arguments) >= 2:
        filename = "/".join(arguments[1:])
        if filename != CONFIG_FILENAME:
            raise UsageError(
                f"MODEL {shown} points at {one_line(filename)!r}; keras-mha reads the "
                f"repository's top-level {CONFIG_FILENAME} (use .../blob/REV/config.json or "
                "the repository URL)",
                key="MODEL",
            )
        return repo_id, validate_revision(arguments[0], argument=f"the revision in {shown}")
    raise UsageError(
        f"MODEL {shown} is not a model page URL keras-mha understands; expected "
        "https://huggingface.co/ORG/NAME, .../tree/REVISION or .../blob/REVISION/config.json",
        key="MODEL",
    )


__all__ = [
    "COMMIT_HASH",
    "HUB_HOSTS",
    "looks_like_hub_url",
    "parse_hub_url",
    "revision_problem",
    "validate_endpoint",
    "validate_revision",
    "validate_token",
]
