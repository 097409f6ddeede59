"""Smoke runs of the pruning examples in their fast modes."""

import importlib.util
import os

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _load_example(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_digits_example_prunes_half_the_heads_and_shrinks_the_model(tmp_path):
    pytest.importorskip("sklearn")
    example = _load_example("prune_digits_classifier")
    results = example.main(["--fast", "--json", str(tmp_path / "digits.json")])
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
