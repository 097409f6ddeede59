"""`keras-mha inspect` with the memory planner: `memory` and `fits` JSON keys, --gpu and
--memory, the new-user fixes (--version, 1m, dtype aliases, the per-token column of
sliding-window models, beyond-context warnings) and one-line errors."""

import json

import pytest

from keras_mha import cli
from keras_mha.hub.config import load_config
from keras_mha.planning.planner import memory
from keras_mha.planning.planner.gpus import known_gpu_names
from keras_mha.planning.spec import from_config

pytestmark = pytest.mark.backend_independent

LLAMA_3 = "bundled:meta-llama/Meta-Llama-3-8B"
GEMMA_3 = "bundled:google/gemma-3-4b-it"
GIB = 1024**3


def run_cli(capsys, *argv):
    exit_code = cli.main(list(argv))
    captured = capsys.readouterr()
    return exit_code, captured.out, captured.err


def inspect_json(capsys, *argv):
    exit_code, out, err = run_cli(capsys, "inspect", *argv, "--format", "json")
    assert exit_code == 0, err
    return json.loads(out)


def spec_of(model):
    loaded = load_config(model)
    return from_config(loaded.config, model_id=loaded.model_id)


def test_memory_keys_always_and_fits_only_with_a_memory_size(capsys):
    report = inspect_json(capsys, LLAMA_3, "--seq-len", "4k,16k", "--batch", "2")
    entry = report["memory"]
    assert set(entry["weights_bytes"]) == {
        "float32", "bfloat16", "float16", "float8", "int8", "int4",
    }  # fmt: skip
    assert entry["weights_bytes"]["bfloat16"] == 2 * report["parameters"]["total"]
    spec = spec_of(LLAMA_3)
    # Serving and training at the batch and the LAST length, like `kv_cache`.
    serving = memory.serving_memory(spec, batch=2, seq_len=16384)
    assert entry["serving_bytes"] == serving.total_bytes
    assert entry["serving"]["kv_cache_bytes"] == report["kv_cache"]["total_bytes"]
    training = memory.training_memory(spec, batch=2, seq_len=16384)
    assert entry["training_bytes"] == training.total_bytes
    assert entry["training_bytes_checkpointed"] == training.total_bytes_checkpointed
    assert "fits" not in report


def test_fits_with_gpu_and_memory(capsys):
    report = inspect_json(capsys, LLAMA_3, "--gpu", "H100", "--seq-len", "8k")
    fits = report["fits"]
    assert fits["device_memory_bytes"] == 81559 * 1024**2 and fits["gpu"] == "H100 80GB SXM"
    # The plan fills 90% of the device by default, as vLLM's --gpu-memory-utilization.
    assert fits["memory_bytes"] == int(0.9 * 81559 * 1024**2)
    assert {"memory_bytes", "max_seq_len", "max_batch", "training_fits"} <= set(fits)
    plan = memory.plan_fit(spec_of(LLAMA_3), memory_bytes=fits["memory_bytes"], seq_len=8192)
    assert (fits["max_seq_len"], fits["max_batch"]) == (plan.max_seq_len, plan.max_batch)
    assert fits["training_fits"] is False  # 16 bytes a parameter alone is 120 GiB
    assert set(fits["by_kv_dtype"]) == set(report["memory"]["weights_bytes"])

    report = inspect_json(
        capsys, LLAMA_3, "--memory", "24GiB", "--kv-dtype", "fp8", "--memory-utilization", "1"
    )
    fits = report["fits"]
    assert fits["memory_bytes"] == 24 * GIB and fits["gpu"] is None
    assert fits["kv_dtype"] == "float8" and report["kv_cache"]["dtype"] == "float8"
    assert fits["max_batch"] == fits["by_kv_dtype"]["float8"]["max_batch"] > 0


def test_the_fit_answers_invert_the_reported_serving_memory(capsys):
    """End to end: at `max_seq_len` (and `max_batch`) the report's own `serving_bytes`
    fits the memory, one token (one sequence) more does not."""
    flags = ["--memory", "20GiB", "--batch", "3", "--seq-len", "6000", "--kv-dtype", "fp8",
             "--memory-utilization", "0.95"]  # fmt: skip
    fits = inspect_json(capsys, LLAMA_3, *flags)["fits"]
    budget, length, batch = fits["memory_bytes"], fits["max_seq_len"], fits["max_batch"]
    assert length > 6000 and batch > 3

    def serving(batch, seq_len):
        argv = [LLAMA_3, "--batch", str(batch), "--seq-len", str(seq_len), "--kv-dtype", "fp8"]
        return inspect_json(capsys, *argv)["memory"]["serving_bytes"]

    assert serving(3, length) <= budget < serving(3, length + 1)
    assert serving(batch, 6000) <= budget < serving(batch + 1, 6000)


def test_memory_too_small_for_the_weights_says_so_with_numbers(capsys):
    report = inspect_json(capsys, LLAMA_3, "--memory", "8GiB")
    fits = report["fits"]
    assert fits["weights_fit"] is False and fits["serving_fits"] is False
    assert fits["max_seq_len"] == 0 and fits["max_batch"] == 0
    assert fits["verdict"].startswith(
        "serving does not fit: the weights need 14.96 GiB per device, 7.20 GiB is usable"
    )
    assert [item["weights_dtype"] for item in fits["suggestions"]] == ["int4", "bfloat16"]
    assert fits["suggestions"][1]["devices"] == 4  # 4 x 8 GiB, tensor parallel
    exit_code, out, _ = run_cli(capsys, "inspect", LLAMA_3, "--memory", "8GiB")
    lines = out.splitlines()
    assert exit_code == 0
    assert lines[2].startswith("serving does not fit: the weights need 14.96 GiB per")


def test_table_and_markdown_show_the_verdict_first(capsys):
    exit_code, out, _ = run_cli(capsys, "inspect", LLAMA_3, "--gpu", "rtx4090")
    assert exit_code == 0
    lines = out.splitlines()
    # What the model can use first, then what the memory would hold, in words.
    assert lines[2].startswith("serving fits: yes, its whole 8,192-token context at batch 1")
    assert "the memory would hold 52,724 tokens, more than the model can use" in " ".join(
        line.strip() for line in lines[2:5]
    )
    assert "memory (batch 1, 8,192 tokens, one device)" in out
    assert "training: does not fit" in out
    assert max(len(line) for line in lines) <= 80
    exit_code, out, _ = run_cli(
        capsys, "inspect", LLAMA_3, "--gpu", "A100-80GB", "--format", "markdown"
    )
    assert exit_code == 0 and "## Memory" in out
    section = out.split("## Will it fit?\n\n", 1)[1]
    assert section.startswith("**serving fits: yes, its whole 8,192-token context at batch 1 on")
    assert "A100 80GB" in section


def test_table_shows_weights_per_dtype_and_part(capsys):
    from keras_mha.planning.render.report import format_bytes

    report = inspect_json(capsys, "bundled:ai21labs/Jamba-v0.1")
    exit_code, out, _ = run_cli(capsys, "inspect", "bundled:ai21labs/Jamba-v0.1", "--wide")
    assert exit_code == 0
    lines = out.splitlines()
    start = lines.index(next(line for line in lines if line.split()[:2] == ["weights", "total"]))
    assert lines[start].split()[2:] == [
        "embeddings", "attention", "mlp/experts", "norms", "lm", "head", "other",
    ]  # fmt: skip
    by_part = report["memory"]["weights_bytes_by_part"]
    for line, (dtype, total) in zip(
        lines[start + 1 :], report["memory"]["weights_bytes"].items(), strict=False
    ):
        sizes = [total] + [by_part[dtype][part] for part in memory.PARTS]
        assert line.split()[0] == dtype
        assert " ".join(line.split()[1:]) == " ".join(format_bytes(size) for size in sizes)
    # The `other` column (Mamba mixers here) is left out where every model part is zero.
    exit_code, out, _ = run_cli(capsys, "inspect", LLAMA_3, "--wide")
    header = next(line for line in out.splitlines() if line.split()[:2] == ["weights", "total"])
    assert "other" not in header and "mlp/experts" in header


def test_sliding_window_per_token_column_is_the_next_tokens_cost(capsys):
    report = inspect_json(capsys, GEMMA_3, "--seq-len", "512,131072")
    short, long = report["kv_cache_by_seq_len"]
    # Gemma 3: 5 of 6 layers slide over 1024 tokens. Below the window every layer grows.
    assert short["marginal_bytes_per_token"] == short["bytes_per_token"]
    # At 131,072 tokens only the 5 global layers grow: 5 x 4 KV heads x 256 x 2 x 2 bytes.
    assert long["marginal_bytes_per_token"] == 5 * 4 * 256 * 2 * 2 == 20480
    assert long["bytes_per_token"] == 34 * 4 * 256 * 2 * 2  # the meaning never changes
    exit_code, out, _ = run_cli(capsys, "inspect", GEMMA_3, "--seq-len", "128k")
    row = next(line for line in out.splitlines() if line.strip().startswith("131,072"))
    assert row.split()[1:3] == ["20.00", "KiB"]


def test_seq_len_beyond_the_context_length_warns(capsys):
    report = inspect_json(capsys, LLAMA_3, "--seq-len", "4k,1m")
    warnings = [w for w in report["warnings"] if "beyond the model's context length" in w]
    assert len(warnings) == 1 and "1,048,576" in warnings[0] and "8,192" in warnings[0]
    assert report["kv_cache"]["seq_len"] == 2**20


def test_version(capsys):
    from keras_mha.version import __version__

    exit_code, out, _ = run_cli(capsys, "--version")
    assert exit_code == 0 and out.strip() == f"keras-mha {__version__}"


@pytest.mark.parametrize("alias,dtype", [("bf16", "bfloat16"), ("FP8", "float8"),
                                         ("fp32", "float32"), ("half", "float16")])  # fmt: skip
def test_kv_dtype_aliases(capsys, alias, dtype):
    report = inspect_json(capsys, LLAMA_3, "--kv-dtype", alias)
    assert report["kv_cache"]["dtype"] == dtype


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--seq-len", "0"], "at least 1 token"),
        (["--seq-len=-4k"], "not a length"),
        (["--seq-len", "5000m"], "more than the 1,073,741,824"),
        (["--kv-dtype", "int3"], "not an element type"),
        (["--memory", "24"], "not a memory size"),
        (["--memory", "0GiB"], "more than 0 bytes"),
        (["--gpu", "h100", "--memory", "8GiB"], "not allowed with argument"),
        (["--optimizer", "lion"], "invalid choice"),
        (["--prefill-chunk", "0"], "must be a positive integer"),
        (["--gpu", ""], "names no GPU"),  # an unset shell variable: refused, not ignored
    ],
)
def test_bad_flags_exit_2_naming_the_flag(capsys, argv, expected):
    exit_code, out, err = run_cli(capsys, "inspect", LLAMA_3, *argv)
    assert exit_code == 2 and out == "" and err.count("\n") == 1
    assert expected in err and argv[0].split("=")[0] in err


def test_unknown_gpu_lists_the_known_ones_in_one_line(capsys):
    exit_code, out, err = run_cli(capsys, "inspect", LLAMA_3, "--gpu", "rtx9090")
    assert exit_code == 2 and out == "" and err.count("\n") == 1
    assert "'rtx9090'" in err and all(name in err for name in known_gpu_names())


def test_readme_json_contract_example_is_the_commands_output(capsys):
    """The JSON example of the JSON reference page (the contract) holds the numbers the
    command prints."""
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[2] / "docs" / "reference" / "json.md"
    section = page.read_text(encoding="utf-8").split("## The contract", 1)[1]
    example = json.loads(re.search(r"```json\n(.*?)```", section, re.S).group(1))
    report = inspect_json(capsys, LLAMA_3, "--gpu", "h100")

    def same_keys(expected, actual, path=""):
        for key, value in expected.items():
            if isinstance(value, dict):
                same_keys(value, actual[key], f"{path}{key}.")
            elif not (isinstance(value, str) and "|" in value):  # "hub | local | bundled"
                assert actual[key] == value, f"{path}{key}"

    same_keys(example, report)


def test_bench_inspect_refuses_bad_input_in_one_line(capsys):
    # The timing itself is `keras-mha bench inspect` (tests/benchmarks/ runs it once).
    for argv, code, expected in (
        (["--model", "org/missing"], 3, "no bundled card 'org/missing'"),
        (["--gpu", "xpu"], 2, "H100 80GB SXM"),
        (["--repeat", "0"], 2, "--repeat"),
    ):
        exit_code, out, err = run_cli(capsys, "bench", "inspect", *argv)
        assert exit_code == code and out == "" and err.count("\n") == 1, err
        assert err.startswith("keras-mha: error: bench inspect: ") and expected in err


def test_bundled_cards_say_how_they_were_obtained():
    """Each card's source.json says it was copied or written from memory (never "as
    published"), and the provenance list of the bundled-cards page names exactly the cards
    compared with copies found on GitHub."""
    from pathlib import Path

    from keras_mha.hub.bundled import bundled_source, list_bundled

    page = Path(__file__).resolve().parents[2] / "docs" / "reference" / "cards.md"
    section = page.read_text(encoding="utf-8")
    compared_bullet = section.split("**Written from memory, then compared", 1)[1].split("\n- ")[0]
    for repo_id in list_bundled():
        notes = bundled_source(repo_id)["notes"]
        assert notes.startswith(("Written from memory", "Copied verbatim")), repo_id
        compared = notes.startswith("Written from memory") and "then compared with" in notes
        assert (repo_id.split("/")[1] in compared_bullet) == compared, repo_id
