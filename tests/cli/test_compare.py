"""`keras-mha compare`: one column per model in table, JSON and markdown, the fit rows with
--gpu/--memory, the plot's numbers, and one-line errors."""

import json
import subprocess
import sys

import pytest

from keras_mha import cli
from keras_mha.commands import compare
from keras_mha.hub.config import load_config
from keras_mha.planning.costs import kv_cache_cost
from keras_mha.planning.planner import memory
from keras_mha.planning.spec import from_config

pytestmark = pytest.mark.backend_independent

LLAMA_2 = "bundled:meta-llama/Llama-2-7b-hf"
LLAMA_3 = "bundled:meta-llama/Meta-Llama-3-8B"
MISTRAL = "bundled:mistralai/Mistral-7B-v0.1"


def run_cli(capsys, *argv):
    exit_code = cli.main(list(argv))
    captured = capsys.readouterr()
    return exit_code, captured.out, captured.err


def spec_of(model):
    loaded = load_config(model)
    return from_config(loaded.config, model_id=loaded.model_id)


def test_json_holds_one_inspect_report_per_model(capsys):
    exit_code, out, err = run_cli(
        capsys, "compare", LLAMA_2, LLAMA_3, MISTRAL, "--seq-len", "32k", "--batch", "2",
        "--gpu", "a100-80gb", "--kv-dtype", "int8", "--format", "json",
    )  # fmt: skip
    assert exit_code == 0, err
    comparison = json.loads(out)
    assert (comparison["seq_len"], comparison["batch"], comparison["kv_dtype"]) == (
        32768, 2, "int8",
    )  # fmt: skip
    usable = int(0.9 * 81920 * 1024**2)  # 90% of the device, as vLLM's default
    assert comparison["gpu"] == "A100 80GB" and comparison["memory_bytes"] == usable
    assert comparison["devices"]["memory_bytes"] == 81920 * 1024**2
    models = comparison["models"]
    assert [report["model"] for report in models] == [
        "meta-llama/Llama-2-7b-hf", "meta-llama/Meta-Llama-3-8B", "mistralai/Mistral-7B-v0.1",
    ]  # fmt: skip
    for model, report in zip((LLAMA_2, LLAMA_3, MISTRAL), models, strict=True):
        spec = spec_of(model)
        kv = kv_cache_cost(spec, seq_len=32768, batch=2, kv_dtype="int8")
        assert report["kv_cache"]["total_bytes"] == kv.total_bytes
        plan = memory.plan_fit(spec, memory_bytes=usable, batch=2, seq_len=32768, kv_dtype="int8")
        assert report["fits"]["max_seq_len"] == plan.max_seq_len
        assert report["fits"]["max_batch"] == plan.max_batch
    assert models[2]["fits"]["max_seq_len"] is None  # Mistral: every layer on a window


def test_table_and_markdown_side_by_side(capsys):
    exit_code, out, _ = run_cli(capsys, "compare", LLAMA_2, LLAMA_3, "--memory", "24GiB")
    assert exit_code == 0
    lines = out.splitlines()
    assert lines[0].startswith("compared at batch 1, context 8,192, KV cache bfloat16")
    heading = next(index for index, line in enumerate(lines) if "Llama-2-7b-hf" in line)
    assert "meta-llama/Meta-Llama-3-8B" in lines[heading]
    rows = {line.split("  ")[0]: line.split() for line in lines[heading + 1 :] if line.strip()}
    assert rows["serving fits"][-2:] == ["yes", "yes"]
    assert rows["attention"][-2:] == ["MHA", "GQA"]
    assert rows["KV heads"][-2:] == ["32", "8"]
    assert rows["KV per token"][-4:] == ["512.00", "KiB", "128.00", "KiB"]
    assert "max context at batch 1" in rows and "training fits" in rows

    exit_code, out, _ = run_cli(capsys, "compare", LLAMA_2, LLAMA_3, "--format", "markdown")
    assert exit_code == 0
    assert "| | meta-llama/Llama-2-7b-hf | meta-llama/Meta-Llama-3-8B |" in out
    assert "| attention | MHA | GQA |" in out and "max context" not in out
    # Markdown keeps what the table says below it: the (!) note and the warnings.
    exit_code, out, _ = run_cli(
        capsys, "compare", LLAMA_2, LLAMA_3, "--gpu", "h100", "--format", "markdown"
    )
    assert exit_code == 0 and "| 137,812 (!) |" not in out and "\n(!) beyond the model's" in out
    assert "- meta-llama/Llama-2-7b-hf: --seq-len 8,192 is beyond" in out


def test_plot_series_are_the_cost_models_numbers():
    arguments = cli.build_parser().parse_args(
        ["compare", LLAMA_3, MISTRAL, "--gpu", "L4", "--plot", "x.png"]
    )
    comparison = compare.build_comparison(arguments)
    data = compare.plot_series(comparison, total=False, max_seq_len=32768)
    assert data["seq_lens"] == [1024, 2048, 4096, 8192, 16384, 32768]
    mistral = spec_of(MISTRAL)
    assert data["series"][1]["bytes"] == [
        kv_cache_cost(mistral, seq_len=n).total_bytes for n in data["seq_lens"]
    ]
    total = compare.plot_series(comparison, total=True, max_seq_len=4096)
    assert total["series"][0]["bytes"][-1] == (
        memory.serving_memory(spec_of(LLAMA_3), batch=1, seq_len=4096).total_bytes
    )
    assert data["memory_bytes"] == int(0.9 * 23034 * 1024**2)


@pytest.mark.parametrize(
    "argv,code,expected",
    [
        ([LLAMA_3], 2, "at least two models"),
        ([LLAMA_3, LLAMA_3], 2, "names a model twice"),
        ([LLAMA_3, MISTRAL, "--plot", "out.txt"], 2, "expected a file name ending in .png"),
        ([LLAMA_3, MISTRAL, "--plot-total"], 2, "--plot-total needs --plot"),
        ([LLAMA_3, MISTRAL, "--gpu", "xpu"], 2, "H100 80GB SXM"),
        ([LLAMA_3, "bundled:org/missing"], 3, "org/missing"),
        ([LLAMA_3, MISTRAL, "--timeout", "inf"], 2, "--timeout: 'inf' is out of range"),
    ],
)
def test_errors_are_one_line(capsys, argv, code, expected):
    exit_code, out, err = run_cli(capsys, "compare", *argv)
    assert exit_code == code and out == "" and err.count("\n") == 1
    assert expected in err


def test_plot_without_matplotlib_is_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    out = tmp_path / "plot.png"
    exit_code, stdout, err = run_cli(capsys, "compare", LLAMA_3, MISTRAL, "--plot", str(out))
    assert exit_code == 18 and stdout == "" and err.count("\n") == 1
    assert "pip install 'keras-mha[plot]'" in err and not out.exists()


def test_plot_into_a_missing_folder_is_a_path_error(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "no" / "such" / "plot.png"
    exit_code, _, err = run_cli(capsys, "compare", LLAMA_3, MISTRAL, "--plot", str(target))
    assert exit_code == 14 and err.count("\n") == 1 and "cannot write" in err


_IMPORT_PROBE = """
import contextlib, io, json, sys
from keras_mha.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    codes = [main(argv) for argv in json.loads(sys.argv[1])]
heavy = {"keras", "jax", "torch", "tensorflow", "numpy", "huggingface_hub", "matplotlib"}
print(json.dumps([codes, sorted({name.split(".")[0] for name in sys.modules} & heavy)]))
"""


def test_compare_and_the_fit_search_import_no_keras_backend_numpy_or_hub():
    commands = [
        ["compare", LLAMA_3, MISTRAL, "--gpu", "h100", "--format", output_format]
        for output_format in ("table", "json", "markdown")
    ] + [["inspect", LLAMA_3, "--memory", "24GiB", "--format", "markdown"]]
    completed = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE, json.dumps(commands)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(completed.stdout) == [[0, 0, 0, 0], []], completed.stderr
