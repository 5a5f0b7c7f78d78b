"""The worker meets its peers on a helper thread while TensorFlow imports
(sparkdl.training.task.meet_while_tensorflow_imports)."""

from __future__ import annotations

import threading

import pytest

import sparkdl.logs
from sparkdl.training.task import meet_while_tensorflow_imports


class FakeComm:
    def __init__(self) -> None:
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()


def test_the_rendezvous_runs_while_tensorflow_imports(monkeypatch):
    importing, met = threading.Event(), threading.Event()

    def import_tensorflow() -> None:
        importing.set()
        # returns only once the rendezvous ran meanwhile: it would wait in vain were the two
        # run one after the other
        assert met.wait(10), "the rendezvous did not run while TensorFlow imported"

    comm = FakeComm()

    def rendezvous():
        assert importing.wait(10)
        assert threading.current_thread() is not threading.main_thread()
        met.set()
        return [0, 1], comm

    monkeypatch.setattr(sparkdl.logs, "quiet_tensorflow", import_tensorflow)
    assert meet_while_tensorflow_imports(rendezvous) == ([0, 1], comm)
    assert not comm.closed.is_set()


def test_a_failed_rendezvous_raises_its_own_error(monkeypatch):
    monkeypatch.setattr(sparkdl.logs, "quiet_tensorflow", lambda: None)

    def rendezvous():
        raise ValueError("rank 1 never came")

    with pytest.raises(ValueError, match="rank 1 never came"):
        meet_while_tensorflow_imports(rendezvous)


@pytest.mark.parametrize("rendezvous_ends", ["before", "after"])
def test_a_failed_import_closes_the_communicator_whenever_it_opens(monkeypatch,
                                                                    rendezvous_ends):
    comm, may_open, opened = FakeComm(), threading.Event(), threading.Event()

    def import_tensorflow() -> None:
        if rendezvous_ends == "before":
            may_open.set()
            assert opened.wait(10)
        raise ImportError("libtensorflow_framework.so.2: cannot open shared object file")

    def rendezvous():
        assert may_open.wait(10)
        opened.set()
        return None, comm

    monkeypatch.setattr(sparkdl.logs, "quiet_tensorflow", import_tensorflow)
    with pytest.raises(ImportError, match="libtensorflow_framework"):
        meet_while_tensorflow_imports(rendezvous)
    may_open.set()  # "after": the peers arrive once the import has already failed
    assert comm.closed.wait(10), "the communicator opened after the failure was left open"
