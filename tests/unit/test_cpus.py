"""sparkdl.cpus: which cores each worker gets, and pinning every thread of a process."""

from __future__ import annotations

import os
import threading

import pytest

from sparkdl.cpus import check_mode, current_cpus, local_group, pinned, plan_cores, sharing_key
from sparkdl.errors import ConfigurationError


def test_auto_pins_only_workers_that_fill_their_cores_exactly():
    cpus = [0, 1, 2, 3]
    assert [plan_cores(cpus, r, 4, 1) for r in range(4)] == [[0], [1], [2], [3]]
    assert [plan_cores(cpus, r, 2, 2) for r in range(2)] == [[0, 1], [2, 3]]
    assert plan_cores(cpus, 0, 2, 1) is None  # half the cores idle: another job may use them
    assert plan_cores(cpus, 0, 5, 1) is None  # more workers than cores: nothing to give each


def test_on_pins_whenever_the_workers_fit_and_off_never():
    cpus = [2, 5, 7, 9]  # a cpuset: the slices follow its own cores, ascending
    assert [plan_cores(cpus, r, 2, 1, "on") for r in range(2)] == [[2], [5]]
    assert plan_cores(list(reversed(cpus)), 1, 2, 2, "on") == [7, 9]
    assert plan_cores(cpus, 0, 5, 1, "on") is None
    assert plan_cores(cpus, 0, 4, 1, "off") is None


def test_a_pin_that_changes_nothing_is_no_pin():
    assert plan_cores([0, 1], 0, 1, 2) is None  # the one worker already has all the cores
    assert plan_cores([3], 0, 1, 1, "on") is None
    assert plan_cores([], 0, 1, 1, "on") is None


def test_a_bad_mode_is_one_clear_error():
    with pytest.raises(ConfigurationError, match=r"cpu_affinity.*'sometimes'"):
        check_mode("sometimes")
    with pytest.raises(ConfigurationError, match="cpu_affinity"):
        plan_cores([0, 1], 0, 2, 1, "yes")


def test_local_group_is_the_ranks_on_the_same_host_that_see_the_same_cores():
    keys = [sharing_key("10.0.0.1", [0, 1]), sharing_key("10.0.0.2", [0, 1]),
            sharing_key("10.0.0.1", [1, 0]), sharing_key("10.0.0.1", [2, 3])]
    assert local_group(keys, 0) == (0, 2)
    assert local_group(keys, 2) == (1, 2)  # the same cores, listed in another order
    assert local_group(keys, 1) == (0, 1)  # another host
    assert local_group(keys, 3) == (0, 1)  # the same host, its own cpuset


def _mask(tid: int) -> set[int]:
    return os.sched_getaffinity(tid)


@pytest.mark.skipif(len(current_cpus()) < 2, reason="needs two cores to pin to one")
def test_pinned_moves_every_thread_and_restores_their_cores_after():
    before = set(current_cpus())
    started, release = threading.Event(), threading.Event()
    tids: list[int] = []

    def worker() -> None:
        tids.append(threading.get_native_id())
        started.set()
        release.wait(30)

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    assert started.wait(30)
    target = [min(before)]
    try:
        with pinned(target) as cores:
            assert cores == target
            assert _mask(0) == set(target)  # this thread
            assert _mask(tids[0]) == set(target)  # a thread started before the pin
            inner: list[set[int]] = []
            late = threading.Thread(target=lambda: inner.append(_mask(0)))
            late.start()
            late.join(30)
            assert inner == [set(target)]  # a thread started inside inherits it
        assert _mask(0) == before
        assert _mask(tids[0]) == before
    finally:
        release.set()
        thread.join(30)


def test_pinned_none_changes_nothing():
    before = current_cpus()
    with pinned(None) as cores:
        assert cores is None
        assert current_cpus() == before
