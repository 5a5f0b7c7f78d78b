"""A task whose driver cannot be reached goes on without reporting its progress."""

from __future__ import annotations

import logging
import socket

from sparkdl.spark.row_progress import RowReporter


def test_a_task_that_cannot_reach_the_driver_goes_on_and_says_so_once(caplog):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    reporter = RowReporter(f"127.0.0.1:{port}", b"s" * 32, timeout_s=1.0)
    with caplog.at_level(logging.WARNING, logger="sparkdl"), reporter.task() as rows:
        for _ in range(5):
            rows.add(10)
    warnings = [r.getMessage() for r in caplog.records if "progress" in r.getMessage()]
    assert len(warnings) == 1 and f"127.0.0.1:{port}" in warnings[0], warnings
