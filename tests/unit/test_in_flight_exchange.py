"""InFlightExchange: one persistent worker thread, bounded waits, errors handed back."""

from __future__ import annotations

import threading

import pytest

from sparkdl.errors import CommunicationError
from sparkdl.training.exchanges.overlap import InFlightExchange


def test_every_job_runs_on_one_persistent_daemon_thread():
    runner = InFlightExchange(timeout_s=10)
    seen = []
    for i in range(5):
        runner.submit(lambda i=i: (i, threading.current_thread()))
        assert runner.in_flight
        value, thread = runner.wait()
        assert value == i and not runner.in_flight
        seen.append(thread)
    assert len(set(seen)) == 1
    assert seen[0].daemon and seen[0].name == "sparkdl-overlap"
    assert seen[0] is not threading.current_thread()
    runner.close()
    seen[0].join(10)
    assert not seen[0].is_alive()


def test_a_jobs_error_is_raised_on_the_waiting_thread_and_the_worker_goes_on():
    runner = InFlightExchange(timeout_s=10)

    def fail():
        raise CommunicationError("peer closed the connection")

    runner.submit(fail)
    with pytest.raises(CommunicationError, match="peer closed"):
        runner.wait()
    runner.submit(lambda: 7)
    assert runner.wait() == 7
    runner.close()


def test_one_job_at_a_time_and_nothing_in_flight_waits_for_nothing():
    runner = InFlightExchange(timeout_s=10)
    assert runner.wait() is None
    release = threading.Event()
    runner.submit(lambda: release.wait(10))
    with pytest.raises(RuntimeError, match="already in flight"):
        runner.submit(lambda: None)
    release.set()
    assert runner.wait() is True
    runner.close()
    with pytest.raises(RuntimeError, match="closed"):
        runner.submit(lambda: None)


def test_a_job_past_the_bound_raises_and_leaves_the_runner_broken():
    runner = InFlightExchange(timeout_s=0.2)
    release = threading.Event()
    runner.submit(lambda: release.wait(10))
    with pytest.raises(CommunicationError, match=r"did not finish within 0\.2 s"):
        runner.wait()
    with pytest.raises(CommunicationError, match="did not finish"):
        runner.submit(lambda: None)
    release.set()
    runner.close()


def test_an_idle_worker_exits_and_the_next_job_starts_a_new_one():
    runner = InFlightExchange(timeout_s=10, idle_s=0.05)
    runner.submit(threading.current_thread)
    first = runner.wait()
    first.join(10)  # idle past idle_s: it exits by itself
    assert not first.is_alive()
    runner.submit(threading.current_thread)
    second = runner.wait()
    assert second is not first and second.is_alive()
    runner.close()
    second.join(10)
    assert not second.is_alive()


def test_close_lets_the_job_in_flight_finish_and_stops_the_worker():
    runner = InFlightExchange(timeout_s=10)
    done = threading.Event()
    runner.submit(threading.current_thread)
    worker = runner.wait()
    runner.submit(done.set)
    runner.close()
    runner.close()  # idempotent
    assert done.is_set() and not worker.is_alive()


def test_each_job_is_a_span_of_the_worker_thread_with_its_cpu_time():
    from benchmarks.timeline import summarize
    from sparkdl.training.worker.timeline import Timeline, recording

    recorder = Timeline(0)
    runner = InFlightExchange(timeout_s=10)
    with recording(recorder):
        for _ in range(3):
            runner.submit(lambda: None)
            runner.wait()
    runner.close()
    spans = [e for e in recorder.trace()["traceEvents"] if e.get("ph") == "X"]
    assert [e["name"] for e in spans] == ["overlapped exchange"] * 3
    assert all(isinstance(e["args"]["cpu_us"], int) and e["args"]["cpu_us"] >= 0 for e in spans)
    assert len({e["tid"] for e in spans}) == 1
    assert summarize(spans)["overlapped exchange"]["count"] == 3
    assert "median_cpu_us" in summarize(spans)["overlapped exchange"]
