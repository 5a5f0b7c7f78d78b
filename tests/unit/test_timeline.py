"""The timeline recorder: well-formed Chrome traces, nesting, collectives' bytes, the cap."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from _comm_harness import SECRET, run_ranks, values
from _run_dir import write_run_dir

from sparkdl.errors import ConfigurationError
from sparkdl.training.worker import timeline
from sparkdl.training.worker.timeline import Timeline, TracedCommunicator, recording


def _complete(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def _inside(inner: dict, outer: dict) -> bool:
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]


def test_spans_are_complete_events_that_nest_and_load_as_json(tmp_path: Path) -> None:
    recorder = Timeline(3)
    with recording(recorder), timeline.span("step", step=7):
        with timeline.span("compute"):
            time.sleep(0.002)
        start = time.perf_counter()
        time.sleep(0.001)
        timeline.record("encode", start, time.perf_counter(), {"bytes": 12})
    uri = recorder.write(str(tmp_path / "trace"))
    assert uri == f"{tmp_path}/trace/rank-3.json"
    assert sorted(p.name for p in (tmp_path / "trace").iterdir()) == ["rank-3.json"]
    trace = json.loads(Path(uri).read_text())
    events = {e["name"]: e for e in _complete(trace)}
    assert list(events) == ["compute", "encode", "step"]  # recorded as each ends
    for event in events.values():
        assert event["ph"] == "X" and event["pid"] == 3
        assert isinstance(event["ts"], int) and isinstance(event["dur"], int)
    assert events["compute"]["dur"] >= 2000
    assert _inside(events["compute"], events["step"]) and _inside(events["encode"], events["step"])
    assert events["compute"]["ts"] + events["compute"]["dur"] <= events["encode"]["ts"]
    assert events["step"]["args"] == {"step": 7} and events["encode"]["args"] == {"bytes": 12}
    names = {(e["name"], e["args"]["name"], e.get("tid")) for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] in ("process_name", "thread_name")}
    tid = events["step"]["tid"]
    assert names == {("process_name", "rank 3", None), ("thread_name", "main", tid)}
    assert trace["otherData"]["dropped"] == 0


def test_stopwatch_laps_are_adjacent_spans_named_without_the_suffix() -> None:
    from sparkdl.training.exchanges.exchange import Stopwatch

    recorder = Timeline(0)
    with recording(recorder):
        watch = Stopwatch()
        watch.lap("compute_s")
        watch.lap("encode_s")
    compute, encode = recorder.events
    assert (compute["name"], encode["name"]) == ("compute", "encode")
    assert compute["ts"] + compute["dur"] == encode["ts"]  # whole µs: they nest exactly
    assert set(watch.timings) == {"compute_s", "encode_s"}


def test_nothing_is_recorded_without_an_active_timeline() -> None:
    recorder = Timeline(0)
    with recording(recorder):
        pass
    assert timeline.active() is None
    with timeline.span("ignored") as args:
        args["bytes"] = 1
    timeline.record("ignored", 0.0, 1.0)
    assert recorder.events == []


def test_the_cap_keeps_the_first_events_and_counts_the_rest(tmp_path: Path) -> None:
    recorder = Timeline(1, max_events=3)
    with recording(recorder):
        for i in range(5):
            with timeline.span("step", step=i):
                pass
    trace = json.loads(Path(recorder.write(str(tmp_path))).read_text())
    assert [e["args"]["step"] for e in _complete(trace)] == [0, 1, 2]
    assert trace["otherData"] == {"rank": 1, "max_events": 3, "dropped": 2}
    with pytest.raises(ValueError, match="max_events"):
        Timeline(0, max_events=-1)


def test_spans_of_another_thread_carry_its_name(tmp_path: Path) -> None:
    recorder = Timeline(0)
    with recording(recorder):
        def job() -> None:
            with timeline.span("overlapped exchange"):
                pass

        for _ in range(2):  # two threads of one name (an idle InFlightExchange worker is replaced)
            worker = threading.Thread(target=job, name="sparkdl-overlap")
            worker.start()
            worker.join(10)
        with timeline.span("step"):
            pass
    trace = recorder.trace()
    threads = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
               if e["name"] == "thread_name"}
    rows = [(e["name"], threads[e["tid"]]) for e in _complete(trace)]
    assert rows == [("overlapped exchange", "sparkdl-overlap")] * 2 + [("step", "main")]
    assert len(threads) == 2  # the two jobs' threads share one row


def test_timeline_is_written_to_any_filesystem() -> None:
    pytest.importorskip("fsspec")
    import fsspec

    recorder = Timeline(2)
    with recording(recorder), timeline.span("step"):
        pass
    uri = recorder.write("memory://sparkdl-timeline-test/run")
    assert uri == "memory://sparkdl-timeline-test/run/rank-2.json"
    with fsspec.open(uri, "rb") as stream:
        assert [e["name"] for e in _complete(json.load(stream))] == ["step"]


def _traced_collectives(rank: int, world: int, exchange) -> list[dict]:
    import numpy as np

    from sparkdl.comm import create_communicator

    inner = create_communicator("tcp", rank, world, exchange, secret=SECRET, timeout_s=15)
    recorder = Timeline(rank)
    with TracedCommunicator(inner) as comm, recording(recorder):
        assert (comm.rank, comm.world_size, comm.counters) == (rank, world, inner.counters)
        assert comm.shared_memory == inner.shared_memory  # other attributes: the inner's
        comm.allgather(b"x" * (1000 * (rank + 1)))
        comm.allreduce(np.ones(256, np.float32), "mean")
        comm.broadcast_array(np.arange(10, dtype=np.float64))
        into = np.arange(6, dtype=np.float32) * (rank == 0)
        assert comm.broadcast_into(into, 0) is into and into.tolist() == list(range(6))
        comm.barrier()
    return recorder.events


def test_collectives_record_their_message_and_the_bytes_they_moved() -> None:
    ranks = values(run_ranks(_traced_collectives, 2))
    for rank, events in enumerate(ranks):
        assert [e["name"] for e in events] == ["allgather", "allreduce", "broadcast",
                                               "broadcast", "barrier"]
        gather, reduce, broadcast, into, _ = (e["args"] for e in events)
        assert all(e["cat"] == "comm" for e in events)
        assert gather["message_bytes"] == 1000 * (rank + 1)
        assert gather["bytes_sent"] >= 1000 * (rank + 1)  # at least its own message
        assert gather["bytes_received"] >= 1000 * (2 - rank)  # at least the other's
        assert reduce["message_bytes"] == 1024 and reduce["op"] == "mean"
        assert reduce["bytes_sent"] > 0 and reduce["bytes_received"] > 0
        assert broadcast["message_bytes"] == (80 if rank == 0 else 0)
        assert broadcast["root"] == 0
        assert into["message_bytes"] == 24 and into["root"] == 0  # the array's, every rank
        assert into["bytes_sent" if rank == 0 else "bytes_received"] >= 24


def test_fit_options_and_config_reject_a_bad_timeline() -> None:
    from sparkdl.config import load_config
    from sparkdl.fit_options import FitOptions

    with pytest.raises(ConfigurationError, match="timeline must be a directory URI"):
        FitOptions(timeline=5).check()  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="timeline"):
        FitOptions(timeline=" ").check()
    with pytest.raises(ConfigurationError, match=r"training\.timeline"):
        load_config(data={"training": {"timeline": ""}})
    config = load_config(None, overrides=["training.timeline=runs/trace"])
    assert config.training.timeline == "runs/trace"


def test_report_links_the_timeline_files(tmp_path: Path) -> None:
    from sparkdl.report import build_report

    metrics = write_run_dir(tmp_path)
    assert "Timeline" not in build_report(tmp_path)
    metrics["timeline"] = [f"{tmp_path}/trace/rank-0.json", "s3://bucket/trace/rank-1.json"]
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    page = build_report(tmp_path)
    assert f'<a href="file://{tmp_path}/trace/rank-0.json">rank-0.json</a>' in page
    assert '<a href="s3://bucket/trace/rank-1.json">rank-1.json</a>' in page
    assert "ui.perfetto.dev" in page


def _synthetic(tmp_path: Path) -> list[str]:
    """Two ranks, two epochs of two steps: data wait 1 ms, compute 5 ms, allgather 2 ms,
    then 0.5 ms of Python time before the step ends (times in seconds)."""
    uris = []
    for rank in (0, 1):
        recorder = Timeline(rank)
        t = 100.0
        for epoch in range(2):
            epoch_start = t
            for step in range(2):
                start = t
                recorder.add("data wait", t, t + 0.001)
                recorder.add("compute", t + 0.001, t + 0.006)
                recorder.add("allgather", t + 0.006, t + 0.008, {"bytes_sent": 4096})
                t += 0.0085
                recorder.add("step", start, t, {"epoch": epoch, "step": step,
                                                 "global_step": 2 * epoch + step})
            recorder.add("epoch", epoch_start, t, {"epoch": epoch})
        uris.append(recorder.write(str(tmp_path / "trace")))
    return uris


def test_timeline_png_draws_a_step_and_the_summary_has_medians_and_self_times(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.cli import main
    from benchmarks.timeline import load, summarize

    uris = _synthetic(tmp_path)
    out = tmp_path / "step.png"
    assert main(["timeline-png", *uris, str(out), "--step", "3"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "allgather" in capsys.readouterr().out
    summary = summarize(load(uris)[0])  # the first epoch is left out
    assert summary["step"]["count"] == 4 and summary["compute"]["count"] == 4
    assert summary["compute"]["median_us"] == 5000
    assert summary["step"]["median_us"] == 8500
    assert summary["step"]["median_self_us"] == 500  # the Python time after the allgather
    with pytest.raises(ValueError, match="no step 9"):
        main(["timeline-png", *uris, str(out), "--step", "9"])
