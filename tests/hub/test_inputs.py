"""What the Hub path accepts before any request (revisions, tokens, endpoints, URLs) and
how untrusted text is made safe to print (`keras_mha.safe_text`)."""

import pytest

from keras_mha import errors
from keras_mha.hub.cache import checked_etag, repo_folder, store_config
from keras_mha.hub.config_json import json_depth
from keras_mha.hub.inputs import (
    parse_hub_url,
    revision_problem,
    validate_endpoint,
    validate_revision,
    validate_token,
)
from keras_mha.safe_text import one_line, redact_secrets, visible

pytestmark = pytest.mark.backend_independent


@pytest.mark.parametrize(
    "revision",
    ["main", "v1.0", "refs/pr/12", "feature/x-y", "release_2024.01", "a" * 40, "0" * 7, "ünï"],
)
def test_branch_tag_pr_and_commit_shapes_pass(revision):
    assert validate_revision(revision) == revision


@pytest.mark.parametrize(
    "revision",
    [
        "..",
        "a/../b",
        "/main",
        "main/",
        "a//b",
        "a b",
        "a\tb",
        "a\\b",
        "a:b",
        "a?b",
        "a*b",
        "a[b",
        "a~1",
        "a^",
        ".git",
        "x/.y",
        "x.lock",
        "x.",
        "@",
        "a@{1}",
        "\u202emain",
        "",
        "a" * 256,
        "refs/pr/x",
        "refs/pr/",
        "refs/pr",
        "refs/pr/0",
        "refs/pr/3/config.json",
        None,
        3,
    ],
)
def test_everything_else_is_refused(revision):
    assert revision_problem(revision) is not None
    with pytest.raises(errors.InvalidRevisionError) as raised:
        validate_revision(revision)
    assert raised.value.exit_code == 11 and "\n" not in str(raised.value)


@pytest.mark.parametrize("token", ["hf_" + "a" * 34, "hf_oauth_x.y-z~", "a" * 4096])
def test_well_formed_tokens_pass(token):
    validate_token(token)


@pytest.mark.parametrize(
    "token", ["", " hf_x", "hf_x ", "hf_\u00e9", "hf_\x00", "hf\r\nX-Injected: 1", "a" * 4097, 7]
)
def test_malformed_tokens_are_refused_without_being_quoted(token):
    with pytest.raises(errors.InvalidTokenError) as raised:
        validate_token(token)
    message = str(raised.value)
    assert raised.value.exit_code == 12 and "\n" not in message
    if isinstance(token, str) and len(token) > 3:
        assert token not in message


@pytest.mark.parametrize(
    "endpoint", ["ftp://hub", "huggingface.co", "http://", "http://h:99999", "http://h/?q=1"]
)
def test_endpoints_must_be_http_urls(endpoint):
    with pytest.raises(errors.UsageError):
        validate_endpoint(endpoint)
    assert validate_endpoint("https://hf-mirror.example/base/") == "https://hf-mirror.example/base"


@pytest.mark.parametrize(
    "url, expected",
    [
        ("https://huggingface.co/org/name", ("org/name", None)),
        ("http://www.huggingface.co/org/name/", ("org/name", None)),
        ("https://huggingface.co/gpt2", ("gpt2", None)),
        ("https://huggingface.co/models/org/name", ("org/name", None)),
        ("https://huggingface.co/org/name/tree/v1.0", ("org/name", "v1.0")),
        ("https://huggingface.co/org/name/commit/" + "c" * 40, ("org/name", "c" * 40)),
        ("https://huggingface.co/org/name/blob/main/config.json#L3", ("org/name", "main")),
        ("https://mirror.example/org/name/tree/dev", ("org/name", "dev")),
    ],
)
def test_hub_urls(url, expected):
    assert parse_hub_url(url, endpoint="https://mirror.example") == expected


@pytest.mark.parametrize(
    "url",
    [
        "https://huggingface.co/",
        "https://huggingface.co/spaces/org/app",
        "https://huggingface.co/org/name/tree/main/subfolder",
        "https://huggingface.co/org/name/discussions/3",
        "https://evil.example/org/name",
        "file:///etc/passwd",
    ],
)
def test_other_urls_are_usage_errors(url):
    with pytest.raises(errors.UsageError) as raised:
        parse_hub_url(url)
    assert raised.value.exit_code == 2


def test_secrets_are_redacted():
    text = (
        "GET https://bob:hunter2@hub.example/x?X-Amz-Signature=abc failed; "
        "Authorization: Bearer hf_abcdefghijklmnopqrstu; custom-secret-value"
    )
    redacted = redact_secrets(text, secrets=["custom-secret-value"])
    for secret in ("hunter2", "X-Amz-Signature=abc", "hf_abcdefghijklmnopqrstu", "custom-secret"):
        assert secret not in redacted
    assert "https://bob:***@hub.example/x?***" in redacted
    assert redact_secrets("at https://ghp_tokenAsUser@mirror.example/org") == (
        "at https://***@mirror.example/org"
    )


def test_control_characters_become_visible():
    assert (
        visible("a\x1b[31mb\x07\u202ec\u2066\x85\x7f")
        == "a\\x1b[31mb\\x07\\u202ec\\u2066\\x85\\x7f"
    )
    assert one_line("one\ntwo\r\n\tthree \x1b") == "one two three \\x1b"


def test_json_depth_needs_no_recursion():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert json_depth(deep) == 100_001


def test_the_cache_writer_rechecks_every_name(tmp_path):
    commit, etag = "c" * 40, "e" * 40
    path = store_config(
        tmp_path, "org/name", revision="refs/pr/1", commit=commit, etag=etag, data=b"{}"
    )
    assert path == repo_folder(tmp_path, "org/name") / "snapshots" / commit / "config.json"
    assert path.read_bytes() == b"{}"
    assert (repo_folder(tmp_path, "org/name") / "refs" / "refs" / "pr" / "1").read_text() == commit
    for bad in ({"revision": "../../x"}, {"commit": "../" + "c" * 37}, {"etag": "../../x"}):
        arguments = {"revision": "main", "commit": commit, "etag": etag, **bad}
        with pytest.raises(ValueError):
            store_config(tmp_path, "org/name", data=b"{}", **arguments)
    for hostile in ('"../../x"', '"/etc/passwd"', "/etc/passwd", "e" * 10_000, "", None):
        with pytest.raises(errors.HubResponseError):
            checked_etag(hostile, described_as="org/name")
    assert checked_etag('W/"' + "AB" * 32 + '"', described_as="x") == "ab" * 32


def test_snapshots_are_copies_where_symlinks_fail(tmp_path, monkeypatch):
    """Config and streamed files alike: a regular file with the blob's bytes, nothing left
    behind (huggingface_hub copies too on file systems without symlinks)."""
    from keras_mha.hub.cache import blob_temporary, store_file

    def no_symlinks(*_):
        raise OSError("symlinks not supported here")

    monkeypatch.setattr("os.symlink", no_symlinks)
    commit = "c" * 40
    config = store_config(
        tmp_path, "org/name", revision="main", commit=commit, etag="e" * 40, data=b'{"a": 1}'
    )
    handle, temporary = blob_temporary(tmp_path, "org/name")
    with handle:
        handle.write(b"weights")
    weights = store_file(
        tmp_path,
        "org/name",
        revision="main",
        commit=commit,
        etag="f" * 64,
        filename="model.safetensors",
        temporary=temporary,
    )
    for path, data in ((config, b'{"a": 1}'), (weights, b"weights")):
        assert not path.is_symlink() and path.read_bytes() == data
    snapshot = repo_folder(tmp_path, "org/name") / "snapshots" / commit
    assert sorted(p.name for p in snapshot.iterdir()) == ["config.json", "model.safetensors"]
