"""One decode step at context 8192 replayed from a CUDA graph: keras-mha vs the reference.

Both steps, keras-mha's eager decode function and `benchmarks.backends.reference_decode`,
are captured at one position (a Python int index, as an eager loop passes it) into a
`torch.cuda.CUDAGraph` and replayed, which removes the per-kernel launch cost: what is
left is the kernels' own time. Replays of the two take turns (7 rounds of 100 replays,
CUDA events); the same loop without the graphs gives the eager figures. Needs a CUDA GPU.

    KERAS_BACKEND=torch python -m tools.cuda_graph_decode   # from the repository root
"""

import os
import statistics

os.environ.setdefault("KERAS_BACKEND", "torch")

import torch  # noqa: E402

from benchmarks import backends  # noqa: E402
from benchmarks import layers as bench_layers  # noqa: E402

CONFIG = bench_layers.Config(
    batch=4, heads=32, kv_heads=8, head_dim=128, decode_context=8192, dtype="bfloat16"
)


def steps(mha):
    """`{name: step()}` for keras-mha and the reference, both at position `context`."""
    context = CONFIG.decode_context
    layer = bench_layers._keras_mha_layer(CONFIG, mha, True, seed=43 if mha else 42)
    x = bench_layers._input(CONFIG, context + 1)
    prefill, token = x[:, :context], x[:, context : context + 1].clone()
    weights, shape = backends.reference_weights(layer)
    reference, params, state = backends.reference_decode(weights, shape, prefill, context + 1)
    cache = bench_layers._prefilled_cache(layer, "keras-mha", prefill, context + 1)
    decode = layer.make_decode_function()
    return {
        "reference": lambda: reference(params, token, state, context)[0],
        "keras-mha": lambda: decode(token, cache, context)[0],
    }


def capture(runs):
    """`({name: CUDAGraph}, {name: output})`; a step that cannot be captured is reported."""
    graphs, outputs = {}, {}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as capture requires
        for _ in range(3):
            for run in runs.values():
                run()
    torch.cuda.current_stream().wait_stream(side)
    for name, run in runs.items():
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                outputs[name] = run()
            graphs[name] = graph
        except RuntimeError as error:
            print(f"{name}: capture failed: {str(error)[:300]}")
    return graphs, outputs


def time_us(call, repeats=100):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    call()
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats * 1000


def report(label, calls, rounds=7):
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            times[name].append(time_us(call))
    line = ", ".join(f"{name} {statistics.median(t):.1f} us" for name, t in times.items())
    if len(times) == 2:
        ratios = [a / b for a, b in zip(times["keras-mha"], times["reference"], strict=True)]
        line += f"; keras-mha / reference {statistics.median(ratios):.3f}"
        line += f" ({min(ratios):.3f}-{max(ratios):.3f})"
    print(f"{label}: {line}", flush=True)


def main():
    print(torch.cuda.get_device_name(), "| torch", torch.__version__)
    for mha in (False, True):
        kind = "MHA" if mha else "GQA"
        with torch.no_grad():
            runs = steps(mha)
            graphs, outputs = capture(runs)
            if len(outputs) == 2:
                difference = (outputs["keras-mha"].float() - outputs["reference"].float()).abs()
                print(f"{kind}: max |keras-mha - reference| {difference.max().item():.3g}")
            report(f"{kind} CUDA graph", {name: graph.replay for name, graph in graphs.items()})
            report(f"{kind} eager", runs)


if __name__ == "__main__":
    main()
