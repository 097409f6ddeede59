"""`keras-mha bench layers` on tiny shapes: every row runs, agrees with its baseline, renders.

Speed is never asserted here; the checks are that each implementation ran, that
the ones compared computed the same thing (keras-mha against Keras and the
hand-written reference; the cached step against the recompute; the reference's and
keras-hub's cached MHA against keras-mha's), that the roofline and ratios are filled in,
and that errors are one line with the right exit code.
"""

import json
import math
import os
import subprocess
import sys

import keras
import pytest

from benchmarks import CHECKOUT
from benchmarks import layers as bench
from keras_mha import cli
from keras_mha.commands import bench as bench_command

TINY = dict(
    batch=1,
    seq_len=16,
    heads=4,
    kv_heads=2,
    head_dim=8,
    decode_context=16,
    repeats=2,
    decode_repeats=4,
    warmup=1,
    matmul_size=128,
    copy_mib=4,
    # XLA compiles the reference rows; plain tf.function for the layers keeps the
    # TensorFlow leg short (the layers' XLA path is tested in tests/layers/).
    tf_jit_compile=False,
)
TINY_FLAGS = [
    "--batch", "1", "--seq-len", "16", "--heads", "4", "--kv-heads", "2", "--head-dim", "8",
    "--decode-context", "16", "--repeats", "1", "--decode-repeats", "2", "--warmup", "1",
    "--matmul-size", "128", "--copy-mib", "4", "--no-tf-jit-compile",
]  # fmt: skip


@pytest.fixture(scope="module")
def tiny_results():
    # Peak memory is covered by the fresh-process test below (the default path).
    return bench.run_benchmark(bench.Config(**TINY, isolate=False, memory=False))


def _positive(value):
    return isinstance(value, float) and math.isfinite(value) and value > 0


def _tolerance():
    # float32 everywhere; GPUs may use TF32-class matmuls inside the fused kernels.
    from benchmarks import backends

    return 1e-4 if backends.device() == "cpu" else 2e-3


def test_every_planned_row_is_measured(tiny_results):
    planned = [
        (e["case"], e["implementation"], e["mode"])
        for group in bench.plan(bench.Config(**TINY))
        for e in group
    ]
    measured = [(r["case"], r["implementation"], r["mode"]) for r in tiny_results["rows"]]
    assert measured == planned and len(planned) == 3 * 4 + 8  # decode: 6 steps + the calls
    for row in tiny_results["rows"]:
        assert len(row["times_ms"]) == (4 if row["mode"] == "step" else 2)
        assert all(_positive(t) for t in row["times_ms"])
        low, high = row["quartiles_ms"]
        assert low <= row["median_ms"] <= high
        assert _positive(row["flops_per_s"]) and _positive(row["percent_of_matmul_peak"])
        assert row["peak_mb"] is None or row["peak_mb"] >= 0
    roofline = tiny_results["roofline"]
    assert roofline["matmul"]["n"] == 128 and _positive(roofline["matmul"]["flops_per_s"])
    assert roofline["copy"]["buffer_bytes"] == 4 * 2**20
    assert _positive(roofline["copy"]["bytes_per_s"])
    assert tiny_results["environment"]["backend"] == keras.backend.backend()


def test_compared_rows_computed_the_same_thing(tiny_results):
    by_key = {(r["case"], r["implementation"], r["mode"]): r for r in tiny_results["rows"]}
    for (case, implementation, mode), row in by_key.items():
        baseline = implementation in (bench.OURS, bench.OURS_MHA) and mode != "recompute"
        if baseline:
            assert row["max_abs_diff"] is None
            assert row["time_vs_keras_mha"] == pytest.approx(1.0)
        else:
            # keras and the reference against keras-mha; keras-hub against keras-mha MHA;
            # the recompute's last token against the cached step.
            assert row["max_abs_diff"] < _tolerance(), (case, implementation, mode)
            assert _positive(row["time_vs_keras_mha"])
        if implementation in (bench.REFERENCE, bench.REFERENCE_MHA):
            assert row["percent_of_reference"] == pytest.approx(100.0)
    for implementation in (bench.OURS, bench.REFERENCE, *bench.MHA_ROWS):
        step = by_key["decode", implementation, "step"]
        assert _positive(step["percent_of_copy_bandwidth"])
        assert _positive(step["percent_of_reference"])  # the MHA rows: of reference MHA
        kv_heads = 4 if implementation in bench.MHA_ROWS else 2
        assert step["kv_bytes"] == 2 * 1 * 17 * kv_heads * 8 * 4


def test_report_renders_every_column(tiny_results):
    table = bench.render(tiny_results)
    for text in (
        "% of ref",
        "% of roof",
        "vs keras-mha",
        "peak MB",
        "decode, context 16",
        "keras-hub MHA",
        "keras-mha recompute",
        "128^3 matmul",
        f"keras-mha bench layers: {keras.backend.backend()}",
    ):
        assert text in table
    markdown = bench.render(tiny_results, markdown=True)
    assert "|  | ms (quartiles) | vs keras-mha | % of ref | % of roof |" in markdown
    assert markdown.count("| mha forward |") == 2  # the speed and the details tables
    # mha and gqa forward and forward+backward, and decode; in both tables.
    assert markdown.count("|   keras-mha | ") == 2 * 5
    json.dumps(tiny_results)


def test_cli_passes_the_flags_and_prints_json(tiny_results, capsys, monkeypatch):
    # The run itself is the fixture's; this checks the flags reach Config and the JSON out.
    configs = []
    monkeypatch.setattr(
        bench, "run_benchmark", lambda config, progress: configs.append(config) or tiny_results
    )
    flags = [*TINY_FLAGS, "--cases", "decode", "--dtype", "bfloat16", "--torch-compile"]
    assert (
        cli.main(["bench", "layers", *flags, "--in-process", "--no-memory", "--format", "json"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["rows"] == json.loads(
        json.dumps(tiny_results["rows"])
    )
    expected = dict(TINY, repeats=1, decode_repeats=2, warmup=1, cases=("decode",))
    expected.update(dtype="bfloat16", torch_compile=True, isolate=False, memory=False)
    assert configs == [bench.Config(**expected)]
    assert cli.main(["bench", "layers", *flags, "--in-process"]) == 0
    assert "% of roof" in capsys.readouterr().out


@pytest.mark.backend_independent
def test_memory_is_measured_in_a_fresh_process():
    # One CPU: a single-threaded backend in the child (OpenMP threads that spin on a shared
    # machine made this child 10x slower).
    config = bench.Config(**TINY, cpus=1)
    entry = {"case": "gqa", "implementation": "reference", "mode": "forward"}
    memory = bench._measure("memory", entry, config)
    assert memory["method"] in ("rss high-water mark", "cuda", "xla", "tensorflow", "unavailable")
    assert memory["peak_bytes"] is None or memory["peak_bytes"] >= 0


@pytest.mark.backend_independent
def test_paired_ratio_pairs_calls_of_the_same_round():
    # Round 2 ran while the machine was busy: both sides slowed alike.
    slow = {"times_ms": [20.0, 22.0, 200.0, 21.0], "rounds": [0, 1, 2, 3]}
    fast = {"times_ms": [10.0, 11.0, 100.0, 10.5], "rounds": [0, 1, 2, 3]}
    assert bench.paired_ratio(slow, fast) == pytest.approx(2.0)
    recompute = {"times_ms": [30.0, 270.0], "rounds": [0, 2]}
    step = {"times_ms": [1.0, 1.0, 9.0, 1.0], "rounds": [0, 1, 2, 3]}
    assert bench.paired_ratio(recompute, step) == pytest.approx(30.0)


@pytest.mark.backend_independent
@pytest.mark.parametrize("count", [2, 3, 5])
def test_turns_give_every_entry_every_place_and_no_back_to_back_calls(count):
    rounds = [bench.turn_order(count, r) for r in range(4 * count)]
    calls = [index for order in rounds for index in order]
    for order in rounds:
        assert sorted(order) == list(range(count))
    for place in range(count):  # each entry equally often at each place
        assert sorted(order[place] for order in rounds) == sorted(list(range(count)) * 4)
    back_to_back = [a for a, b in zip(calls, calls[1:], strict=False) if a == b]
    if count > 2:
        assert back_to_back == []
    else:  # A B, B A, A B: both alike
        assert abs(back_to_back.count(0) - back_to_back.count(1)) <= 1


@pytest.mark.backend_independent
def test_plan_groups_each_comparison():
    groups = bench.plan(bench.Config(cases=("mha", "decode")), keras_hub_installed=False)
    assert [[(e["implementation"], e["mode"]) for e in group] for group in groups] == [
        [("keras-mha", "forward"), ("keras", "forward"), ("reference", "forward")],
        [
            ("keras-mha", "forward+backward"),
            ("keras", "forward+backward"),
            ("reference", "forward+backward"),
        ],
        [
            ("keras-mha", "step"),
            ("keras-mha call", "step"),
            ("reference", "step"),
            ("keras-mha MHA", "step"),
            ("keras-mha MHA call", "step"),
            ("reference MHA", "step"),
            ("keras-mha", "recompute"),
        ],
    ]


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--heads", "8", "--kv-heads", "3"], "--kv-heads: 3 does not divide --heads 8"),
        (["--seq-len", "0"], "--seq-len: 0; expected an integer >= 1"),
        (["--cases", "mha,flash"], "--cases: 'mha,flash'; expected a comma-separated subset"),
        (["--dtype", "int8"], "--dtype: 'int8'; expected one of float32, bfloat16, float16"),
        (["--matmul-size", "0"], "--matmul-size: 0; expected an integer >= 1"),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag(flags, message, capsys):
    assert cli.main(["bench", "layers", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("keras-mha: error:")


@pytest.mark.backend_independent
def test_missing_backend_is_one_line(capsys, monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    monkeypatch.setitem(sys.modules, "jax", None)  # find_spec("jax") is then None
    assert cli.main(["bench", "layers", "--repeats", "1"]) == 18
    err = capsys.readouterr().err
    assert err == (
        "keras-mha: error: KERAS_BACKEND=jax: jax is not installed; pip install "
        "'keras-mha[jax]' or pick another backend\n"
    )


@pytest.mark.backend_independent
def test_bench_dispatch(capsys, monkeypatch):
    calls = []

    class FakeBenchmarks:
        @staticmethod
        def main(argv):
            calls.append(("layers", argv))
            return 0

        @staticmethod
        def run_model_benchmark(argv):
            calls.append(("model", argv))
            return 3

    monkeypatch.setitem(sys.modules, "benchmarks.layers", FakeBenchmarks)
    monkeypatch.setitem(sys.modules, "benchmarks.models", FakeBenchmarks)
    assert cli.main(["bench", "--steps", "3"]) == 0
    assert cli.main(["bench"]) == 0
    assert cli.main(["bench", "model", "--model", "x"]) == 3
    assert calls == [("layers", ["--steps", "3"]), ("layers", []), ("model", ["--model", "x"])]

    # A module missing from the checkout: one line, MissingDependencyError's code.
    monkeypatch.setitem(sys.modules, "benchmarks.models", None)
    assert cli.main(["bench", "model"]) == 18
    err = capsys.readouterr().err
    assert err.startswith("keras-mha: error: bench model: benchmarks.models")
    assert err.count("\n") == 1


@pytest.mark.backend_independent
def test_bench_outside_a_checkout_says_how_to_get_the_harness(capsys, monkeypatch):
    # An installed wheel has no benchmarks/: one line naming where they are.
    monkeypatch.setattr(bench_command, "checkout_root", lambda: None)
    assert cli.main(["bench", "inspect", "--repeat", "1"]) == 18
    err = capsys.readouterr().err
    assert err.startswith("keras-mha: error: bench inspect: the benchmarks are not part of ")
    assert "source checkout: git clone https://github.com/keras-mha/keras-mha" in err
    assert err.count("\n") == 1
    assert cli.main(["bench", "--help"]) == 0
    assert "source checkout" in capsys.readouterr().out


@pytest.mark.backend_independent
def test_inspect_startup_benchmark_measures_startup(tmp_path):
    # `python -m benchmarks` from the checkout; the working directory does not matter.
    flags = ["--repeat", "1", "--skip-transformers", "--format", "json"]
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks", "inspect", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(CHECKOUT)},
    )
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout)
    assert [t["name"] for t in result["timings"]] == [
        "python startup",
        "keras-mha inspect",
        "keras-mha inspect --gpu H100 80GB SXM",
        "keras-mha compare (2 models) --gpu H100 80GB SXM",
    ]
    assert all(t["min_s"] > 0 for t in result["timings"])


@pytest.mark.backend_independent
def test_host_cost_report_fits_80_columns_and_states_its_ratio():
    from benchmarks import host_cost

    reference = [1.5e-3, 1.6e-3, 1.7e-3]
    report = {
        "rows": {
            "keras-mha torch per_token compile_torch": [2e-4, 2.2e-4, 3.3e-4],
            "keras-mha tensorflow per_token": [2.5e-3, 2.6e-3, 3e-3],
            host_cost.REFERENCE: reference,
        },
        "default_path": {"torch": "device_loop", "tensorflow": "loop", "jax": "loop"},
        "new_tokens": 64,
        "rounds": 3,
        "machine": {"processor": "x86_64", "cpus": 2, "date": "2026-11-29 00:24 UTC"},
        "load_average": [1.6, 1.7, 2.0],
        "transformers_threads": 2,
    }
    text = host_cost.render(report, markdown=False)
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "the ratio to transformers static + compile (transformers on 2 torch" in " ".join(
        text.splitlines()
    )
    row = next(line for line in text.splitlines() if line.startswith("keras-mha tensorflow"))
    assert row.split()[-1] == f"{2.6 / 1.6:.2f}x"


@pytest.mark.backend_independent
def test_layers_report_fits_80_columns():
    """`bench layers`' text report on made-up results at the widest cells it prints."""
    row = {"times_ms": [123.4, 99.9], "rounds": [0, 1], "max_abs_diff": 1.2e-7,
           "peak_mb": 12345.6, "median_ms": 99.99, "quartiles_ms": [0.0123, 123.4],
           "time_vs_keras_mha": 12.34, "percent_of_reference": 1234.0,
           "percent_of_matmul_peak": 0.0123, "percent_of_copy_bandwidth": 0.0123}  # fmt: skip
    rows = [
        {**row, "case": case, "mode": mode, "implementation": implementation}
        for case in ("mha", "gqa")
        for mode in ("forward", "forward+backward")
        for implementation in (bench.OURS, bench.REFERENCE)
    ]
    rows += [
        {**row, "case": "decode", "mode": mode, "implementation": implementation}
        for implementation, mode in (
            *((name, bench.STEP) for name in (bench.OURS, *bench.MHA_ROWS)),
            (bench.OURS, bench.RECOMPUTE),
        )
    ]
    settings = {**{key: 4096 for key in ("batch", "seq_len", "features", "decode_context")},
                "heads": 128, "kv_heads": 16, "head_dim": 256, "causal": True,
                "dtype": "bfloat16", "repeats": 100, "decode_repeats": 1000, "warmup": 10,
                "tf_jit_compile": True, "torch_compile": True}  # fmt: skip
    results = {
        "date": "2026-11-29",
        "machine": {"cpu_count": 16, "load_average": [12.5, 1, 1]},
        "environment": {
            "backend": "tensorflow",
            "device": "NVIDIA H200 (139 GiB)",
            "versions": {"keras": "3.15.1", "tensorflow": "2.21.0"},
        },  # fmt: skip
        "settings": settings,
        "roofline": {
            "matmul": {"n": 8192, "flops_per_s": 9.9e14},
            "copy": {"bytes_per_s": 4.8e12},
        },  # fmt: skip
        "keras_hub": False,
        "rows": rows,
    }
    text = bench.render(results)
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "keras-mha recompute" in text and "keras-hub is not installed" in text
