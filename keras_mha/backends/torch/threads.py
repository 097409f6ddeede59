"""PyTorch on the CPU: the intra-op thread count of a decode loop's steps, chosen by timing.

A one-token step is a chain of small kernels (vector-matrix products, one pass over the
cache), and each that runs on several threads is an OpenMP region whose threads take
fixed shares of the work and wait for each other at its end. Where other processes
share the cores, a thread that is not scheduled holds up every region it has a share
in: on a 2-core machine at load average 10, the `--scale 4` Llama of `keras-mha bench
roofline` decoded at 0.8 tokens/s on torch's 2 threads and 8.8 on one, and the 2-layer
model of `bench host-cost` took 57 ms a token against 8.5 (docs/benchmarks.md). On a
quiet machine more threads can read the weights faster. So `DecodeThreads` times steps
on torch's own thread count and on one thread, in turns, keeps the faster, and times
them again every `RECHECK_STEPS` steps, since the load changes. The thread count moves
no token: the products and the sums are the same, at float round-off.

Example:
    >>> threads = DecodeThreads()
    >>> with threads.steps(lambda x: x + 1) as step:
    ...     outputs = [step(i) for i in range(3)]
    >>> outputs
    [1, 2, 3]
"""

from __future__ import annotations

import contextlib
import time

import torch

#: Timed steps per thread count before choosing (fewer when one count is plainly slower).
SAMPLES = 3
#: A count whose first step took this many times the other's is dropped at once.
PLAINLY_SLOWER = 2.0
#: Steps run on the chosen count before both are timed again.
RECHECK_STEPS = 512


class DecodeThreads:
    """The thread count for the steps of one model's CPU decode loops (kept across calls).

    `chosen` is None until both counts were timed; `timings` holds the seconds of the
    steps timed since the last choice, by thread count.
    """

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.configured = None  # torch's thread count when the choice was made
        self.chosen = None
        self.steps_since_choice = 0
        self.timings: dict[int, list[float]] = {}

    @contextlib.contextmanager
    def steps(self, step):
        """`run(*args) = step(*args)` on the thread count chosen (or being timed); torch's
        own count is back when the block ends."""
        configured = torch.get_num_threads()
        if configured != self.configured:  # the user changed it: choose again
            self.configured, self.chosen, self.timings = configured, None, {}
        candidates = (configured, 1) if configured > 1 else (configured,)

        def run(*args):
            count, timed = self._next(candidates)
            if count != torch.get_num_threads():
                torch.set_num_threads(count)
            if not timed:
                return step(*args)
            start = self.clock()
            result = step(*args)
            self.timings.setdefault(count, []).append(self.clock() - start)
            return result

        try:
            yield run
        finally:
            if torch.get_num_threads() != configured:
                torch.set_num_threads(configured)

    def _next(self, candidates):
        """`(thread count, whether to time this step)`."""
        if len(candidates) == 1:
            return candidates[0], False
        if self.chosen is not None and self.steps_since_choice < RECHECK_STEPS:
            self.steps_since_choice += 1
            return self.chosen, False
        counts = {count: len(self.timings.get(count, ())) for count in candidates}
        if min(counts.values()) >= 1:
            means = {count: _mean(self.timings[count]) for count in candidates}
            fastest = min(means, key=means.get)
            slowest = max(means, key=means.get)
            if min(counts.values()) >= SAMPLES or means[slowest] > PLAINLY_SLOWER * means[fastest]:
                self.chosen, self.steps_since_choice, self.timings = fastest, 1, {}
                return fastest, False
        return min(candidates, key=counts.get), True


def _mean(values):
    return sum(values) / len(values)


__all__ = ["DecodeThreads", "PLAINLY_SLOWER", "RECHECK_STEPS", "SAMPLES"]
