"""`keras-mha bench layers` on tiny shapes: every case is there, numbers are sane.

Speed is never asserted here; the checks are that each measurement ran, that
both sides of every comparison computed the same thing, that the cached decode
step reproduces the recomputed last token, and that the report renders.
"""

import json
import math

import keras
import numpy as np
import pytest

from keras_mha.benchmarks import layers as bench
from keras_mha.benchmarks.measure_layers import BenchmarkConfig, measurement_plan, timing_groups
from keras_mha.benchmarks.memory import PeakMemory, current_rss_bytes

TINY = dict(
    batch=1,
    seq_len=16,
    heads=4,
    kv_heads=1,
    head_dim=8,
    decode_context=16,
    repeats=2,
    decode_repeats=3,
    warmup=2,
)
TINY_FLAGS = [
    "--batch", "1", "--seq-len", "16", "--heads", "4", "--kv-heads", "1", "--head-dim", "8",
    "--decode-context", "16", "--repeats", "2", "--decode-repeats", "3", "--warmup", "2",
]  # fmt: skip


@pytest.fixture(scope="module")
def tiny_results():
    return bench.run_benchmark(BenchmarkConfig(**TINY, isolate=False))


def _positive(value):
    return isinstance(value, float) and math.isfinite(value) and value > 0


@pytest.mark.slow
def test_every_case_and_mode_is_measured(tiny_results):
    measured = {(m["case"], m["implementation"], m["mode"]) for m in tiny_results["measurements"]}
    planned = {
        (m["case"], m["implementation"], m["mode"])
        for m in measurement_plan(BenchmarkConfig(**TINY))
    }
    assert measured == planned and len(planned) == 11
    for row in tiny_results["measurements"]:
        assert len(row["times_ms"]) == (3 if row["mode"] == "decode step" else 2)
        assert len(row["rounds"]) == len(row["times_ms"])
        assert all(_positive(t) for t in row["times_ms"])
        assert _positive(row["median_ms"])
        assert row["peak_mb"] is None or row["peak_mb"] >= 0


@pytest.mark.slow
def test_comparisons_are_sane_and_compare_like_with_like(tiny_results):
    rows = tiny_results["comparisons"]
    assert [(r["case"], r["mode"]) for r in rows] == [
        ("mha", "forward"),
        ("mha", "forward+backward"),
        ("gqa", "forward"),
        ("gqa", "forward+backward"),
    ]
    for row in rows:
        assert _positive(row["ours_ms"]) and _positive(row["keras_ms"])
        # The speedup is the median of paired (back-to-back) ratios.
        assert _positive(row["speedup"])
        assert row["speedup_quartiles"] is None  # only 2 pairs here; quartiles need 4
        # Same weights, same input: the outputs (forward) or losses (forward+backward) agree.
        assert row["max_abs_diff"] is not None and row["max_abs_diff"] < 1e-4


@pytest.mark.slow
def test_cached_decode_step_matches_recompute(tiny_results):
    decode = tiny_results["decode"]
    assert decode["context"] == 16
    labels = [(r["implementation"], r["mode"]) for r in decode["rows"]]
    assert labels == [
        ("keras-mha", "decode step"),
        ("keras-mha", "recompute"),
        ("keras", "recompute"),
    ]
    for row in decode["rows"]:
        assert _positive(row["median_ms"]) and _positive(row["speedup_of_step"])
    for row in decode["rows"][1:]:
        assert row["max_abs_diff_vs_step"] < 1e-4
    # jax.jit and tf.function compile the step once for all cache positions;
    # eager torch traces nothing.
    expected_traces = 0 if keras.backend.backend() == "torch" else 1
    assert decode["step_traces"] == expected_traces


@pytest.mark.slow
def test_targets_and_reports_render(tiny_results):
    targets = {t["name"]: t for t in tiny_results["targets"]}
    assert set(targets) == {"mha_not_slower", "gqa_faster_or_leaner", "decode_speedup"}
    assert all(isinstance(t["met"], bool) for t in targets.values())
    # Tiny shapes are not the target shapes.
    assert not targets["gqa_faster_or_leaner"]["applicable"]
    assert not targets["decode_speedup"]["applicable"]

    table = bench.format_table(tiny_results)
    for text in (
        "MHA vs MultiHeadAttention",
        "GQA vs GroupQueryAttention",
        "forward+backward",
        "keras-mha cached decode step (1 token, context 16)",
        "keras-mha recompute all 17 tokens",
        "keras GroupQueryAttention recompute all 17 tokens",
        f"backend {keras.backend.backend()}",
    ):
        assert text in table
    markdown = bench.format_markdown(tiny_results)
    assert "| case | mode | keras-mha ms |" in markdown
    assert markdown.count("| MHA vs MultiHeadAttention |") == 2
    json.dumps(tiny_results)


@pytest.mark.slow
def test_cli_json_output_in_process(capsys):
    flags = [*TINY_FLAGS, "--cases", "gqa", "--in-process", "--format", "json", "--quiet"]
    assert bench.main(flags) == 0
    results = json.loads(capsys.readouterr().out)
    assert results["environment"]["backend"] == keras.backend.backend()
    assert results["settings"]["cases"] == ["gqa"]
    assert [r["case"] for r in results["comparisons"]] == ["gqa", "gqa"]
    assert results["decode"] is None


@pytest.mark.slow
def test_fresh_processes_time_a_comparison_and_measure_memory(tmp_path):
    # The default path: one fresh process times both sides of a comparison with
    # their calls interleaved; another measures one side's memory.
    config = BenchmarkConfig(**TINY)
    group = timing_groups(config)[2]
    assert [(s["case"], s["mode"]) for s in group] == [("gqa", "forward")] * 2
    paths = [str(tmp_path / "ours.npy"), str(tmp_path / "keras.npy")]
    timed = bench.time_group(group, config, paths)
    assert [f["implementation"] for f in timed] == ["keras-mha", "keras"]
    for figures in timed:
        assert figures["environment"]["backend"] == keras.backend.backend()
        assert len(figures["times_ms"]) == 2 and _positive(figures["median_ms"])
    ours, builtin = np.load(paths[0]), np.load(paths[1])
    assert ours.shape == (1, 16, 32) and np.max(np.abs(ours - builtin)) < 1e-4

    memory = bench.memory_of(group[1], config)
    assert memory["memory_method"] in ("kernel high-water mark", "sampled every 0.5 ms")
    assert memory["peak_bytes"] is not None and memory["peak_bytes"] >= 0


@pytest.mark.backend_independent
def test_speedup_pairs_calls_of_the_same_round():
    # Round 2 ran while the machine was busy: both sides slowed alike.
    keras_side = {"times_ms": [20.0, 22.0, 200.0, 21.0], "rounds": [0, 1, 2, 3], "median_ms": 21.5}
    ours = {"times_ms": [10.0, 11.0, 100.0, 10.5], "rounds": [0, 1, 2, 3], "median_ms": 10.75}
    speedup, quartiles = bench._speedup(keras_side, ours)
    assert speedup == pytest.approx(2.0)
    assert quartiles == pytest.approx([2.0, 2.0])
    step = {"times_ms": [1.0, 1.0, 9.0, 1.0], "rounds": [0, 1, 2, 3], "median_ms": 1.0}
    recompute = {"times_ms": [30.0, 270.0], "rounds": [0, 2], "median_ms": 150.0}
    assert bench._speedup(recompute, step)[0] == pytest.approx(30.0)


@pytest.mark.backend_independent
def test_timing_groups_pair_the_sides_of_each_comparison():
    groups = timing_groups(BenchmarkConfig(cases=("mha", "decode")))
    assert [[(s["implementation"], s["mode"]) for s in group] for group in groups] == [
        [("keras-mha", "forward"), ("keras", "forward")],
        [("keras-mha", "forward+backward"), ("keras", "forward+backward")],
        [("keras-mha", "decode step"), ("keras-mha", "recompute"), ("keras", "recompute")],
    ]


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--heads", "8", "--kv-heads", "3"], "--kv-heads=3 must divide --heads=8"),
        (["--seq-len", "0"], "--seq-len must be a positive integer; got 0"),
        (["--cases", "mha,flash"], "--cases must be a comma-separated subset"),
        (["--warmup", "0"], "--warmup must be an integer >= 1; got 0"),
        (["--cpus", "0"], "--cpus must be a positive integer; got 0"),
    ],
)
def test_bad_flags_name_the_flag(flags, message, capsys):
    assert bench.main(flags) == 2
    assert message in capsys.readouterr().err


@pytest.mark.backend_independent
def test_peak_memory_sees_a_temporary_allocation():
    if current_rss_bytes() is None:
        pytest.skip("no /proc/self/statm on this platform")
    with PeakMemory() as peak:
        block = np.ones(64 * 2**20 // 8)  # 64 MiB, touched
        del block
    assert peak.method in ("kernel high-water mark", "sampled every 0.5 ms")
    assert 56 * 2**20 <= peak.peak_bytes <= 200 * 2**20
