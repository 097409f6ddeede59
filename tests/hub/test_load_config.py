"""`keras_mha.hub.load_config` against the real huggingface_hub and a local Hub look-alike.

Every Hub case goes through keras-mha's own GET (`keras_mha.hub.fetch`, over
huggingface_hub's HTTP session) talking HTTP to `tests/hub_server.FakeHub`, which answers
with the status codes and `X-Error-Code` headers of the real Hub, and the file lands in the
HF cache layout huggingface_hub itself reads (`try_to_load_from_cache`, offline mode).
"""

import json
import time

import pytest

from keras_mha.hub.bundled import bundled_config_path, bundled_source, list_bundled
from keras_mha.hub.config import LoadedConfig, load_config
from keras_mha.planning import errors
from tests.configs import tiny_llama
from tests.hub_server import HubRepo, commit_hash, hub_environment

pytestmark = pytest.mark.backend_independent

LLAMA_3 = "meta-llama/Meta-Llama-3-8B"
TINY_CONFIG = tiny_llama()
GOOD_TOKEN = "hf_test_token_with_access"


def _json_bytes(config: dict) -> bytes:
    return json.dumps(config, indent=2).encode()


REPOS = {
    "org/tiny": {
        "main": {"config.json": _json_bytes(TINY_CONFIG)},
        "v1": {"config.json": _json_bytes({**TINY_CONFIG, "hidden_size": 32})},
    },
    "org/gated": HubRepo(
        {"main": {"config.json": _json_bytes(TINY_CONFIG)}}, gated=True, tokens={GOOD_TOKEN}
    ),
    "org/private": HubRepo(
        {"main": {"config.json": _json_bytes(TINY_CONFIG)}}, private=True, tokens={GOOD_TOKEN}
    ),
    "org/weights-only": {"main": {"model.gguf": b"GGUF", "README.md": b"# weights"}},
    "org/malformed": {
        "main": {"config.json": b'{\n  "model_type": "llama",\n  "hidden_size": ,\n}'}
    },
    "org/a-list": {"main": {"config.json": b"[1, 2, 3]"}},
}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    with hub_environment(tmp_path, monkeypatch, REPOS) as server:
        yield server


def _assert_one_line_naming(error: errors.CardError, *names: str):
    message = str(error)
    assert "\n" not in message, message
    for name in names:
        assert name in message, f"{name!r} not in {message!r}"


# -- the Hub ----------------------------------------------------------------------------------


def test_downloads_config_from_hub(hub):
    loaded = load_config("org/tiny", endpoint=hub.url)

    assert isinstance(loaded, LoadedConfig)
    assert loaded.source == "hub"
    assert loaded.config == TINY_CONFIG
    assert loaded.model_id == "org/tiny"
    assert loaded.revision == "main"
    assert loaded.commit == commit_hash("org/tiny", "main")
    assert loaded.note is None
    assert [request.method for request in hub.resolve_requests()][-1] == "GET"


def test_hf_endpoint_environment_variable_is_honoured(hub):
    # No endpoint= argument: huggingface_hub takes HF_ENDPOINT (set by the fixture).
    assert load_config("org/tiny").source == "hub"
    assert hub.resolve_requests()


def test_revision_is_passed_through(hub):
    loaded = load_config("org/tiny", revision="v1")

    assert loaded.config["hidden_size"] == 32
    assert loaded.revision == "v1"
    assert loaded.commit == commit_hash("org/tiny", "v1")
    assert all("/resolve/v1/config.json" in r.path for r in hub.resolve_requests())


def test_revision_as_commit_hash(hub):
    commit = commit_hash("org/tiny", "v1")
    loaded = load_config("org/tiny", revision=commit)
    assert loaded.config["hidden_size"] == 32
    assert loaded.commit == commit


@pytest.mark.parametrize(
    "model_id, options, error_class, exit_code, names",
    [
        ("org/missing", {}, errors.RepositoryNotFoundError, 3, ["org/missing"]),
        ("org/private", {}, errors.RepositoryNotFoundError, 3, ["org/private", "token"]),
        ("org/gated", {}, errors.GatedRepositoryError, 4, ["org/gated", "token"]),
        (
            "org/gated",
            {"token": "hf_without_access"},
            errors.GatedRepositoryError,
            4,
            ["org/gated"],
        ),
        ("org/tiny", {"revision": "v9"}, errors.RevisionNotFoundError, 5, ["org/tiny", "'v9'"]),
        (
            "org/weights-only",
            {},
            errors.ConfigFileNotFoundError,
            6,
            ["org/weights-only", "config.json"],
        ),
        (
            "org/malformed",
            {},
            errors.MalformedConfigError,
            7,
            ["org/malformed", "line 3 column 18"],
        ),
        ("org/a-list", {}, errors.MalformedConfigError, 7, ["org/a-list", "JSON object"]),
    ],
)
def test_hub_errors_are_named_with_their_exit_code(
    hub, model_id, options, error_class, exit_code, names
):
    with pytest.raises(errors.CardError) as raised:
        load_config(model_id, **options)

    # Exactly this class: GatedRepoError subclasses RepositoryNotFoundError upstream, and a
    # gated repo must not be reported as missing.
    assert type(raised.value) is error_class
    assert raised.value.exit_code == exit_code
    _assert_one_line_naming(raised.value, *names)


def test_exit_codes_are_distinct():
    classes = [
        errors.CardError,
        errors.RepositoryNotFoundError,
        errors.GatedRepositoryError,
        errors.RevisionNotFoundError,
        errors.ConfigFileNotFoundError,
        errors.MalformedConfigError,
        errors.HubUnreachableError,
        errors.ConfigError,
    ]
    codes = [error_class.exit_code for error_class in classes]
    assert len(set(codes)) == len(codes)
    # 0 is success and 2 is argparse's usage error.
    assert not {0, 2} & set(codes)
    assert all(issubclass(error_class, errors.CardError) for error_class in classes)


def test_token_is_sent_as_authorization_header(hub):
    loaded = load_config("org/gated", token=GOOD_TOKEN)

    assert loaded.source == "hub"
    assert loaded.config == TINY_CONFIG
    assert {request.bearer_token for request in hub.resolve_requests()} == {GOOD_TOKEN}


def test_hf_token_environment_variable_is_used(hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", GOOD_TOKEN)
    assert load_config("org/private").config == TINY_CONFIG
    assert hub.resolve_requests()[-1].bearer_token == GOOD_TOKEN


def test_second_call_answers_from_the_hf_cache_when_the_hub_is_gone(hub):
    first = load_config("org/tiny")
    hub.stop()

    second = load_config("org/tiny")

    assert second.source == "hub"
    assert second.config == first.config
    assert second.path == first.path
    assert second.commit == first.commit


def test_cached_file_answers_quickly_when_the_hub_times_out(hub):
    load_config("org/tiny")
    hub.delay_seconds = 30

    start = time.perf_counter()
    loaded = load_config("org/tiny", timeout=0.5)

    assert loaded.source == "hub"
    assert time.perf_counter() - start < 5


def test_timeout_with_nothing_cached_and_no_bundled_card(hub):
    hub.delay_seconds = 30
    start = time.perf_counter()

    with pytest.raises(errors.HubUnreachableError) as raised:
        load_config("org/tiny", timeout=0.5)

    # One bounded request, not huggingface_hub's minute-long retry loop.
    assert time.perf_counter() - start < 5
    _assert_one_line_naming(raised.value, "org/tiny", "Timeout")
    assert raised.value.exit_code == 8


def test_timeout_falls_back_to_the_bundled_card(hub):
    hub.delay_seconds = 30

    loaded = load_config(LLAMA_3, timeout=0.5)

    assert loaded.source == "bundled"
    assert loaded.model_id == LLAMA_3
    assert "could not be reached" in loaded.note and "bundled" in loaded.note
    assert loaded.config == json.loads(bundled_config_path(LLAMA_3).read_text())


def test_connection_refused_falls_back_to_the_bundled_card(hub):
    hub.stop()
    loaded = load_config(LLAMA_3)
    assert loaded.source == "bundled"
    assert "ConnectError" in loaded.note


def test_bundled_fallback_refuses_a_different_revision(hub):
    hub.stop()
    with pytest.raises(errors.HubUnreachableError) as raised:
        load_config(LLAMA_3, revision="some-other-branch")
    _assert_one_line_naming(raised.value, LLAMA_3, "some-other-branch")


def test_hub_errors_still_win_over_the_bundled_card(hub):
    # The Hub answered (the repo is missing there), so the bundled card must not hide that.
    with pytest.raises(errors.RepositoryNotFoundError) as raised:
        load_config(LLAMA_3)
    assert f"bundled:{LLAMA_3}" in str(raised.value)


# -- offline ----------------------------------------------------------------------------------


def test_offline_environment_with_nothing_cached_uses_the_bundled_card(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    loaded = load_config(LLAMA_3)

    assert loaded.source == "bundled"
    assert "offline" in loaded.note
    assert loaded.revision == bundled_source(LLAMA_3)["revision"]
    assert hub.requests == []


def test_offline_with_unknown_model_is_hub_unreachable(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(errors.HubUnreachableError) as raised:
        load_config("org/not-bundled")
    _assert_one_line_naming(raised.value, "org/not-bundled", "offline")
    assert hub.requests == []


def test_offline_argument_reads_the_hf_cache_first(hub):
    load_config("org/tiny")
    requests_before = len(hub.requests)

    loaded = load_config("org/tiny", offline=True)

    assert loaded.source == "hub"
    assert loaded.config == TINY_CONFIG
    assert len(hub.requests) == requests_before


# -- local paths and bundled cards ------------------------------------------------------------


def test_local_directory_and_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))

    from_directory = load_config(str(tmp_path))
    from_file = load_config(str(tmp_path / "config.json"))

    for loaded in (from_directory, from_file):
        assert loaded.source == "local"
        assert loaded.config == TINY_CONFIG
        assert loaded.path == tmp_path / "config.json"
        assert loaded.revision is None


def test_local_directory_without_config(tmp_path):
    with pytest.raises(errors.ConfigFileNotFoundError) as raised:
        load_config(str(tmp_path))
    _assert_one_line_naming(raised.value, str(tmp_path), "config.json")


def test_missing_local_path(tmp_path):
    missing = str(tmp_path / "nowhere" / "config.json")
    with pytest.raises(errors.ConfigFileNotFoundError) as raised:
        load_config(missing)
    _assert_one_line_naming(raised.value, missing)


def test_malformed_local_json_names_file_line_and_column(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{\n  "hidden_size": 64,\n  "num_attention_heads": 4\n  "oops": 1\n}')

    with pytest.raises(errors.MalformedConfigError) as raised:
        load_config(str(path))

    _assert_one_line_naming(raised.value, str(path), "line 4 column 3")


def test_bundled_card_is_read_without_the_network(hub):
    loaded = load_config(f"bundled:{LLAMA_3}")

    assert loaded.source == "bundled"
    assert loaded.model_id == LLAMA_3
    assert loaded.note is None
    assert loaded.config["num_key_value_heads"] == 8
    assert hub.requests == []


def test_unknown_bundled_card_suggests_close_names():
    with pytest.raises(errors.RepositoryNotFoundError) as raised:
        load_config("bundled:meta-llama/Meta-Llama-3-8b-typo")
    _assert_one_line_naming(raised.value, "meta-llama/Meta-Llama-3-8b-typo", LLAMA_3)


def test_invalid_model_id(hub):
    with pytest.raises(errors.RepositoryNotFoundError) as raised:
        load_config("not a repo id")
    _assert_one_line_naming(raised.value, "not a repo id")


def test_list_bundled_matches_the_directories():
    bundled = list_bundled()
    assert LLAMA_3 in bundled
    assert bundled == sorted(bundled)
    for repo_id in bundled:
        assert bundled_config_path(repo_id).is_file()
    assert bundled_config_path("META-LLAMA/meta-llama-3-8b") == bundled_config_path(LLAMA_3)
    assert bundled_config_path("nobody/nothing") is None
    # Legacy ids without an organisation, as the Hub redirects them.
    assert bundled_config_path("gpt2") == bundled_config_path("openai-community/gpt2")


def test_offline_legacy_id_answers_with_the_canonical_repo_id(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = load_config("gpt2")
    assert loaded.source == "bundled"
    assert loaded.model_id == "openai-community/gpt2"


def test_installed_wheel_layout_is_found_first(tmp_path, monkeypatch):
    # In a wheel the cards sit inside the package (pyproject: force-include cards ->
    # keras_mha/_bundled_cards); a `cards/` beside the package must not be used then.
    from keras_mha.hub import bundled

    package = tmp_path / "site-packages" / "keras_mha"
    wheel_cards, checkout_cards = package / "_bundled_cards", package.parent / "cards"
    for root, name in ((wheel_cards, "in-wheel"), (checkout_cards, "beside")):
        (root / "org" / name).mkdir(parents=True)
        (root / "org" / name / "config.json").write_text("{}")
    monkeypatch.setattr(bundled, "_PACKAGE_DIRECTORY", package)
    bundled._index.cache_clear()
    try:
        assert bundled.bundled_cards_root() == wheel_cards
        assert bundled.list_bundled() == ["org/in-wheel"]
        loaded = load_config("bundled:org/in-wheel")
        assert loaded.path == wheel_cards / "org" / "in-wheel" / "config.json"
    finally:
        bundled._index.cache_clear()
