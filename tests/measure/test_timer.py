import time

import numpy as np
import pytest
import torch

from diagnostics.measure.timer import latency_stats, method, time_calls, time_once, timed


def test_perf_counter_times_a_known_sleep():
    samples = time_calls(lambda: time.sleep(0.004), torch.device("cpu"), 5, 1)
    assert len(samples) == 5
    assert all(4.0 <= s < 40.0 for s in samples)  # at least the sleep; generous on a busy machine
    assert 4.0 <= time_once(lambda: time.sleep(0.004), "cpu") < 40.0


def test_timed_keeps_what_a_first_call_returned():
    ms, out = timed(lambda: (time.sleep(0.004), "output")[1], "cpu")
    assert out == "output" and ms >= 4.0  # at least the sleep (no upper bound: the machine may be busy)


def test_time_calls_runs_warmup_untimed_then_the_timed_calls():
    calls = []
    samples = time_calls(lambda: calls.append(1), "cpu", 7, 3)
    assert len(calls) == 10 and len(samples) == 7


def test_latency_stats_are_numpy_statistics():
    s = [3.0, 1.0, 2.0, 10.0, 4.0]
    st = latency_stats(s, batch_size=8)
    a = np.array(s)
    assert st["median_ms"] == 3.0 and st["p90_ms"] == pytest.approx(np.percentile(a, 90))
    assert st["std_ms"] == pytest.approx(a.std()) and st["cv"] == pytest.approx(a.std() / a.mean())
    assert st["samples_per_s"] == pytest.approx(8 / 0.003) and st["iterations"] == 5
    assert (st["min_ms"], st["max_ms"]) == (1.0, 10.0)


def test_method_names_the_clock():
    assert method("cpu") == "time.perf_counter" and method(torch.device("cuda", 0)) == "CUDA events"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_events_time_device_work():
    x = torch.randn(2048, 2048, device="cuda")
    ms = time_once(lambda: x @ x, "cuda")
    assert ms > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_events_count_the_hosts_work_in_a_first_call():
    # a first call that compiles spends its time on the host: the figure holds it (CUDA events)
    x = torch.randn(256, 256, device="cuda")
    ms, out = timed(lambda: (time.sleep(0.05), x @ x)[1], "cuda")
    assert ms >= 50.0 and out.shape == (256, 256)
