"""A small Hugging Face Hub look-alike for tests: real `huggingface_hub` against a local server.

`hf_hub_download` (huggingface_hub 2.x) makes two requests per file: `HEAD` then
`GET` on `/{repo_id}/resolve/{revision}/{filename}`. The HEAD answer must carry
`X-Repo-Commit` (the commit hash the revision resolves to), an `ETag` and the
`Content-Length`; failures carry `X-Error-Code` (`RepoNotFound`, `GatedRepo`,
`RevisionNotFound`, `EntryNotFound`) and `X-Error-Message`, which
`huggingface_hub.utils.hf_raise_for_status` turns into its named exceptions. This
server answers exactly that, for repositories held in memory:

    repos = {"org/name": {"main": {"config.json": b"{...}"}}}

plus gated and private repositories (`HubRepo(..., gated=True, tokens={"hf_x"})`),
a log of every request (method, path, headers) and a `delay_seconds` setting that
makes every answer wait, to drive client timeouts. `valid_tokens`, when set, makes the
server answer 401 "Invalid credentials" to any other bearer token, as the Hub does for
a revoked or mistyped one.

Hostile mode (`FakeHub(repos, hostile=Hostile(...))`) makes every 200 answer to a
`/resolve/` request misbehave the way a broken or malicious endpoint could: an ETag or
commit header that is a path (`../../x`) or huge, a redirect loop or an endless chain of
redirects, a body trickled a byte at a time, a huge body, HTML instead of JSON, a wrong
`Content-Length`, a redirect to another server (to check where the token goes).

Example:
    >>> hub = FakeHub({"org/tiny": {"main": {"config.json": b"{}"}}})
    >>> hub.start().url.startswith("http://127.0.0.1:")
    True
    >>> hub.stop()
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class HubRepo:
    """A model repository: `revisions` maps branch/tag names to `{filename: bytes}`.

    `gated` repos need a token from `tokens` (401 `GatedRepo` without a token, 403
    with one not in the list); `private` repos answer `RepoNotFound` unless a token
    from `tokens` is sent, as the real Hub does.
    """

    revisions: dict[str, dict[str, bytes]]
    gated: bool = False
    private: bool = False
    tokens: set[str] = field(default_factory=set)


KEEP = object()  # a Hostile field left as the honest server would answer


@dataclass
class Hostile:
    """How every successful `/resolve/` answer misbehaves (fields left at KEEP are honest).

    Attributes:
        etag, commit: replace the `ETag` / `X-Repo-Commit` header (None drops it).
        content_type: replace `Content-Type`.
        content_length: replace `Content-Length` (e.g. more bytes than are sent).
        body: replace the body.
        body_bytes: stream this many bytes of `{"a": "xxxx...` instead of the body (no
            Content-Length unless `content_length` gives one).
        trickle_seconds: wait this long before each byte of the body.
        redirect: "loop" (Location: the same URL), "chain" (a new URL every time, forever)
            or a full URL to send the client to (another server).
        only_files: when not empty, only these file names misbehave (e.g. the weights,
            so that config.json loads and the weights download meets the hostility).
    """

    etag: object = KEEP
    commit: object = KEEP
    content_type: object = KEEP
    content_length: object = KEEP
    body: object = KEEP
    body_bytes: int = 0
    trickle_seconds: float = 0.0
    redirect: str | None = None
    only_files: tuple[str, ...] = ()


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]

    @property
    def bearer_token(self) -> str | None:
        authorization = self.headers.get("authorization", "")
        return authorization[len("Bearer ") :] if authorization.startswith("Bearer ") else None


def commit_hash(repo_id: str, revision: str) -> str:
    """The 40-hex commit id this server gives `revision` of `repo_id` (stable across runs)."""
    return hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()


class FakeHub:
    """The server. `start()` binds 127.0.0.1 on a free port and serves from a thread."""

    def __init__(
        self,
        repos: dict[str, HubRepo | dict[str, dict[str, bytes]]],
        *,
        hostile: Hostile | None = None,
        valid_tokens: set[str] | None = None,
    ):
        self.repos = {
            repo_id: repo if isinstance(repo, HubRepo) else HubRepo(revisions=repo)
            for repo_id, repo in repos.items()
        }
        self.requests: list[RecordedRequest] = []
        self.delay_seconds = 0.0
        self.hostile = hostile
        self.valid_tokens = valid_tokens
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeHub:
        hub = self

        class Handler(_HubRequestHandler):
            fake_hub = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering; afterwards connections to `url` are refused."""
        if self._server is None:
            return
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self._server = None

    def resolve_requests(self, method: str | None = None) -> list[RecordedRequest]:
        return [
            request
            for request in self.requests
            if "/resolve/" in request.path and (method is None or request.method == method)
        ]

    # -- request handling ------------------------------------------------------------------

    def answer(self, method: str, path: str, headers: dict[str, str]):
        """(status, headers, body) for one request; the body is dropped for HEAD."""
        request = headers
        self.requests.append(RecordedRequest(method, path, headers))
        if self.delay_seconds:
            self._stopping.wait(self.delay_seconds)
        route = urlsplit(path).path
        if "/resolve/" not in route:
            return _error(404, None, f"no route for {route}")
        repo_id, _, rest = route.lstrip("/").partition("/resolve/")
        revision, _, filename = rest.partition("/")
        revision, filename = unquote(revision), unquote(filename)
        token = RecordedRequest(method, path, headers).bearer_token

        if token is not None and self.valid_tokens is not None and token not in self.valid_tokens:
            return _error(401, None, "Invalid credentials in Authorization header")
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and token not in repo.tokens):
            # Unauthenticated callers get 401 for missing repos too, so they can't probe names.
            return _error(404 if token else 401, "RepoNotFound", "Repository not found")
        if repo.gated and token not in repo.tokens:
            if token is None:
                return _error(
                    401,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted. You must have access to it "
                    "and be authenticated to access it. Please log in.",
                )
            return _error(
                403,
                "GatedRepo",
                f"Access to model {repo_id} is restricted and you are not in the authorized list.",
            )
        resolved = self._resolve_revision(repo_id, repo, revision)
        if resolved is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        revision_name, commit = resolved
        files = repo.revisions[revision_name]
        if filename not in files:
            status, error_headers, body = _error(
                404, "EntryNotFound", f"{filename} does not exist on {revision}"
            )
            error_headers["X-Repo-Commit"] = commit
            return status, error_headers, body
        content = files[filename]
        headers = {
            "X-Repo-Commit": commit,
            # A git blob id, as the Hub sends for files not stored with LFS.
            "ETag": f'"{hashlib.sha1(content).hexdigest()}"',
            "Content-Length": str(len(content)),
            "Content-Type": "application/json" if filename.endswith(".json") else "text/plain",
        }
        if self.hostile is None or (
            self.hostile.only_files and filename not in self.hostile.only_files
        ):
            return _ranged(headers, content, request.get("range"))
        return self._misbehave(path, headers, content)

    def _misbehave(self, path: str, headers: dict[str, str], content: bytes):
        hostile = self.hostile
        if hostile.redirect is not None:
            if hostile.redirect == "loop":
                location = path
            elif hostile.redirect == "chain":
                location = f"{urlsplit(path).path}?hop={len(self.requests)}"
            else:
                location = hostile.redirect
            # As the Hub redirects to its CDN: the file's metadata rides on the redirect.
            redirect_headers = {
                "Location": location,
                "X-Repo-Commit": headers["X-Repo-Commit"],
                "X-Linked-Etag": headers["ETag"],
                "X-Linked-Size": str(len(content)),
                "Content-Length": "0",
            }
            return 302, redirect_headers, b""
        for name, value in (
            ("ETag", hostile.etag),
            ("X-Repo-Commit", hostile.commit),
            ("Content-Type", hostile.content_type),
        ):
            if value is None:
                headers.pop(name, None)
            elif value is not KEEP:
                headers[name] = value
        body: bytes | Iterator[bytes] = content if hostile.body is KEEP else hostile.body
        if hostile.body_bytes:
            headers.pop("Content-Length", None)
            body = _huge_body(hostile.body_bytes)
        elif isinstance(body, bytes):
            headers["Content-Length"] = str(len(body))
        if hostile.content_length is not KEEP:
            headers["Content-Length"] = str(hostile.content_length)
        if hostile.trickle_seconds:
            body = _trickle(
                body if isinstance(body, bytes) else b"".join(body),
                hostile.trickle_seconds,
                self._stopping,
            )
        return 200, headers, body

    @staticmethod
    def _resolve_revision(repo_id: str, repo: HubRepo, revision: str):
        if revision in repo.revisions:
            return revision, commit_hash(repo_id, revision)
        for name in repo.revisions:
            if commit_hash(repo_id, name) == revision:
                return name, revision
        return None


def _ranged(headers: dict[str, str], content: bytes, requested: str | None):
    """200 with the whole file, or 206 with `Range: bytes=A-B` of it, as the Hub's CDN."""
    match = re.fullmatch(r"bytes=(\d+)-(\d+)", requested or "")
    if match is None:
        return 200, headers, content
    start, end = int(match.group(1)), min(int(match.group(2)), len(content) - 1)
    part = content[start : end + 1]
    headers = {**headers, "Content-Length": str(len(part))}
    headers["Content-Range"] = f"bytes {start}-{end}/{len(content)}"
    return 206, headers, part


def _huge_body(size: int, chunk: int = 1 << 20) -> Iterator[bytes]:
    yield b'{"a": "'
    sent = 7
    while sent < size:
        piece = min(chunk, size - sent)
        yield b"x" * piece
        sent += piece


def _trickle(body: bytes, seconds: float, stopping: threading.Event) -> Iterator[bytes]:
    for index in range(len(body)):
        if stopping.wait(seconds):
            return
        yield body[index : index + 1]


def _error(status: int, code: str | None, message: str):
    headers = {"X-Error-Message": message, "Content-Type": "application/json"}
    if code is not None:
        headers["X-Error-Code"] = code
    body = json.dumps({"error": message}).encode()
    headers["Content-Length"] = str(len(body))
    return status, headers, body


class _HubRequestHandler(BaseHTTPRequestHandler):
    fake_hub: FakeHub

    def do_HEAD(self):  # noqa: N802 - http.server's naming
        self._respond(send_body=False)

    def do_GET(self):  # noqa: N802
        self._respond(send_body=True)

    def _respond(self, *, send_body: bool):
        headers = {name.lower(): value for name, value in self.headers.items()}
        status, response_headers, body = self.fake_hub.answer(self.command, self.path, headers)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.send_response(status)
            for name, value in response_headers.items():
                self.send_header(name, value)
            self.end_headers()
            if not send_body:
                return
            chunks = [body] if isinstance(body, bytes) else body
            for chunk in chunks:
                self.wfile.write(chunk)
                self.wfile.flush()

    def log_message(self, format, *args):  # noqa: A002 - keep pytest output quiet
        pass


@contextlib.contextmanager
def hub_environment(tmp_path: Path, monkeypatch, repos, **hub_options):
    """Start a FakeHub and point huggingface_hub at it, with an empty HF cache under tmp_path.

    `hub_options` go to `FakeHub` (`hostile=`, `valid_tokens=`).

    Sets the environment (`HF_ENDPOINT`, `HF_HOME`, `HF_HUB_CACHE`, no `HF_TOKEN`, not
    offline) for subprocesses, and patches `huggingface_hub.constants`, which reads
    the environment once at import, for calls made in this process.
    """
    hub = FakeHub(repos, **hub_options).start()
    hf_home = tmp_path / "hf_home"
    cache = hf_home / "hub"
    environment = {
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(hf_home),
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    for name in (
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_HUB_ETAG_TIMEOUT",
        "HF_HUB_DOWNLOAD_TIMEOUT",
    ):
        monkeypatch.delenv(name, raising=False)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(
        constants,
        "HUGGINGFACE_CO_URL_TEMPLATE",
        hub.url + "/{repo_id}/resolve/{revision}/{filename}",
    )
    monkeypatch.setattr(constants, "HF_HOME", str(hf_home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(hf_home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(hf_home / "stored_tokens"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    try:
        yield hub
    finally:
        # The server speaks HTTP/1.0 and closes every connection after its answer, so the
        # shared client pools nothing: keep it (building a new one costs ~0.2 s a test).
        hub.stop()


def environment_for_subprocess(**overrides: str) -> dict[str, str]:
    """os.environ (as set by `hub_environment`) plus overrides, for `subprocess.run(env=...)`."""
    environment = dict(os.environ)
    environment.update(overrides)
    return environment


def tree(root: Path) -> dict[str, bytes | str]:
    """Every file and symlink under root: relative path -> content (or link target), so a
    test can show that nothing was written outside the HF cache."""
    found = {}
    for directory, _, files in os.walk(root):
        for name in files:
            path = Path(directory) / name
            key = str(path.relative_to(root))
            found[key] = os.readlink(path) if path.is_symlink() else path.read_bytes()
    return found


def world_with_deep_working_directory(tmp_path: Path, monkeypatch) -> Path:
    """Make `tmp_path/a/b/c/work` the working directory (so `../../x` lands inside
    tmp_path) and return tmp_path."""
    work = tmp_path / "a" / "b" / "c" / "work"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    return tmp_path
