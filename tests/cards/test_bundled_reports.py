"""Every bundled card loads, reports, and ships a `card.md` identical to what the CLI prints now.

If this fails after a change to the cost model or the renderer, regenerate the cards:
`python -m tools.render_bundled_cards`.
"""

import json

import pytest

import keras_mha
from keras_mha import cli
from keras_mha.hub.bundled import bundled_card_directory, list_bundled
from keras_mha.hub.config import load_config
from keras_mha.planning.plan import plan_config
from tools.render_bundled_cards import card_markdown, card_path

pytestmark = pytest.mark.backend_independent

BUNDLED = list_bundled()


def test_there_are_at_least_30_bundled_cards():
    assert len(BUNDLED) >= 30, BUNDLED


@pytest.mark.parametrize("repo_id", BUNDLED)
def test_bundled_card_loads_and_reports(repo_id):
    loaded = load_config(f"bundled:{repo_id}")
    provenance = json.loads((bundled_card_directory(repo_id) / "source.json").read_text())

    assert loaded.source == "bundled"
    assert loaded.model_id == repo_id == provenance["repo_id"]
    assert provenance["revision"] and provenance["source"]
    assert loaded.revision == provenance["revision"]

    report = plan_config(loaded).to_dict()
    assert report["model"] == repo_id
    assert report["parameters"]["total"] > 0
    assert 0 < report["parameters"]["attention"] < report["parameters"]["total"]
    assert report["attention"]["num_layers"] > 0
    if report["kv_cache"]["applicable"]:
        assert report["kv_cache"]["total_bytes"] > 0
    else:
        # Encoder-only models (BERT) attend bidirectionally and keep no cache.
        assert report["kv_cache"]["total_bytes"] == 0
        assert "encoder-only" in report["kv_cache"]["note"]
    assert report["bundled_card"]["repo_id"] == repo_id


@pytest.mark.parametrize("repo_id", BUNDLED)
def test_card_markdown_is_current(repo_id):
    path = card_path(repo_id)
    assert path.is_file(), f"{path} missing: run python -m tools.render_bundled_cards"
    assert path.read_text(encoding="utf-8") == card_markdown(repo_id), (
        f"{path} is stale: run python -m tools.render_bundled_cards"
    )


@pytest.mark.parametrize("repo_id", BUNDLED)
def test_plan_and_inspect_json_are_the_same_dict(repo_id, capsys):
    # The one pipeline: the Python API's plan is the command's JSON, with devices too.
    for flags, arguments in (([], {}), (["--gpu", "2xH100", "--seq-len", "32k"],
                                        {"gpu": "2xH100", "seq_len": "32k"})):  # fmt: skip
        assert cli.main(["inspect", f"bundled:{repo_id}", "--format", "json", *flags]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert keras_mha.plan(f"bundled:{repo_id}", **arguments).to_dict() == printed
