"""timing: the one helper every measurement times its calls with, and the process's age."""

import time

import pytest
import torch

from tinyattn.system import timing
from tinyattn.system.timing import call_times, median_time, process_age


class FakeWork:
    """A call that takes `seconds` of a fake clock (timing's perf_counter reads it)."""

    def __init__(self, monkeypatch, seconds):
        self.now, self.seconds, self.calls = 0.0, list(seconds), 0
        monkeypatch.setattr(timing.time, "perf_counter", lambda: self.now)

    def __call__(self):
        self.now += self.seconds[min(self.calls, len(self.seconds) - 1)]
        self.calls += 1


def test_call_times_times_each_call_after_the_warmup_and_stops_at_the_budget(monkeypatch):
    work = FakeWork(monkeypatch, [5.0, 0.01])  # a slow first call (the warm-up), then 10 ms each
    times = call_times(work, repeats=10, warmup=1, budget_s=0.035)
    assert times == pytest.approx([0.01, 0.01, 0.01])  # a fourth would end past 0.035 s
    assert work.calls == 4
    assert call_times(work, repeats=2) == pytest.approx([0.01, 0.01])  # no budget: the repeats
    assert call_times(work, repeats=5, budget_s=0.0) == pytest.approx([0.01])  # at least one call is timed


def test_call_times_budgets_the_next_call_as_the_fastest_seen(monkeypatch):
    work = FakeWork(monkeypatch, [0.05, 0.2, 0.05])
    # After 0.25 s, one more call of the fastest kind (0.05) still fits 0.3; a slowest (0.2) would not.
    assert call_times(work, repeats=10, budget_s=0.3) == pytest.approx([0.05, 0.2, 0.05])


def test_process_age_is_the_time_since_this_process_started_not_since_the_machine_did():
    # train's time budget counts start-up with it (elapsed_before): a machine's uptime would end it at once.
    psutil = pytest.importorskip("psutil")
    since_start = time.time() - psutil.Process().create_time()
    assert process_age() == pytest.approx(since_start, abs=1.0)


@pytest.mark.parametrize("kind", ["cuda", "mps"])
def test_synchronize_waits_for_a_gpu_and_not_for_the_cpu(monkeypatch, kind):
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append("cuda"))
    monkeypatch.setattr(torch.mps, "synchronize", lambda: waited.append("mps"))
    timing.synchronize(torch.device(kind))
    timing.synchronize(torch.device("cpu"))
    assert waited == [kind]


def test_median_time_is_the_median_of_the_timed_calls(monkeypatch):
    work = FakeWork(monkeypatch, [9.0, 0.3, 0.1, 3.0])  # the 9 s warm-up is not counted
    assert median_time(work, repeats=3, warmup=1) == pytest.approx(0.3)  # the 3 s outlier moves a mean, not it


@pytest.mark.bench  # sleeps and reads the real clock
def test_process_age_counts_wall_time_since_the_process_started():
    before = process_age()
    time.sleep(0.05)
    after = process_age()
    assert before > 0 and 0.03 <= after - before < 1.0


def test_a_timed_call_on_a_device_stops_the_clock_only_once_the_device_has_finished(monkeypatch):
    work = FakeWork(monkeypatch, [0.01])  # the call returns after 10 ms: its kernels are only launched
    waited = []

    def synchronize(device):  # the device finishes the queued work 2 s later
        waited.append(device)
        work.now += 2.0

    monkeypatch.setattr(timing, "synchronize", synchronize)
    gpu = torch.device("cuda")
    assert timing.seconds_of(work, gpu) == pytest.approx(2.01)
    assert call_times(work, repeats=2, warmup=1, device=gpu) == pytest.approx([2.01, 2.01])
    assert timing.seconds_of(work) == pytest.approx(0.01) and waited == [gpu] * 4  # no device: no wait


def test_a_timed_call_counts_the_device_work_it_queued_not_the_work_queued_before_it(monkeypatch):
    """A GPU call returns once its kernels are launched; the clock must wait for them after the call.
    Waiting before it instead timed the launch alone (and charged the work queued before it)."""
    work = FakeWork(monkeypatch, [0.01])  # the launch: 10 ms of the fake clock
    queued = []

    def launch():
        work()
        queued.append(2.0)  # the device runs the kernels for 2 s after the call returns

    def synchronize(device):
        work.now += sum(queued)
        queued.clear()

    monkeypatch.setattr(timing, "synchronize", synchronize)
    assert timing.seconds_of(launch, torch.device("cuda")) == pytest.approx(2.01)
