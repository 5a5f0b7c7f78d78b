"""The worker meets its peers while TensorFlow imports on a helper thread
(sparkdl.training.worker.task.meet_while_tensorflow_imports), through the helper the driver's Spark
start-up uses too (sparkdl.logs.started_while_tensorflow_imports)."""

from __future__ import annotations

import sys
import threading

import pytest

import sparkdl.logs
from sparkdl.training.worker.task import meet_while_tensorflow_imports


class FakeComm:
    def __init__(self) -> None:
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()


@pytest.fixture
def tensorflow_not_loaded(monkeypatch):
    """As in a fresh worker: TensorFlow not imported yet (restored afterwards)."""
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    return monkeypatch


def test_the_rendezvous_runs_while_tensorflow_imports(tensorflow_not_loaded):
    importing, met = threading.Event(), threading.Event()
    caller = threading.current_thread()

    def import_tensorflow() -> None:
        assert threading.current_thread() is not caller
        importing.set()
        # returns only once the rendezvous ran meanwhile: it would wait in vain were the two
        # run one after the other
        assert met.wait(10), "the rendezvous did not run while TensorFlow imported"

    comm = FakeComm()

    def rendezvous():
        assert importing.wait(10)
        met.set()
        return [0, 1], comm

    tensorflow_not_loaded.setattr(sparkdl.logs, "quiet_tensorflow", import_tensorflow)
    assert meet_while_tensorflow_imports(rendezvous) == ([0, 1], comm)
    assert not comm.closed.is_set()


def test_a_failed_rendezvous_raises_its_own_error(tensorflow_not_loaded):
    def import_tensorflow() -> None:
        raise ImportError("not this one")

    def rendezvous():
        raise ValueError("rank 1 never came")

    tensorflow_not_loaded.setattr(sparkdl.logs, "quiet_tensorflow", import_tensorflow)
    with pytest.raises(ValueError, match="rank 1 never came"):
        meet_while_tensorflow_imports(rendezvous)


@pytest.mark.parametrize("import_fails", ["before the peers meet", "after they met"])
def test_a_failed_import_closes_the_communicator(tensorflow_not_loaded, import_fails):
    comm, failed, opened = FakeComm(), threading.Event(), threading.Event()

    def import_tensorflow() -> None:
        if import_fails == "after they met":
            assert opened.wait(10)
        failed.set()
        raise ImportError("libtensorflow_framework.so.2: cannot open shared object file")

    def rendezvous():
        if import_fails == "before the peers meet":
            assert failed.wait(10)
        opened.set()
        return None, comm

    tensorflow_not_loaded.setattr(sparkdl.logs, "quiet_tensorflow", import_tensorflow)
    with pytest.raises(ImportError, match="libtensorflow_framework"):
        meet_while_tensorflow_imports(rendezvous)
    assert comm.closed.is_set(), "the communicator was left open"


def test_with_tensorflow_loaded_the_rendezvous_alone_runs(monkeypatch):
    import tensorflow  # noqa: F401  (a reused Python worker: loaded by an earlier task)

    def import_tensorflow() -> None:
        raise AssertionError("TensorFlow imported a second time")

    comm = FakeComm()
    monkeypatch.setattr(sparkdl.logs, "quiet_tensorflow", import_tensorflow)
    assert meet_while_tensorflow_imports(lambda: (None, comm)) == (None, comm)


def test_the_start_gets_the_real_stderr_and_is_stopped_when_the_import_fails(
        tensorflow_not_loaded):
    """As the driver starts Spark: the JVM's stderr must be the real descriptor 2, not the
    import's capture; a session started before the import failed is stopped."""
    seen: list[int | None] = []
    stopped: list[str] = []

    def import_tensorflow() -> None:
        raise ImportError("no TensorFlow here")

    def start(stderr: int | None) -> str:
        seen.append(stderr)
        return "session"

    tensorflow_not_loaded.setattr(sparkdl.logs, "quiet_tensorflow", import_tensorflow)
    with pytest.raises(ImportError, match="no TensorFlow here"):
        sparkdl.logs.started_while_tensorflow_imports(start, stopped.append)
    assert stopped == ["session"]
    [stderr] = seen
    if stderr is not None:  # None where stderr has no descriptor
        assert stderr != 2
