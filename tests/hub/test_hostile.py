"""The Hub path against a hostile endpoint: nothing written outside the HF cache, one line
per failure with its exit code, the deadline held, no secret printed.

Every case runs the real client code against `tests/hub_server.FakeHub` in hostile mode
and snapshots the whole temporary tree (HF home, cache and the working directory)
before and after, so a file written anywhere under it is seen.
"""

import hashlib
import json
import os
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keras_mha import cli, errors
from keras_mha.hub.config import load_config
from tests.configs import tiny_llama
from tests.hub_server import (
    KEEP,
    FakeHub,
    Hostile,
    HubRepo,
    commit_hash,
    hub_environment,
    tree,
    world_with_deep_working_directory,
)

pytestmark = pytest.mark.backend_independent

TINY_CONFIG = tiny_llama()
TINY_BYTES = json.dumps(TINY_CONFIG).encode()
GOOD_TOKEN = "hf_GoodTokenWithAccess0123456789"
REPOS = {
    "org/tiny": {"main": {"config.json": TINY_BYTES}, "v1": {"config.json": TINY_BYTES}},
    "org/private": HubRepo(
        {"main": {"config.json": TINY_BYTES}}, private=True, tokens={GOOD_TOKEN}
    ),
}


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A temp tree with a working directory deep inside it (so `../../x` lands in it)."""
    return world_with_deep_working_directory(tmp_path, monkeypatch)


def hostile_hub(world, monkeypatch, hostile, **options):
    return hub_environment(world, monkeypatch, REPOS, hostile=hostile, **options)


def assert_one_line(error: BaseException, exit_code: int, *mentions: str):
    message = str(error)
    assert "\n" not in message and "\x1b" not in message, message
    assert error.exit_code == exit_code, (type(error), message)
    for mention in mentions:
        assert mention in message, f"{mention!r} not in {message!r}"


# -- names from the server never become paths -------------------------------------------------

BAD_ETAGS = [
    '"../../x"',
    "../../../../../pwned",
    '"../../../../../../../a/b/c/work/pwned"',
    "ABSOLUTE",  # replaced by an absolute path inside the temp tree
    'W/"' + "a" * 39 + '/"',
    "e" * 10_000,  # huge
    '""',
]


@pytest.mark.parametrize("etag", BAD_ETAGS, ids=range(len(BAD_ETAGS)))
def test_a_hostile_etag_writes_nothing_anywhere(world, monkeypatch, etag):
    if etag == "ABSOLUTE":
        etag = f'"{world / "pwned-absolute"}"'
    with hostile_hub(world, monkeypatch, Hostile(etag=etag)):
        before = tree(world)
        with pytest.raises(errors.HubResponseError) as raised:
            load_config("org/tiny")
        assert tree(world) == before
    assert_one_line(raised.value, 13, "org/tiny@main", "ETag")
    assert len(str(raised.value)) < 400


@pytest.mark.parametrize(
    "commit", ["../../x", "..", "main", "0" * 39, "g" * 40, "a" * 40 + "/../../x", None]
)
def test_a_hostile_commit_header_writes_nothing(world, monkeypatch, commit):
    with hostile_hub(world, monkeypatch, Hostile(commit=commit)):
        before = tree(world)
        with pytest.raises(errors.HubResponseError) as raised:
            load_config("org/tiny")
        assert tree(world) == before
    assert_one_line(raised.value, 13, "X-Repo-Commit")


def test_a_commit_other_than_the_one_asked_for_is_refused(world, monkeypatch):
    asked = commit_hash("org/tiny", "main")
    with hostile_hub(world, monkeypatch, Hostile(commit="b" * 40)):
        with pytest.raises(errors.HubResponseError) as raised:
            load_config("org/tiny", revision=asked)
    assert_one_line(raised.value, 13, asked, "b" * 40)


@pytest.mark.parametrize(
    "revision",
    [
        "../../x",
        "../../../../../../tmp/x",
        "main/../../x",
        "/etc",
        "a//b",
        "v1\n",
        "v1 x",
        "x\\y",
        "a..b",
        ".hidden",
        "x.lock",
        "@{-1}",
        "~1",
        "a" * 300,
        "",
        "v1\x1b[2J",
    ],
)
def test_a_bad_revision_is_refused_before_any_request(world, monkeypatch, revision):
    with hostile_hub(world, monkeypatch, None) as hub:
        before = tree(world)
        with pytest.raises(errors.InvalidRevisionError) as raised:
            load_config("org/tiny", revision=revision)
        assert hub.requests == []
        assert tree(world) == before
    assert_one_line(raised.value, 11, "--revision")


def test_revision_traversal_from_the_cli_writes_nothing_outside_the_cache(
    world, monkeypatch, capsys
):
    # Before 0.2 `--revision ../../x` made huggingface_hub write refs/../../x: outside the cache.
    with hostile_hub(world, monkeypatch, None) as hub:
        before = tree(world)
        code = cli.main(["inspect", "org/tiny", "--revision", "../../x"])
        assert hub.requests == []
        assert tree(world) == before
    err = capsys.readouterr().err
    assert code == 11 and err.count("\n") == 1 and "'../../x'" in err


def test_a_traversal_revision_the_server_serves_is_still_refused(world, monkeypatch):
    # This server answers for the revision "../../../x" (as a broken mirror that ignores the
    # revision would). huggingface_hub's own hf_hub_download then writes refs/../../../x,
    # outside the cache; keras-mha refuses the revision before any request.
    traversal = "../../../x"
    repos = {"org/tiny": {"main": {"config.json": TINY_BYTES}, traversal: {"config.json": b"{}"}}}
    with hub_environment(world, monkeypatch, repos) as hub:
        before = tree(world)
        with pytest.raises(errors.InvalidRevisionError):
            load_config("org/tiny", revision=traversal)
        assert hub.requests == [] and tree(world) == before

        import huggingface_hub

        huggingface_hub.hf_hub_download("org/tiny", "config.json", revision=traversal)
        escaped = {path for path in set(tree(world)) - set(before) if "hf_home/hub/" not in path}
    assert escaped == {"hf_home/x"}, "the control: upstream writes outside the cache here"


def test_valid_refs_are_accepted_and_cached_in_the_hub_layout(world, monkeypatch):
    with hostile_hub(world, monkeypatch, None) as hub:
        loaded = load_config("org/tiny", revision="v1")
        cache = world / "hf_home" / "hub"
        added = set(tree(world))
        commit = commit_hash("org/tiny", "v1")
        etag = hashlib.sha1(TINY_BYTES).hexdigest()
        assert added == {
            f"hf_home/hub/models--org--tiny/blobs/{etag}",
            f"hf_home/hub/models--org--tiny/snapshots/{commit}/config.json",
            "hf_home/hub/models--org--tiny/refs/v1",
        }
        assert loaded.path == cache / "models--org--tiny" / "snapshots" / commit / "config.json"
        # huggingface_hub itself finds it, offline.
        from huggingface_hub import try_to_load_from_cache

        assert try_to_load_from_cache("org/tiny", "config.json", revision="v1") == str(loaded.path)
        assert [request.method for request in hub.resolve_requests()] == ["GET"]


# -- redirects, trickles, huge bodies, HTML, broken lengths -----------------------------------


@pytest.mark.parametrize("redirect, mention", [("loop", "loop"), ("chain", "more than 10")])
def test_redirect_loops_end_with_one_line(world, monkeypatch, redirect, mention):
    with hostile_hub(world, monkeypatch, Hostile(redirect=redirect)) as hub:
        before = tree(world)
        start = time.perf_counter()
        with pytest.raises(errors.HubResponseError) as raised:
            load_config("org/tiny", timeout=5)
        assert time.perf_counter() - start < 5
        assert tree(world) == before
        assert len(hub.requests) <= 11
    assert_one_line(raised.value, 13, mention)


def test_a_trickled_body_is_cut_at_the_deadline(world, monkeypatch):
    with hostile_hub(world, monkeypatch, Hostile(trickle_seconds=0.1)):
        before = tree(world)
        start = time.perf_counter()
        with pytest.raises(errors.HubUnreachableError) as raised:
            load_config("org/tiny", timeout=1.0)
        elapsed = time.perf_counter() - start
        assert tree(world) == before
    # The body needs ~25 s at this pace; the whole run is bounded by the 1 s deadline.
    assert elapsed < 2.5, elapsed
    assert_one_line(raised.value, 8, "org/tiny", "Timeout")


@pytest.mark.parametrize(
    "hostile, mention",
    [
        (Hostile(content_length=50_000_000), "50,000,000 bytes"),
        (Hostile(body_bytes=11_000_000), "more than 10,000,000 bytes"),
        (Hostile(content_length=len(TINY_BYTES) + 100), "closed the connection"),
        (Hostile(content_length="12abc"), "Content-Length"),
        (
            Hostile(content_type="text/html", body=b"<html><body>Sign in</body></html>"),
            "HTML page",
        ),
    ],
    ids=["announced-huge", "streamed-huge", "short-body", "bad-length", "html"],
)
def test_bodies_that_are_refused(world, monkeypatch, hostile, mention):
    with hostile_hub(world, monkeypatch, hostile):
        before = tree(world)
        with pytest.raises(errors.CardError) as raised:
            load_config("org/tiny", timeout=10)
        assert tree(world) == before
    assert_one_line(raised.value, 13, mention)


@pytest.mark.parametrize(
    "body, mention",
    [
        (b"<!doctype html><html></html>", "HTML"),
        (b"[" * 50_000 + b"]" * 50_000, "nested"),
        (b'{"a": ' + b"[" * 150 + b"]" * 150 + b"}", "nested 151 levels"),
        (b'{"model_type": 1' + b"1" * 5000 + b"}", "not valid JSON"),
        (b"\xff\xfe{}", "UTF-8"),
    ],
    ids=["html-as-json", "deep-list", "deep-object", "huge-int", "not-utf8"],
)
def test_malformed_bodies_are_one_line_and_not_cached(world, monkeypatch, body, mention):
    with hostile_hub(world, monkeypatch, Hostile(body=body)):
        before = tree(world)
        with pytest.raises(errors.MalformedConfigError) as raised:
            load_config("org/tiny")
        assert tree(world) == before
    assert_one_line(raised.value, 7, mention)


def test_a_redirect_to_another_server_gets_no_token(world, monkeypatch):
    cdn = FakeHub({"org/tiny": {"main": {"config.json": TINY_BYTES}}}).start()
    try:
        target = f"{cdn.url}/org/tiny/resolve/main/config.json"
        with hostile_hub(world, monkeypatch, Hostile(redirect=target)) as hub:
            loaded = load_config("org/private", token=GOOD_TOKEN)
            assert hub.requests[0].bearer_token == GOOD_TOKEN
    finally:
        cdn.stop()
    assert loaded.config == TINY_CONFIG
    # The commit comes from the Hub's redirect; the other server never saw the token.
    assert loaded.commit == commit_hash("org/private", "main")
    assert [request.bearer_token for request in cdn.requests] == [None]


# -- tokens and passwords -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "token, problem",
    [("hf_abc\ndef", "newline"), ("hf abc", "space"), ("hf_é", "non-ASCII"), ("", "empty")],
)
def test_a_malformed_token_is_refused_before_any_request(
    world, monkeypatch, capsys, token, problem
):
    with hostile_hub(world, monkeypatch, None) as hub:
        code = cli.main(["inspect", "org/tiny", "--token", token])
        assert hub.requests == []
    err = capsys.readouterr().err
    assert code == 12 and err.count("\n") == 1 and problem in err
    if token:
        assert token not in err


def test_a_malformed_hf_token_is_named_without_showing_it(world, monkeypatch):
    with hostile_hub(world, monkeypatch, None) as hub:
        monkeypatch.setenv("HF_TOKEN", "hf_secret value")
        with pytest.raises(errors.InvalidTokenError) as raised:
            load_config("org/tiny")
        assert hub.requests == []
    assert_one_line(raised.value, 12, "HF_TOKEN", "space")
    assert "secret" not in str(raised.value)


def test_a_token_the_hub_rejects_is_reported_as_such(world, monkeypatch, capsys):
    revoked = "hf_RevokedToken0123456789abcdef"
    with hostile_hub(world, monkeypatch, None, valid_tokens={GOOD_TOKEN}):
        code = cli.main(["inspect", "org/tiny", "--token", revoked])
    err = capsys.readouterr().err
    assert code == 12 and err.count("\n") == 1
    assert "rejected the token" in err and revoked not in err and "unreachable" not in err


def test_passwords_and_tokens_never_reach_a_message(world, monkeypatch, capsys):
    with hostile_hub(world, monkeypatch, None) as hub:
        port = hub.url.rsplit(":", 1)[1]
        hub.stop()  # connection refused: the message names the reason, never the password
        endpoint = f"http://alice:pa55word-secret@127.0.0.1:{port}"
        code = cli.main(
            ["inspect", "org/tiny", "--endpoint", endpoint, "--token", GOOD_TOKEN, "--timeout", "2"]
        )
    err = capsys.readouterr().err
    assert code == 8 and err.count("\n") == 1
    assert "pa55word-secret" not in err and GOOD_TOKEN not in err


# -- the whole CLI, in a real process --------------------------------------------------------


def run_process(world, arguments, **environment):
    completed = subprocess.run(
        [sys.executable, "-m", "keras_mha.cli", *arguments],
        capture_output=True,
        text=True,
        env={**os.environ, **environment},
        timeout=60,
        cwd=os.getcwd(),
    )
    assert "Traceback" not in completed.stderr
    return completed


def test_hostile_etag_in_a_real_process(world, monkeypatch):
    with hostile_hub(world, monkeypatch, Hostile(etag='"../../../../../../pwned"')):
        before = tree(world)
        completed = run_process(world, ["inspect", "org/tiny"])
        assert tree(world) == before
    assert completed.returncode == 13 and completed.stdout == ""
    assert completed.stderr.startswith("keras-mha: error: org/tiny@main: the endpoint sent ETag")
    assert completed.stderr.count("\n") == 1


def test_redirect_loop_in_a_real_process(world, monkeypatch):
    with hostile_hub(world, monkeypatch, Hostile(redirect="loop")):
        completed = run_process(world, ["inspect", "org/tiny", "--timeout", "5"])
    assert completed.returncode == 13 and completed.stderr.count("\n") == 1
    assert "loop" in completed.stderr


# -- any answer at all ----------------------------------------------------------------------------

HEADER_TEXT = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=80)
HEX_40 = st.text(alphabet="0123456789abcdef", min_size=40, max_size=40)
HEX_64 = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
ANSWERS = st.builds(
    Hostile,
    etag=st.none() | HEADER_TEXT | HEX_40.map(lambda x: f'"{x}"') | HEX_64 | st.just(KEEP),
    commit=st.none() | HEADER_TEXT | HEX_40 | st.just(KEEP),
    content_type=st.sampled_from(["application/json", "text/html", "text/plain", KEEP]),
    content_length=st.just(KEEP) | st.integers(min_value=0, max_value=10**9) | HEADER_TEXT,
    body=st.just(KEEP)
    | st.binary(max_size=200)
    | st.sampled_from([b"{}", b"[]", b"null", b'{"model_type": "llama"}', b"<html>"]),
)


@settings(
    max_examples=int(os.environ.get("KERAS_MHA_FUZZ_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(answer=ANSWERS)
def test_any_answer_is_a_config_or_one_line_and_never_a_write_outside_the_cache(
    tmp_path_factory, answer
):
    root = tmp_path_factory.mktemp("any-answer")
    cache = root / "cache"
    hub = FakeHub(REPOS, hostile=answer).start()
    try:
        before = tree(root)
        try:
            loaded = load_config("org/tiny", endpoint=hub.url, cache_dir=cache, timeout=5)
        except errors.KerasMHAError as error:
            assert "\n" not in str(error) and error.exit_code in (7, 8, 13), repr(error)
            assert tree(root) == before
        else:
            assert isinstance(loaded.config, dict) and loaded.source == "hub"
            added = set(tree(root)) - set(before)
            assert added and all(path.startswith("cache/models--org--tiny/") for path in added)
    finally:
        hub.stop()
