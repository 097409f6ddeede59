"""Weights and tokenizer downloads (`from_pretrained(hub_id)`, the exporter) through the
hardened Hub path (`keras_mha.hub.files`): whatever the endpoint answers for
`model.safetensors`, nothing is written outside the HF cache, nothing half-written is
left in it, and the failure is one line. The good path (a tiny checkpoint from a local
Hub, then offline) is `test_models_loading.test_hub_id_through_the_hf_cache_then_offline`.

No Keras model is built here (every case fails before building, or calls `hub_file`
directly), so these run once, in the torch leg.
"""

import hashlib
import json

import pytest

from keras_mha import errors
from keras_mha.hub.files import hub_file
from keras_mha.models import from_pretrained
from keras_mha.models.export import _fetch_hub_files
from tests.configs import tiny_llama
from tests.hub_server import (
    Hostile,
    commit_hash,
    hub_environment,
    tree,
    world_with_deep_working_directory,
)

pytestmark = pytest.mark.backend_independent

CONFIG = json.dumps(tiny_llama()).encode()
WEIGHTS = b"not really safetensors, never read: every case fails before" * 4
WEIGHTS_SHA256 = hashlib.sha256(WEIGHTS).hexdigest()
TOKEN = "hf_SecretTokenThatMustNeverBePrinted42"
REPOS = {
    "org/tiny": {
        "main": {"config.json": CONFIG, "model.safetensors": WEIGHTS, "tokenizer.json": b"{}"}
    }
}
CACHED_REPO = "hf_home/hub/models--org--tiny/"


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A temp tree with a working directory deep inside it (so `../../x` lands in it)."""
    return world_with_deep_working_directory(tmp_path, monkeypatch)


def weights_hostile(**fields) -> Hostile:
    return Hostile(only_files=("model.safetensors",), **fields)


HOSTILE_WEIGHTS = {
    "etag-traversal": (weights_hostile(etag='"../../../../pwned"'), 13, "ETag"),
    "etag-absolute": (weights_hostile(etag='"/tmp/pwned-by-etag"'), 13, "ETag"),
    "commit-traversal": (weights_hostile(commit="../../x"), 13, "X-Repo-Commit"),
    "redirect-loop": (weights_hostile(redirect="loop"), 13, "loop"),
    "redirect-chain": (weights_hostile(redirect="chain"), 13, "more than 10"),
    "short-body": (weights_hostile(content_length=len(WEIGHTS) + 50), 13, "incomplete"),
    "no-length": (weights_hostile(body_bytes=5000), 13, "Content-Length"),
    "sha256-mismatch": (weights_hostile(etag=f'"{"a" * 64}"'), 13, "sha256"),
    "trickle": (weights_hostile(trickle_seconds=0.2), 8, "Timeout"),
}


@pytest.mark.parametrize(
    "hostile, exit_code, mention", HOSTILE_WEIGHTS.values(), ids=HOSTILE_WEIGHTS
)
def test_hostile_weights_answers_write_nothing_outside_the_cache(
    world, monkeypatch, hostile, exit_code, mention
):
    with hub_environment(world, monkeypatch, REPOS, hostile=hostile):
        monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "1")  # the deadline of every exchange
        before = tree(world)
        with pytest.raises(errors.KerasMHAError) as raised:
            from_pretrained("org/tiny", token=TOKEN)
        after = tree(world)
    message = str(raised.value)
    assert "\n" not in message and TOKEN not in message, message
    assert raised.value.exit_code == exit_code and mention in message, (exit_code, message)
    added = set(after) - set(before)
    # Only the (honest) config.json and its ref reached the cache: no weights, no temp file.
    assert added and all(path.startswith(CACHED_REPO) for path in added), added
    assert not any("safetensors" in path or "incomplete" in path for path in added), added
    assert [p for p in added if "/blobs/" in p] == [CACHED_REPO + "blobs/" + sha1(CONFIG)]


def sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


@pytest.mark.parametrize("revision", ["../../x", "main\nInjected: 1", "/etc/passwd", "a..b"])
def test_a_bad_revision_is_refused_before_any_request(world, monkeypatch, revision):
    with hub_environment(world, monkeypatch, REPOS) as hub:
        before = tree(world)
        with pytest.raises(errors.InvalidRevisionError) as raised:
            from_pretrained("org/tiny", revision=revision)
        with pytest.raises(errors.InvalidRevisionError):
            hub_file("org/tiny", "model.safetensors", revision=revision)
        assert hub.requests == [] and tree(world) == before
    assert "\n" not in str(raised.value)


def test_a_file_name_that_is_a_path_is_refused_before_any_request(world, monkeypatch):
    with hub_environment(world, monkeypatch, REPOS) as hub:
        for name in ("../model.safetensors", "sub/model.safetensors", "..", ".hidden\n"):
            with pytest.raises(errors.HubResponseError, match="not a plain file name"):
                hub_file("org/tiny", name)
        assert hub.requests == []


def test_a_malformed_token_is_refused_before_any_request(world, monkeypatch):
    with hub_environment(world, monkeypatch, REPOS) as hub:
        with pytest.raises(errors.InvalidTokenError) as raised:
            hub_file("org/tiny", "model.safetensors", token="hf_abc\ndef")
        assert hub.requests == []
    assert "hf_abc" not in str(raised.value)


def test_an_lfs_file_is_checked_cached_in_the_hub_layout_and_read_offline(world, monkeypatch):
    """A 64-hex ETag (LFS sha256) that matches: stored as blobs/<sha256>, found by
    huggingface_hub's own cache lookup, then answered offline and not fetched again."""
    import huggingface_hub

    lfs = weights_hostile(etag=f'"{WEIGHTS_SHA256}"')  # honest, as the Hub sends for LFS
    with hub_environment(world, monkeypatch, REPOS, hostile=lfs) as hub:
        path = hub_file("org/tiny", "model.safetensors")
        commit = commit_hash("org/tiny", "main")
        assert path.read_bytes() == WEIGHTS
        assert path.parent.name == commit and path.resolve().name == WEIGHTS_SHA256
        cache = world / "hf_home" / "hub"
        assert huggingface_hub.try_to_load_from_cache(
            "org/tiny", "model.safetensors", cache_dir=cache
        ) == str(path)
        assert (cache / "models--org--tiny" / "refs" / "main").read_text() == commit
        gets = len(hub.resolve_requests("GET"))
        # The same commit: answered from the cache without a request.
        assert hub_file("org/tiny", "model.safetensors", revision=commit) == path
        assert len(hub.resolve_requests("GET")) == gets
        hub.stop()
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        assert hub_file("org/tiny", "model.safetensors") == path
        assert hub_file("org/tiny", "missing.safetensors") is None


def test_an_unreachable_hub_answers_from_the_cache_or_one_line(world, monkeypatch):
    with hub_environment(world, monkeypatch, REPOS) as hub:
        path = hub_file("org/tiny", "model.safetensors")
        hub.stop()
        assert hub_file("org/tiny", "model.safetensors") == path
        with pytest.raises(errors.HubUnreachableError) as raised:
            hub_file("org/tiny", "tokenizer.json")
    assert "\n" not in str(raised.value) and "not in the HF cache" in str(raised.value)


def test_missing_files_are_none_and_the_exporter_fetches_tokenizer_files(world, monkeypatch):
    with hub_environment(world, monkeypatch, REPOS):
        assert hub_file("org/tiny", "model.safetensors.index.json") is None
        folder = _fetch_hub_files("org/tiny", "main", None)
        assert folder.name == commit_hash("org/tiny", "main")
        assert (folder / "tokenizer.json").read_bytes() == b"{}"
        assert (folder / "config.json").read_bytes() == CONFIG
        with pytest.raises(errors.RepositoryNotFoundError):
            hub_file("org/absent", "model.safetensors")
