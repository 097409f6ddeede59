"""The planner's inputs under hostile values: device strings parsed in linear time and
bounded in length, numbers past Python's int-digit limit, device counts that are not
integers, weight blocks that are not [n, k], and a `head_dim` a family never reads. One
reader and one rule for each, the same through `keras_mha.plan` and the command line."""

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import keras_mha
from keras_mha.errors import UsageError
from keras_mha.planning.planner import units
from keras_mha.planning.planner.devices import _count_splits, _is_memory_size, split_count
from keras_mha.planning.planner.quantization import checkpoint_format
from keras_mha.planning.spec import from_config
from tests.cli.test_inspect import run_cli

pytestmark = pytest.mark.backend_independent

GPT2 = "bundled:openai-community/gpt2"

# The patterns `split_count` used until 0.4: right, but quadratic on long text.
_OLD_COUNT_FIRST = re.compile(r"\s*([0-9]+)\s*[x*\u00d7]\s*(.+?)\s*", re.IGNORECASE)
_OLD_COUNT_LAST = re.compile(r"\s*(.+?)\s*[x*\u00d7]\s*([0-9]+)\s*", re.IGNORECASE)


def old_splits(text):
    splits = []
    for pattern, count_group, name_group in ((_OLD_COUNT_FIRST, 1, 2), (_OLD_COUNT_LAST, 2, 1)):
        match = pattern.fullmatch(text)
        if match and match.group(name_group).strip():
            splits.append((match.group(count_group), match.group(name_group)))
    return splits


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.sampled_from(["2", "16", "x", "X", "*", "\u00d7", " ", "H100", "a", "mi300x", "GiB"]),
        max_size=6,
    ).map("".join)
)
def test_device_strings_split_as_the_old_patterns_did(text):
    assert _count_splits(text) == old_splits(text)


@pytest.mark.parametrize(
    "text",
    [
        "1x" + " " * 1_000_000 + "a",  # 120 kB of this took 45 s with the old patterns
        "1 " * 500_000,
        " " * 1_000_000 + "x",
        "x1 " * 100_000,
        "1x" * 100_000,
    ],
    ids=["spaces-after-count", "digits-and-spaces", "spaces", "name-count-repeats", "counts"],
)
def test_a_megabyte_of_device_text_is_parsed_in_one_pass(text):
    # The old patterns needed hours for these (quadratic); a linear scan takes milliseconds,
    # so the test finishes or the suite's run time shows the regression.
    assert split_count(text, "--gpu") == (None, text)
    assert split_count(text, "--memory", _is_memory_size)[0] is None


@pytest.mark.parametrize(
    "flags, flag",
    [
        (["--gpu", "1x" + " " * 120_000 + "a"], "--gpu"),
        (["--memory", "9" * 5000 + "GB"], "--memory"),
        (["--memory", "2x" + "9" * 5000 + "GB"], "--memory"),
        (["--seq-len", "9" * 5000], "--seq-len"),
        (["--memory", "80GiB", "--memory-utilization", "0." + "9" * 5000], "--memory-utilization"),
        (["--kv-dtype", "b" * 5000], "--kv-dtype"),
        (["--batch", "9" * 5000], "--batch"),
    ],
)
def test_an_overlong_flag_value_is_one_short_line(capsys, flags, flag):
    exit_code, out, err = run_cli(capsys, "inspect", GPT2, *flags)
    assert exit_code == UsageError.exit_code and out == ""
    assert err.count("\n") == 1 and flag in err and len(err) < 200, err
    assert f"at most {units.MAX_FLAG_TEXT}" in err


def test_the_api_bounds_the_same_values():
    with pytest.raises(UsageError, match=r"^--memory .* characters long"):
        keras_mha.plan(GPT2, memory="9" * 5000 + "GB")
    with pytest.raises(UsageError, match=r"^--gpu .* characters long"):
        keras_mha.plan(GPT2, gpu="H" * 5000)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.one_of(
        st.floats(allow_nan=True),
        st.booleans(),
        st.integers(-3, 0),
        st.integers(4097, 10**6),
        st.sampled_from(["2.5", "2.0", "two", "", "1e3", "-1", "\u0662"]),
    )
)
def test_a_device_count_that_is_not_an_integer_is_refused_by_api_and_cli(capsys, gpus):
    with pytest.raises(UsageError, match=r"^--gpus .*(not a number of devices|names)"):
        keras_mha.plan(GPT2, gpu="H100", gpus=gpus)
    exit_code, _, err = run_cli(capsys, "inspect", GPT2, "--gpu", "H100", "--gpus", str(gpus))
    assert exit_code == UsageError.exit_code and "--gpus" in err


@pytest.mark.parametrize("gpus", [2, "2", " 2 "])
def test_an_integer_device_count_plans_those_devices(gpus):
    assert keras_mha.plan(GPT2, gpu="H100", gpus=gpus).devices == "2x H100 80GB SXM"


CT_BLOCK = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "config_groups": {
        "g": {"weights": {"num_bits": 8, "type": "float", "strategy": "block", "symmetric": True}}
    },
}


def ct_with_block(block):
    weights = {**CT_BLOCK["config_groups"]["g"]["weights"], "block_structure": block}
    return {**CT_BLOCK, "config_groups": {"g": {"weights": weights}}}


def fp8_with_block(block):
    return {"quant_method": "fp8", "weight_block_size": block}


@pytest.mark.parametrize("quantization", [ct_with_block, fp8_with_block])
@pytest.mark.parametrize("block", [[True, True], [128, True], [1.5, 2], [0, 128], [128], "x"])
def test_a_weight_block_that_is_not_two_sizes_is_one_rule_in_both_readers(quantization, block):
    fmt = checkpoint_format({"torch_dtype": "bfloat16", "quantization_config": quantization(block)})
    assert not fmt.is_quantized and fmt.id == "bfloat16"
    assert any(f"= {block!r} is not [n, k]" in note for note in fmt.notes), fmt.notes


@pytest.mark.parametrize("quantization", [ct_with_block, fp8_with_block])
def test_a_weight_block_of_two_sizes_is_counted_by_both_readers(quantization):
    fmt = checkpoint_format(
        {"torch_dtype": "bfloat16", "quantization_config": quantization([128, 64])}
    )
    assert fmt.is_quantized and not fmt.notes
    # 8-bit weights plus one scale per 128 x 64 block (float32 for fp8, bfloat16 here).
    scales = fmt.matrix_bytes(4096, 4096) - 4096 * 4096
    assert scales in (32 * 64 * 4, 32 * 64 * 2)


NEOX = {
    "model_type": "gpt_neox",
    "architectures": ["GPTNeoXForCausalLM"],
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 96,
    "vocab_size": 128,
    "max_position_embeddings": 64,
}


@pytest.mark.parametrize("head_dim", [32, 8, "sixteen"])
def test_a_head_dim_gpt_neox_never_reads_is_noted_and_the_derived_one_costed(head_dim):
    spec = from_config({**NEOX, "head_dim": head_dim})
    assert spec.attention.head_dim == 16  # hidden / heads, as transformers' GPTNeoXAttention
    assert any("head_dim=" in note and "ignored" in note for note in spec.warnings)


def test_a_head_dim_that_agrees_is_not_noted():
    spec = from_config({**NEOX, "head_dim": 16})
    assert spec.attention.head_dim == 16 and not any("head_dim" in note for note in spec.warnings)
