"""`keras-mha bench model`'s paired rounds and ratios, on a fake clock (no model runs)."""

import pytest

from benchmarks import models as bench

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


@pytest.mark.backend_independent
def test_the_backends_table_has_one_row_per_backend():
    reports = [_report("jax"), _report("torch")]
    reports[0][bench.OURS]["generation"]["path"] = "loop"
    reports[0]["roofline"] = {"bound_tokens_per_second": 4.0, "decode_context": 10,
                              "limited_by": "memory bandwidth", "source": "measured",
                              bench.OURS: 0.5, bench.THEIRS: 0.5}  # fmt: skip
    lines = bench.render(reports, ARGUMENTS, markdown=True).splitlines()
    assert "batch 1, prompt 8, 5 new tokens" in lines[0] and "2 CPUs" in lines[0]
    assert "medians of 4 rounds" in lines[1]
    assert lines[2] == "decode bound 4.0 tok/s at 10 tokens of context (memory bandwidth; measured)"
    rows = [line for line in lines if line.startswith("| ")]
    assert rows[0].startswith(
        "| backend (decode path) | prefill tok/s keras-mha | transformers | ratio |"
    )
    # Rates: medians with the slow round pulling the first quartile down; ratios: unmoved.
    assert rows[1] == "| jax (loop) | 8 (6-8) | 4 (3-4) | 2.00x (2.00-2.00) | " + (
        "2.0 (1.6-2.0) | 2.0 (1.6-2.0) | 1.00x (1.00-1.00) | - | - | 0.50 | 0.50 | - |"
    )
    assert rows[2].startswith("| torch (eager) | 8 (6-8) |")


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
