"""Smoke test of examples/gqa_language_model.py on the current backend (`--fast`)."""

import importlib.util
import re
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gqa_language_model.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("gqa_language_model", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_gqa_language_model_trains_and_generates_with_the_cache(capsys):
    example = _load_example()
    assert example.main(["--fast"]) == 0
    output = capsys.readouterr().out
    before = float(re.search(r"loss before training: ([0-9.]+)", output).group(1))
    after = float(re.search(r"loss after 30 steps: ([0-9.]+)", output).group(1))
    assert after < before - 0.5, output
    # Progress while it trains (output not a terminal: a line every tenth of the steps).
    assert re.findall(r"^step (\d+)/30: loss [0-9.]+$", output, re.M) == [
        str(step) for step in range(3, 31, 3)
    ], output
    # The example itself stops with status 1 when cached and uncached tokens differ.
    assert "check: the first 6 tokens equal uncached generation" in output
    generated = output.split("generated with the KV cache (greedy):\n", 1)[1].split("\n\n")[0]
    assert generated.startswith("Beautiful is") and len(generated) == len("Beautiful is") + 24
    assert re.search(r"compiled 1 time\(s\) for 23 positions", output), output


def test_zen_of_python_ships_with_python():
    example = _load_example()
    text = example.zen_of_python()
    assert text.startswith("The Zen of Python, by Tim Peters")
    assert "Beautiful is better than ugly." in text
    tokenizer = example.CharacterTokenizer(text)
    assert tokenizer.decode(tokenizer.encode(text)) == text
