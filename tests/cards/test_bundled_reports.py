"""Every bundled card loads, reports, and ships a `card.md` identical to what the CLI prints now.

If this fails after a change to the cost model or the renderer, regenerate the cards:
`python -m tools.render_bundled_cards`.
"""

import json

import pytest

from keras_mha.hub.bundled import bundled_card_directory, list_bundled
from keras_mha.hub.config import load_config
from keras_mha.planning.render.report import build_report, default_seq_len
from keras_mha.planning.spec import from_config
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

    spec = from_config(loaded.config, model_id=repo_id)
    report = build_report(
        loaded, spec, seq_lens=[default_seq_len(spec)], batch=1, kv_dtype="bfloat16"
    )
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
