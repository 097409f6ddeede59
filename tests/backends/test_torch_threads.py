"""The CPU decode loop's thread count: both counts timed in turns, the faster kept, torch's
own count restored after every loop, and timed again after `RECHECK_STEPS` steps. A fake
clock gives each count its step time, so the choice is known."""

import pytest

from tests.conftest import current_backend

pytestmark = pytest.mark.skipif(current_backend() != "torch", reason="PyTorch's CPU threads")


@pytest.fixture
def two_threads():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


class FakeSteps:
    """A step whose duration on the fake clock depends on torch's thread count then."""

    def __init__(self, seconds_by_threads):
        self.seconds_by_threads = seconds_by_threads
        self.now = 0.0
        self.threads_seen = []

    def clock(self):
        return self.now

    def step(self, value):
        import torch

        threads = torch.get_num_threads()
        self.threads_seen.append(threads)
        self.now += self.seconds_by_threads[threads]
        return value + 1


def _loop(threads, fake, count):
    with threads.steps(fake.step) as run:
        return [run(i) for i in range(count)]


@pytest.mark.parametrize(("seconds", "chosen"), [({1: 1.0, 2: 1.5}, 1), ({1: 1.5, 2: 1.0}, 2)])
def test_the_faster_count_is_kept_and_torchs_own_restored(two_threads, seconds, chosen):
    import torch

    from keras_mha.backends.torch.threads import SAMPLES, DecodeThreads

    fake = FakeSteps(seconds)
    threads = DecodeThreads(clock=fake.clock)
    assert _loop(threads, fake, 10) == list(range(1, 11))
    assert threads.chosen == chosen
    # Timed in turns, SAMPLES each (neither is twice the other), then the choice only.
    assert sorted(fake.threads_seen[: 2 * SAMPLES]) == [1] * SAMPLES + [2] * SAMPLES
    assert set(fake.threads_seen[2 * SAMPLES :]) == {chosen}
    assert torch.get_num_threads() == 2


def test_a_plainly_slower_count_is_dropped_at_once_and_timed_again_later(two_threads, monkeypatch):
    from keras_mha.backends.torch import threads as module

    monkeypatch.setattr(module, "RECHECK_STEPS", 4)
    fake = FakeSteps({1: 1.0, 2: 10.0})
    threads = module.DecodeThreads(clock=fake.clock)
    _loop(threads, fake, 3)
    assert fake.threads_seen == [2, 1, 1] and threads.chosen == 1
    # The choice holds across loops; after RECHECK_STEPS steps both are timed again.
    fake.seconds_by_threads = {1: 10.0, 2: 1.0}
    _loop(threads, fake, 6)
    assert fake.threads_seen[3:] == [1, 1, 1, 2, 1, 2] and threads.chosen == 2


def test_one_configured_thread_is_left_alone():
    import torch

    from keras_mha.backends.torch.threads import DecodeThreads

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fake = FakeSteps({1: 1.0})
        threads = DecodeThreads(clock=fake.clock)
        _loop(threads, fake, 4)
        assert fake.threads_seen == [1] * 4 and threads.chosen is None and not threads.timings
    finally:
        torch.set_num_threads(before)
