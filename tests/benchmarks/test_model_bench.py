"""`keras-mha bench model`'s paired rounds and ratios, on a fake clock (no model runs)."""

import keras
import numpy as np
import pytest

from benchmarks import models as bench
from benchmarks.keras_hub_peer import KERAS_HUB
from benchmarks.reporting import COLUMNS

ARGUMENTS = bench.parse_args(["--rounds", "4", "--new-tokens", "5", "--prompt-length", "8"])


class FakeClock:
    """A clock that each fake call advances by its own duration, and a log of the calls."""

    def __init__(self):
        self.now = 0.0
        self.calls = []

    def __call__(self):
        return self.now

    def call(self, name, durations):
        durations = iter(durations)

        def run():
            self.calls.append(name)
            self.now += next(durations)

        return run


def _rounds():
    """keras-mha's prefill takes 1 s and its generation 3 s; transformers' 2 s and 4 s,
    except in round 2, when the machine was busy and everything took ten times longer."""
    clock = FakeClock()
    # The first value of each is the untimed warm-up.
    ours = (
        clock.call("ours prefill", [9, 1, 1, 10, 1]),
        clock.call("ours full", [9, 3, 3, 30, 3]),
    )
    theirs = (
        clock.call("theirs prefill", [9, 2, 2, 20, 2]),
        clock.call("theirs full", [9, 4, 4, 40, 4]),
    )
    times = bench.time_rounds({bench.OURS: ours, bench.THEIRS: theirs}, 4, clock=clock)
    return times, clock.calls


@pytest.mark.backend_independent
def test_rounds_alternate_the_side_that_goes_first():
    times, calls = _rounds()
    assert calls[:4] == ["ours prefill", "ours full", "theirs prefill", "theirs full"]
    timed = calls[4:]
    assert timed[:4] == ["ours prefill", "theirs prefill", "ours full", "theirs full"]
    assert timed[4:8] == ["theirs prefill", "ours prefill", "theirs full", "ours full"]
    assert times[bench.OURS] == {
        "prefill_seconds": [1, 1, 10, 1],
        "total_seconds": [3, 3, 30, 3],
    }


@pytest.mark.backend_independent
def test_paired_ratios_hold_when_a_round_is_slow():
    times, _ = _rounds()
    shape = (1, 8, 5)
    ours = bench.round_rates(times[bench.OURS], *shape)
    theirs = bench.round_rates(times[bench.THEIRS], *shape)
    # prefill: 8 tokens in 1 s; decode: 4 tokens in 3 - 1 s.
    assert ours["prefill_tokens_per_second"] == 8.0
    assert ours["decode_tokens_per_second"] == 2.0
    assert ours["rounds"]["decode_tokens_per_second"] == [2.0, 2.0, 0.2, 2.0]
    assert theirs["prefill_tokens_per_second"] == 4.0
    paired = bench.paired_ratios(ours, theirs)
    # Every round, the slow one too, has keras-mha 2x transformers' prefill rate and
    # the same decode rate (4 tokens in 2 s on both sides).
    assert paired["prefill"]["ratios"] == [2.0, 2.0, 2.0, 2.0]
    assert paired["prefill"]["median"] == 2.0 and paired["prefill"]["quartiles"] == [2.0, 2.0]
    assert paired["decode"]["median"] == 1.0
    assert (paired["decode"]["min"], paired["decode"]["max"]) == (1.0, 1.0)


@pytest.mark.backend_independent
def test_quartiles_of_the_ratios_show_the_spread():
    ours = {"rounds": {"prefill_tokens_per_second": [1, 2, 3, 4, 5]}}
    theirs = {"rounds": {"prefill_tokens_per_second": [1, 1, 1, 1, 1]}}
    for side in (ours, theirs):
        side["rounds"]["decode_tokens_per_second"] = [1, 1, 1, 1, 1]
    prefill = bench.paired_ratios(ours, theirs)["prefill"]
    assert prefill["median"] == 3.0 and prefill["quartiles"] == [2.0, 4.0]
    assert (prefill["min"], prefill["max"]) == (1.0, 5.0)


def _report(backend):
    times, _ = _rounds()
    shape = (1, 8, 5)
    ours = bench.round_rates(times[bench.OURS], *shape)
    theirs = bench.round_rates(times[bench.THEIRS], *shape)
    return {
        "shape": {
            "hidden_size": 256,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "num_hidden_layers": 4,
            "vocab_size": 32000,
        },
        "parameters": 12e6,
        "dtype": "float32",
        "machine": {"processor": "x86_64", "cpus": 2, "date": "2026-11-26 14:00 UTC"},
        bench.OURS: {**ours, "backend": backend, "generation": {"compiled": backend != "torch"}},
        bench.THEIRS: {**theirs, "backend": "torch 2.13.0+cpu"},
        "paired": bench.paired_ratios(ours, theirs),
    }


def _with_every_peer(report, theirs_rates):
    """`report` with transformers' compiled path and keras-hub beside it (both at
    `theirs_rates`), a quantized cache and a roofline."""
    for name, paired in ((bench.THEIRS_COMPILED, "paired_compiled"),
                         (KERAS_HUB, "paired_keras_hub")):  # fmt: skip
        report[name] = {**theirs_rates, "backend": "torch", "generate": "jax.jit"}
        report[paired] = bench.paired_ratios(report[bench.OURS], theirs_rates)
    report[bench.QUANTIZED_KV] = {
        "kv_cache_dtype": "float8_e4m3fn",
        "paired_with_float_cache": bench.paired_ratios(theirs_rates, report[bench.OURS]),
        "cache_bytes": {"float": 123_456_789, "float8_e4m3fn": 61_728_394, "length": 4096},
    }
    report["roofline"] = {"bound_tokens_per_second": 4.0, "decode_context": 10,
                          "limited_by": "memory bandwidth", "source": "measured copy bandwidth",
                          bench.OURS: 0.5, bench.THEIRS: 0.5, KERAS_HUB: 0.25}  # fmt: skip
    return report


@pytest.mark.backend_independent
def test_the_backends_table_has_one_block_per_backend():
    reports = [_report("jax"), _report("torch")]
    reports[0][bench.OURS]["generation"]["path"] = "loop"
    _with_every_peer(reports[0], reports[0][bench.THEIRS])
    reports[1]["keras_hub_skipped"] = "no row in PEERS"
    lines = bench.render(reports, ARGUMENTS, markdown=True).splitlines()
    assert "batch 1, prompt 8, 5 new tokens" in lines[0] and "2 CPUs" in lines[0]
    text = lines[1]
    assert "medians of 4 rounds" in text
    assert "/ bound = decode tok/s over the bound, 4.0 tok/s at 10 tokens of context" in text
    rows = [line for line in lines if line.startswith("| ")]
    assert rows[0] == "| backend | prefill tok/s | decode tok/s | / bound |"
    # Rates: medians with the slow round pulling the first quartile down; ratios: unmoved.
    assert rows[1:6] == [
        "| jax |  |  |  |",
        "|   keras-mha (loop) | 8 (6-8) | 2.0 (1.6-2.0) | 0.50 |",
        "|   transformers | 4 (3-4) | 2.0 (1.6-2.0) | 0.50 |",
        "|     ratio | 2.00x (2.00-2.00) | 1.00x (1.00-1.00) |  |",
        "|   transformers compiled | 4 (3-4) | 2.0 (1.6-2.0) | - |",
    ]
    assert rows[7:9] == [
        "|   keras-hub | 4 (3-4) | 2.0 (1.6-2.0) | 0.25 |",
        "|     ratio | 2.00x (2.00-2.00) | 1.00x (1.00-1.00) |  |",
    ]
    assert rows[9:11] == [
        "| torch |  |  |  |",
        "|   keras-mha (eager) | 8 (6-8) | 2.0 (1.6-2.0) | - |",
    ]
    assert rows[-1] == "|   keras-hub | - | - | - |"
    assert "keras-hub on jax: generate runs as jax.jit (torch)" in lines
    assert "keras-hub on torch: not run: no row in PEERS" in lines
    # Asked away (--no-keras-hub: neither results nor a reason): no row, no note.
    del reports[1]["keras_hub_skipped"]
    lines = bench.render(reports, ARGUMENTS, markdown=True).splitlines()
    torch_rows = lines[lines.index("| torch |  |  |  |") :]
    assert "|   keras-mha (eager)" in torch_rows[1]
    assert not any(line.startswith("|   keras-hub") for line in torch_rows)
    assert not any(line.startswith("keras-hub on torch") for line in lines)


@pytest.mark.backend_independent
def test_the_text_report_keeps_to_80_columns():
    reports = [_report(backend) for backend in ("tensorflow", "jax", "torch")]
    for report in reports:
        report["machine"]["processor"] = "Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz"
        report[bench.OURS]["generation"]["path"] = "cuda_graph"
        report["machine"]["device"] = "NVIDIA H200"
        _with_every_peer(report, report[bench.THEIRS])
        report[KERAS_HUB]["generate"] = "tf.function, XLA"
        # Six-figure prefill rates (a GPU at batch 8) and four-figure decode rates.
        for name in (bench.OURS, bench.THEIRS, bench.THEIRS_COMPILED, KERAS_HUB):
            report[name]["prefill_tokens_per_second"] = 123_456.0
            report[name]["decode_tokens_per_second"] = 1234.5
            rounds = report[name]["rounds"]
            rounds["prefill_tokens_per_second"] = [123_456.0, 101_234.0, 198_765.0]
            rounds["decode_tokens_per_second"] = [1234.5, 1012.3, 1987.6]
    arguments = bench.parse_args(["--kv-cache-dtype", "float8_e4m3fn", "--quantize", "int8"])
    text = bench.render(reports, arguments)
    assert max(len(line) for line in text.splitlines()) <= COLUMNS, text
    assert "keras-hub on tensorflow: generate runs as tf.function, XLA" in text
    assert text.count("KV cache float8_e4m3fn / float") == 3


@pytest.mark.backend_independent
def test_flags():
    assert bench.parse_args(["--repeats", "3"]).rounds == 3
    assert bench.parse_args(["--json"]).format == "json"
    assert bench.parse_args(["--backends", "jax, torch"]).backends == ["jax", "torch"]
    worker = bench.parse_args(
        bench.worker_argv(bench.parse_args(["--backends", "jax", "--scale", "4"]))
    )
    assert (worker.scale, worker.backends, worker.format) == (4, None, "json")
    for bad in (["--backends", "numpy"], ["--backends", ","], ["--rounds", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    assert bench.parse_args(["--no-keras-hub"]).no_keras_hub
    assert "--no-keras-hub" in bench.worker_argv(bench.parse_args(["--no-keras-hub"]))


def test_keras_hub_generates_keras_mha_greedy_tokens(tmp_path_factory):
    """keras-hub's `generate`, loaded by `keras_hub_peer` from the checkpoint of a tiny
    Llama with llama3 RoPE scaling (which keras-hub's converter alone drops), gives
    keras-mha's greedy tokens.

    On PyTorch only: on JAX and TensorFlow compiling keras-hub's generate and keras-mha's
    took 17-22 s in this test (passing, loaded machine), and the loader and the inputs
    under test are the same there.
    """
    if keras.backend.backend() != "torch":
        pytest.skip("on PyTorch only: the two compiled generates take 20 s to compile")
    pytest.importorskip("keras_hub")
    from benchmarks import keras_hub_peer
    from keras_mha.models import generate
    from tests.models_checkpoints import loaded

    made, model = loaded(tmp_path_factory, "llama")
    ids = made.token_ids[:, :6].astype("int32")
    causal_lm = keras_hub_peer.load(str(made.directory), "float32")
    theirs = keras_hub_peer.generator(causal_lm, ids, 4)()
    np.testing.assert_array_equal(theirs, generate(model, ids, 4))
