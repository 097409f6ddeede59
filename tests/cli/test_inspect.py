"""`keras-mha inspect` and `cards`: formats, README JSON keys, exit codes, imports."""

import json
import subprocess
import sys

import pytest

from keras_mha import cli
from keras_mha.hub.bundled import bundled_config_path, list_bundled
from tests.hub_server import HubRepo, environment_for_subprocess, hub_environment

pytestmark = pytest.mark.backend_independent

LLAMA_3 = "meta-llama/Meta-Llama-3-8B"
LLAMA_3_CONFIG = bundled_config_path(LLAMA_3).read_bytes() if bundled_config_path(LLAMA_3) else b""

# The numbers the README's JSON contract promises for Meta-Llama-3-8B (transformers counts
# 8,030,261,248 parameters; 32 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes = 131,072
# bytes a token).
LLAMA_3_PARAMETERS = 8030261248
LLAMA_3_ATTENTION_PARAMETERS = 1342177280
LLAMA_3_BYTES_PER_TOKEN = 131072

HEAVY_MODULES = ("keras", "tensorflow", "jax", "torch", "numpy", "huggingface_hub", "transformers")

REPOS = {
    LLAMA_3: HubRepo({"main": {"config.json": LLAMA_3_CONFIG}}, gated=True, tokens={"hf_ok"}),
    "org/tiny-llama": {"main": {"config.json": LLAMA_3_CONFIG}},
    "org/weights-only": {"main": {"model.gguf": b"GGUF"}},
    "org/broken": {"main": {"config.json": b'{"model_type": "llama",}'}},
}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    with hub_environment(tmp_path, monkeypatch, REPOS) as server:
        yield server


def run_cli(capsys, *argv):
    exit_code = cli.main(list(argv))
    captured = capsys.readouterr()
    return exit_code, captured.out, captured.err


def inspect_json(capsys, *argv):
    exit_code, out, err = run_cli(capsys, "inspect", *argv, "--format", "json")
    assert exit_code == 0, err
    return json.loads(out)


# -- JSON -------------------------------------------------------------------------------------


def test_json_has_the_design_keys_and_numbers_for_llama_3_8b(capsys):
    report = inspect_json(capsys, f"bundled:{LLAMA_3}")

    assert report["model"] == LLAMA_3
    assert report["source"] == "bundled"
    assert report["model_type"] == "llama"
    assert report["attention"] | {} == report["attention"]  # a plain dict
    expected_attention = {
        "kind": "GQA",
        "num_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "sliding_window": None,
        "layer_kinds": {"full": 32, "sliding": 0, "none": 0},
    }
    assert {key: report["attention"][key] for key in expected_attention} == expected_attention
    assert report["parameters"]["total"] == LLAMA_3_PARAMETERS
    assert report["parameters"]["attention"] == LLAMA_3_ATTENTION_PARAMETERS
    # Default length: the model's context (8192), capped at 8192.
    assert {key: report["kv_cache"][key] for key in cli_kv_keys()} == {
        "dtype": "bfloat16",
        "batch": 1,
        "seq_len": 8192,
        "bytes_per_token": LLAMA_3_BYTES_PER_TOKEN,
        "total_bytes": 1073741824,
        "mha_equivalent_bytes": 4294967296,
    }


def cli_kv_keys():
    return ("dtype", "batch", "seq_len", "bytes_per_token", "total_bytes", "mha_equivalent_bytes")


def test_json_kv_cache_holds_the_last_requested_length(capsys):
    report = inspect_json(
        capsys, f"bundled:{LLAMA_3}", "--seq-len", "1024,128k", "--batch", "4", "--kv-dtype", "int8"
    )

    assert report["kv_cache"]["seq_len"] == 131072
    assert [entry["seq_len"] for entry in report["kv_cache_by_seq_len"]] == [1024, 131072]
    first = report["kv_cache_by_seq_len"][0]
    # int8: one byte per element, half of bfloat16's per-token cost, plus a bfloat16 scale
    # per token and KV head for keys and values (32 layers x 8 KV heads x 2 x 2 bytes).
    int8_per_token = LLAMA_3_BYTES_PER_TOKEN // 2 + 32 * 8 * 2 * 2
    assert first["dtype"] == "int8" and first["batch"] == 4
    assert first["runtime_dtype"] == "int8" and "per token and KV head" in first["scales"]
    assert first["bytes_per_token"] == int8_per_token
    assert first["total_bytes"] == int8_per_token * 1024 * 4
    assert report["kv_cache"] == report["kv_cache_by_seq_len"][-1]


def test_json_parameter_breakdown_adds_up(capsys):
    parameters = inspect_json(capsys, f"bundled:{LLAMA_3}")["parameters"]
    assert sum(parameters["breakdown"].values()) == parameters["total"]
    assert parameters["breakdown"]["attention"] == parameters["attention"]


def test_json_from_the_hub_says_source_hub(capsys, hub):
    report = inspect_json(capsys, "org/tiny-llama", "--endpoint", hub.url)

    assert report["source"] == "hub"
    assert report["model"] == "org/tiny-llama"
    assert report["parameters"]["total"] == LLAMA_3_PARAMETERS


def test_token_and_revision_reach_the_hub(capsys, hub):
    report = inspect_json(capsys, LLAMA_3, "--token", "hf_ok", "--revision", "main")

    assert report["source"] == "hub"
    requests = hub.resolve_requests()
    assert requests and all(request.bearer_token == "hf_ok" for request in requests)
    # config.json, then the weights' size: the safetensors index, or 8 bytes of the file.
    paths = [request.path.split("/resolve/")[1] for request in requests]
    assert paths[0] == "main/config.json"
    assert all(path.split("/", 1)[1].startswith("model.safetensors") for path in paths[1:])


def test_offline_flag_never_touches_the_network(capsys, hub):
    report = inspect_json(capsys, LLAMA_3, "--offline")

    assert report["source"] == "bundled"
    assert "offline" in report["source_note"]
    assert hub.requests == []


def test_local_directory(capsys, tmp_path):
    (tmp_path / "config.json").write_bytes(LLAMA_3_CONFIG)
    report = inspect_json(capsys, str(tmp_path))
    assert report["source"] == "local"
    assert report["model"] == str(tmp_path)
    assert report["parameters"]["total"] == LLAMA_3_PARAMETERS


# -- table and markdown -----------------------------------------------------------------------


def test_table_shows_layout_parameters_and_kv_cache(capsys):
    exit_code, out, err = run_cli(capsys, "inspect", f"bundled:{LLAMA_3}", "--seq-len", "8k,32k")

    assert exit_code == 0, err
    for expected in (
        LLAMA_3,
        "GQA",
        "KV heads",
        "head dim",
        "8,030,261,248",
        "8.03 B",
        "1,342,177,280",
        "128.00 KiB",  # per token
        "1.00 GiB",  # at 8192
        "4.00 GiB",  # at 32768 / MHA equivalent at 8192
        "4.0x smaller",
        "32,768",
    ):
        assert expected in out, f"{expected!r} missing from\n{out}"


def test_markdown_is_a_model_card(capsys):
    exit_code, out, err = run_cli(capsys, "inspect", f"bundled:{LLAMA_3}", "--format", "markdown")

    assert exit_code == 0, err
    assert out.startswith(f"# {LLAMA_3}\n")
    for section in ("## Attention", "## Parameters", "## KV cache", "## Source"):
        assert section in out
    assert "| 8,192 | 128.00 KiB | 1.00 GiB | 4.00 GiB |" in out


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, exit_code, mentions",
    [
        (["org/missing"], 3, "org/missing"),
        ([LLAMA_3], 4, "token"),
        (["org/tiny-llama", "--revision", "v404"], 5, "v404"),
        (["org/weights-only"], 6, "config.json"),
        (["org/broken"], 7, "line 1 column 24"),
        (["bundled:nobody/nothing"], 3, "nobody/nothing"),
        (["./no/such/dir"], 6, "./no/such/dir"),
    ],
)
def test_errors_are_one_line_with_their_exit_code(capsys, hub, argv, exit_code, mentions):
    code, out, err = run_cli(capsys, "inspect", *argv)

    assert code == exit_code
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("keras-mha: error: "), err
    assert mentions in err


def test_timeout_with_nothing_cached_exits_8(capsys, hub):
    hub.delay_seconds = 30
    code, _, err = run_cli(capsys, "inspect", "org/tiny-llama", "--timeout", "0.5")
    assert code == 8
    assert "Timeout" in err and err.count("\n") == 1


def test_config_without_essential_keys_exits_9(capsys, tmp_path):
    # An unknown family gets no defaults, so the missing head count is an error.
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "my-arch", "hidden_size": 64}))
    code, out, err = run_cli(capsys, "inspect", str(tmp_path))
    assert code == 9, err
    assert out == "" and err.count("\n") == 1 and str(tmp_path) in err


def test_usage_errors_exit_2_with_one_short_line(capsys):
    code, out, err = run_cli(capsys, "inspect", "gpt2", "--seq-len", "long")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("keras-mha: error: --seq-len: ")
    # The flag once, the value, and what was expected; no usage block.
    assert err.count("--seq-len") == 1 and "'long'" in err and "usage:" not in err


def test_no_traceback_from_a_real_process(tmp_path):
    environment = environment_for_subprocess(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path))
    completed = subprocess.run(
        [sys.executable, "-m", "keras_mha.cli", "inspect", "org/not-bundled"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
    )
    assert completed.returncode == 8
    assert completed.stdout == ""
    assert completed.stderr.startswith("keras-mha: error: org/not-bundled: offline")
    assert "Traceback" not in completed.stderr and completed.stderr.count("\n") == 1


def test_real_process_follows_hf_endpoint_and_hf_home_then_uses_the_cache(hub):
    # The environment alone (HF_ENDPOINT, HF_HOME, HF_HUB_CACHE set by the fixture)
    # steers huggingface_hub in a fresh process, as it does for users.
    command = [sys.executable, "-m", "keras_mha.cli", "inspect", "org/tiny-llama"]
    command += ["--format", "json"]

    def run():
        completed = subprocess.run(
            command, capture_output=True, text=True, env=environment_for_subprocess(), timeout=60
        )
        assert completed.returncode == 0, completed.stderr
        return json.loads(completed.stdout)

    online = run()
    assert online["source"] == "hub" and hub.resolve_requests()
    hub.stop()
    cached = run()
    assert cached["source"] == "hub"
    assert cached["commit"] == online["commit"] is not None
    assert cached["parameters"] == online["parameters"]


# -- start-up: no keras, no backend, no huggingface_hub -------------------------------------

_IMPORT_PROBE = (
    "import json, sys\n"
    "from keras_mha.cli import main\n"
    "exit_code = main(sys.argv[1:])\n"
    "heavy = sorted({name.split('.')[0] for name in sys.modules} & set(json.loads(%r)))\n"
    "sys.stderr.write(json.dumps({'exit_code': exit_code, 'heavy': heavy}))\n"
)


@pytest.mark.parametrize("model", [f"bundled:{LLAMA_3}", "LOCAL"])
@pytest.mark.parametrize("output_format", ["json", "table", "markdown"])
def test_inspect_imports_no_keras_backend_or_hub(tmp_path, model, output_format):
    if model == "LOCAL":
        (tmp_path / "config.json").write_bytes(LLAMA_3_CONFIG)
        model = str(tmp_path)
    probe = _IMPORT_PROBE % json.dumps(HEAVY_MODULES)
    completed = subprocess.run(
        [sys.executable, "-c", probe, "inspect", model, "--format", output_format],
        capture_output=True,
        text=True,
        timeout=60,
    )
    result = json.loads(completed.stderr)
    assert result == {"exit_code": 0, "heavy": []}


# -- cards and bench --------------------------------------------------------------------------


def test_cards_lists_the_bundled_cards(capsys):
    exit_code, out, _ = run_cli(capsys, "cards")
    assert exit_code == 0
    assert [line.split("\t")[0] for line in out.splitlines()] == list_bundled()


# `bench` dispatch and its errors: tests/benchmarks/test_benchmarks.py.


def test_kv_dtype_choices_match_the_cost_model():
    from keras_mha.planning.costs import KV_DTYPE_BITS
    from keras_mha.planning.planner.units import DTYPES

    assert DTYPES == tuple(KV_DTYPE_BITS)
