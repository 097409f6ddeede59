"""`generate(..., kv_cache_dtype="int8" | "float8_e4m3fn")` against float greedy decoding.

The model is examples/quantized_kv_cache.py's tiny decoder, trained there to continue
repeating 5-token patterns (its weights are `pattern_decoder.npz`, written by the
example's `--save-weights`): its logits are confident, and each next token is what
attention reads from the cache one period back, so a cache that returned wrong keys or
values would change the tokens.
"""

import importlib.util
from pathlib import Path

import pytest

from keras_mha.errors import UsageError
from keras_mha.models import generate

ROOT = Path(__file__).resolve().parents[2]


def _example():
    spec = importlib.util.spec_from_file_location(
        "quantized_kv_cache", ROOT / "examples" / "quantized_kv_cache.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLE = _example()


@pytest.fixture(scope="module")
def trained():
    return EXAMPLE.pattern_decoder(Path(__file__).parent / "pattern_decoder.npz")


@pytest.mark.parametrize("dtype", ["int8", "float8_e4m3fn"])
def test_quantized_kv_cache_agrees_with_float_greedy_decoding(trained, dtype):
    period = EXAMPLE.PERIOD
    rows = EXAMPLE.patterns(8, seed=1)
    prompts = rows[:, : 2 * period]
    float_tokens = generate(trained, prompts, 24)[:, 2 * period :]
    # The model learned the task: its float greedy tokens continue the patterns.
    assert (float_tokens == rows[:, 2 * period : 2 * period + 24]).mean() >= 0.9
    tokens = generate(trained, prompts, 24, kv_cache_dtype=dtype)[:, 2 * period :]
    assert (tokens == float_tokens).mean() >= 0.9


def test_a_bad_kv_cache_dtype_is_named(trained):
    with pytest.raises(UsageError, match=r"kv_cache_dtype='int4'; expected None"):
        generate(trained, [[1, 2, 3]], 2, kv_cache_dtype="int4")
