"""One bounded GET of a Hub file through huggingface_hub's own HTTP session.

`huggingface_hub.hf_hub_download` names cache files after what the server sends (the
`ETag` becomes a file name, the revision a folder), retries for a minute and reads
bodies of any size. `fetch` instead makes one GET (plus redirects) through
`huggingface_hub.utils.get_session()` (so proxies, certificates and a custom client
factory apply) and returns the status, headers and body for the caller to check. It
guarantees:

- a deadline over the whole exchange: connecting, every redirect, the headers and a
  body trickled a byte at a time. The exchange runs in a worker thread that the caller
  stops waiting for at the deadline (the thread's own socket timeouts end it soon after);
- at most `MAX_REDIRECTS` redirects, none to another scheme than http(s), no loop; the
  `Authorization` header goes only to the first URL's origin and Hub hosts, as in
  huggingface_hub;
- a body of at most `max_bytes` (10 MB), decompressed with the same cap (no gzip bomb),
  and complete (a connection closed before `Content-Length` bytes is refused).

With `open_sink` (weights, gigabytes), the body is streamed instead of held: once the
final answer's headers are in, `open_sink(answer)` checks them and returns a writable
(or raises, and nothing is written); the body must then declare its `Content-Length`,
is capped at it, and gets `seconds_per_byte` more seconds per declared byte on top of
the deadline (a minimum average rate, so a trickle still ends; each read also times
out after `timeout`).

Failures raise `HubUnreachableError` with the bare reason (no connection, timeout,
offline mode: the caller may answer from the cache or a bundled card, or re-raise it
naming the model) or `HubResponseError` (the endpoint answered
something refused). Messages never quote a token or a URL's password or query.

Example:
    >>> from keras_mha.hub.fetch import MAX_REDIRECTS
    >>> MAX_REDIRECTS
    10
"""

from __future__ import annotations

import threading
import time
import zlib
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit

from keras_mha.errors import HubResponseError, HubUnreachableError
from keras_mha.safe_text import one_line

MAX_REDIRECTS = 10
MAX_BODY_BYTES = 10 * 1000 * 1000
_CHUNK_BYTES = 64 * 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}
_HUB_ORIGINS = {("https", "huggingface.co", 443), ("https", "hf.co", 443)}
_SENSITIVE_HEADERS = ("authorization", "cookie")


@dataclass
class HubAnswer:
    """The final answer of a GET: status, headers (names lower-case), body (empty unless
    the status is 2xx), and the Hub metadata headers seen along the redirect chain."""

    status: int
    headers: dict[str, str]
    body: bytes = b""
    url: str = ""
    commit: str | None = None
    etag: str | None = None
    linked_size: str | None = None
    hops: list[int] = field(default_factory=list)


def fetch(
    url: str,
    *,
    headers: dict[str, str],
    timeout: float,
    described_as: str,
    secrets: tuple[str, ...] = (),
    max_bytes: int | None = MAX_BODY_BYTES,
    open_sink=None,
    seconds_per_byte: float = 0.0,
) -> HubAnswer:
    """GET `url` within `timeout` seconds in all (see the module docstring).

    `max_bytes=None` (only with `open_sink`) caps the body at its declared length.

    Raises:
        HubUnreachableError: no answer in time, no connection, offline mode (its message
            is the reason; the caller adds what it was fetching).
        HubResponseError: a redirect loop or too many redirects, a body over `max_bytes`,
            a connection closed early, an unknown content encoding.
    """
    # A dict so that the exchange can extend the deadline once a streamed body's length
    # is known; the waiting thread re-reads it.
    clock = {"deadline": time.monotonic() + timeout, "timeout": timeout}
    stream = (open_sink, seconds_per_byte)
    outcome: dict = {}

    def exchange() -> None:
        try:
            outcome["answer"] = _exchange(
                url, headers, clock, described_as, secrets, max_bytes, stream
            )
        except BaseException as error:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = error

    worker = threading.Thread(target=exchange, name="keras-mha-hub-fetch", daemon=True)
    worker.start()
    while worker.is_alive():
        remaining = clock["deadline"] - time.monotonic()
        if remaining <= -0.05:
            raise HubUnreachableError(f"Timeout: no complete answer within {timeout:g} s")
        worker.join(min(max(remaining, 0.0) + 0.05, 1.0))
    if "error" in outcome:
        raise outcome["error"]
    return outcome["answer"]


def _exchange(url, headers, clock, described_as, secrets, max_bytes, stream) -> HubAnswer:
    import httpx2
    from huggingface_hub.errors import OfflineModeIsEnabled
    from huggingface_hub.utils import get_session

    session = get_session()
    first_origin = _origin(url)
    visited: set[str] = set()
    metadata: dict[str, str] = {}
    hops: list[int] = []
    for _ in range(MAX_REDIRECTS + 1):
        visited.add(url)
        trusted = _origin(url) in {first_origin, *_HUB_ORIGINS}
        request_headers = {
            name: value
            for name, value in headers.items()
            if trusted or name.lower() not in _SENSITIVE_HEADERS
        }
        remaining = clock["deadline"] - time.monotonic()
        if remaining <= 0:
            raise HubUnreachableError("Timeout: the deadline passed while following redirects")
        try:
            with session.stream(
                "GET",
                url,
                headers=request_headers,
                timeout=httpx2.Timeout(remaining),
                follow_redirects=False,
            ) as response:
                answer_headers = {name.lower(): value for name, value in response.headers.items()}
                if trusted:
                    for name in ("x-repo-commit", "x-linked-etag", "etag", "x-linked-size"):
                        if name in answer_headers:
                            metadata[name] = answer_headers[name]
                status = response.status_code
                hops.append(status)
                if 300 <= status < 400 and status != 304:
                    url = _redirect_target(url, answer_headers, visited, described_as, secrets)
                    continue
                answer = HubAnswer(
                    status=status,
                    headers=answer_headers,
                    url=url,
                    commit=metadata.get("x-repo-commit"),
                    etag=metadata.get("x-linked-etag") or metadata.get("etag"),
                    linked_size=metadata.get("x-linked-size"),
                    hops=hops,
                )
                open_sink, seconds_per_byte = stream
                if 200 <= status < 300 and open_sink is None:
                    answer.body = _read_body(
                        response, answer_headers, clock["deadline"], described_as, max_bytes
                    )
                elif 200 <= status < 300:
                    _stream_body(
                        response,
                        answer,
                        clock,
                        described_as,
                        max_bytes,
                        open_sink,
                        seconds_per_byte,
                    )
                return answer
        except (HubResponseError, HubUnreachableError):
            raise
        except OfflineModeIsEnabled:
            raise HubUnreachableError("offline mode is on (HF_HUB_OFFLINE)") from None
        except httpx2.RemoteProtocolError as error:
            reason = _reason(error, secrets)
            if "disconnected" in reason.lower() and not hops:
                raise HubUnreachableError(f"RemoteProtocolError: {reason}") from None
            raise HubResponseError(
                f"{described_as}: the endpoint sent a broken HTTP answer ({reason})"
            ) from None
        except (httpx2.UnsupportedProtocol, httpx2.InvalidURL) as error:
            raise HubResponseError(
                f"{described_as}: cannot request {one_line(url, secrets)} "
                f"({_reason(error, secrets)})"
            ) from None
        except (httpx2.TransportError, ConnectionError, TimeoutError) as error:  # timeouts too
            reason = f"{type(error).__name__}: {_reason(error, secrets)}"
            raise HubUnreachableError(reason) from None
    raise HubResponseError(
        f"{described_as}: the endpoint redirected more than {MAX_REDIRECTS} times "
        f"(last to {one_line(url, secrets)}); check HF_ENDPOINT / --endpoint"
    )


def _redirect_target(url, answer_headers, visited, described_as, secrets) -> str:
    location = answer_headers.get("location")
    if not location:
        raise HubResponseError(f"{described_as}: the endpoint sent a redirect without a Location")
    target = urljoin(url, location.strip())
    scheme = urlsplit(target).scheme.lower()
    if scheme not in ("http", "https"):
        raise HubResponseError(
            f"{described_as}: the endpoint redirected to a {one_line(scheme)!r} URL; only "
            "http(s) is followed"
        )
    if target in visited:
        raise HubResponseError(
            f"{described_as}: the endpoint redirects in a loop (back to "
            f"{one_line(target, secrets)}); check HF_ENDPOINT / --endpoint"
        )
    return target


def _declared_length(answer_headers, described_as) -> int | None:
    declared = answer_headers.get("content-length")
    if declared is None:
        return None
    try:
        length = int(declared)
    except ValueError:
        length = -1
    if length < 0:
        raise HubResponseError(
            f"{described_as}: the endpoint sent Content-Length {one_line(declared)[:40]!r}, "
            "not a number of bytes"
        )
    return length


def _stream_body(response, answer, clock, described_as, max_bytes, open_sink, seconds_per_byte):
    """Stream the body into `open_sink(answer)`: exactly the declared length, unencoded."""
    import httpx2

    declared_length = _declared_length(answer.headers, described_as)
    if declared_length is None:
        raise HubResponseError(
            f"{described_as}: the endpoint sent no Content-Length; a file download needs one"
        )
    encoding = answer.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise HubResponseError(
            f"{described_as}: the endpoint sent Content-Encoding {one_line(encoding)[:40]!r} "
            "for a file download; expected identity"
        )
    limit = declared_length if max_bytes is None else min(max_bytes, declared_length)
    if declared_length > limit:
        raise HubResponseError(
            f"{described_as}: the endpoint announced {declared_length:,} bytes; expected at "
            f"most {limit:,}"
        )
    sink = open_sink(answer)
    clock["deadline"] = max(
        clock["deadline"], time.monotonic() + clock["timeout"] + declared_length * seconds_per_byte
    )
    received = 0
    try:
        for chunk in response.iter_raw(_CHUNK_BYTES):
            received += len(chunk)
            if received > limit:
                raise HubResponseError(
                    f"{described_as}: the endpoint sent more than the {limit:,} bytes it announced"
                )
            sink.write(chunk)
            if time.monotonic() > clock["deadline"]:
                raise HubUnreachableError(
                    f"Timeout: the body was still arriving at the deadline ({received:,} of "
                    f"{declared_length:,} bytes)"
                )
    except httpx2.RemoteProtocolError:
        pass  # closed early: reported just below as incomplete
    except httpx2.TimeoutException as error:
        raise HubUnreachableError(
            f"Timeout: no byte for {clock['timeout']:g} s after {received:,} of "
            f"{declared_length:,} bytes ({type(error).__name__})"
        ) from None
    if received != declared_length:
        raise HubResponseError(
            f"{described_as}: the endpoint closed the connection after {received:,} bytes of "
            f"the {declared_length:,} announced; the download is incomplete"
        )


def _read_body(response, answer_headers, deadline, described_as, max_bytes) -> bytes:
    """The body, decompressed, at most `max_bytes`, complete, before `deadline`."""
    import httpx2

    declared_length = _declared_length(answer_headers, described_as)
    if declared_length is not None:
        if declared_length > max_bytes:
            raise HubResponseError(
                f"{described_as}: the endpoint announced {declared_length:,} bytes; a "
                f"config.json is at most {max_bytes:,} bytes"
            )
    decoder = _decoder(answer_headers.get("content-encoding", ""), described_as)
    body = bytearray()
    received = 0
    try:
        for chunk in response.iter_raw(_CHUNK_BYTES):
            received += len(chunk)
            if decoder is None:
                body += chunk
            else:
                body += decoder.decompress(chunk, max_bytes + 1 - len(body))
                if decoder.unconsumed_tail:
                    body += b"x"  # more output than the cap allows: over the cap
            if len(body) > max_bytes or received > max_bytes:
                raise HubResponseError(
                    f"{described_as}: the endpoint sent more than {max_bytes:,} bytes; a "
                    "config.json is a few KB"
                )
            if time.monotonic() > deadline:
                raise HubUnreachableError(
                    f"Timeout: the body was still arriving at the deadline ({received:,} bytes)"
                )
    except httpx2.RemoteProtocolError:
        expected = f" of the {declared_length:,} announced" if declared_length else ""
        raise HubResponseError(
            f"{described_as}: the endpoint closed the connection after {received:,} bytes"
            f"{expected}; the answer is incomplete"
        ) from None
    except zlib.error as error:
        raise HubResponseError(
            f"{described_as}: the endpoint sent a corrupt compressed body ({error})"
        ) from None
    if decoder is not None:
        body += decoder.flush()
    return bytes(body)


def _decoder(content_encoding: str, described_as: str):
    encoding = content_encoding.strip().lower()
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.decompressobj()
    raise HubResponseError(
        f"{described_as}: the endpoint sent Content-Encoding {one_line(encoding)[:40]!r}; "
        "expected identity, gzip or deflate"
    )


def _origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return scheme, (parts.hostname or "").lower(), port or _DEFAULT_PORTS.get(scheme, 0)


def _reason(error: BaseException, secrets) -> str:
    return one_line(str(error), secrets)[:300] or type(error).__name__


__all__ = ["MAX_BODY_BYTES", "MAX_REDIRECTS", "HubAnswer", "fetch"]
