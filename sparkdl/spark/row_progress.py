"""A progress bar of the rows a Spark stage has processed, drawn on the driver.

Spark offers a client no public progress of a running stage that works on classic Spark and
Spark Connect alike, so the stage's tasks say it themselves: each opens a
:class:`~sparkdl.comm.channel.ChannelClient` to a :class:`~sparkdl.comm.channel.ChannelServer`
the driver runs for the stage (authenticated by a secret of the stage's own) and sends the rows
it has done, at most every :data:`REPORT_EVERY_S` and once at its end. A helper thread on the
driver moves a Keras ``Progbar`` (a terminal or a notebook, as ``fit``'s bar) over the stage's
known total of rows. Progress is never worth a failure: a task that cannot reach the driver
goes on without reporting, and the driver ends the bar with the stage whatever arrived.

============  =============================================
message       fields
============  =============================================
``rows``      ``done``: rows this task processed since its last message
============  =============================================
"""

from __future__ import annotations

import contextlib
import logging
import queue
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkdl.spark.driver_address import channel_hosts

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from sparkdl.comm.channel import ChannelClient
    from sparkdl.config import ClusterConfig

log = logging.getLogger("sparkdl")

#: The longest a task keeps its processed rows before telling the driver.
REPORT_EVERY_S = 0.25
#: The longest the driver waits for the tasks' last messages once the stage is over.
DRAIN_S = 1.0
#: The longest a task waits for the driver's channel: progress is not worth a long wait.
CONNECT_S = 10.0
ROWS = "rows"


@dataclass(frozen=True)
class RowReporter:
    """What a stage's task needs to report its rows (travels in the task's closure)."""

    address: str
    secret: bytes
    timeout_s: float = CONNECT_S

    @contextlib.contextmanager
    def task(self) -> Iterator[TaskRows]:
        """A task's counter; its last rows are sent and its connection closed at the end."""
        rows = TaskRows(self)
        try:
            yield rows
        finally:
            rows.close()


class TaskRows:
    """A task's processed rows, sent to the driver at most every :data:`REPORT_EVERY_S`."""

    def __init__(self, reporter: RowReporter) -> None:
        self._reporter = reporter
        self._client: ChannelClient | None = None
        self._failed = False
        self._pending = 0
        self._sent_at = 0.0

    def add(self, rows: int) -> None:
        self._pending += rows
        if time.monotonic() - self._sent_at >= REPORT_EVERY_S:
            self._send()

    def close(self) -> None:
        self._send()
        if self._client is not None:
            self._client.close()

    def _send(self) -> None:
        if self._failed or not self._pending:
            return
        from sparkdl.comm.channel import ChannelClient
        from sparkdl.errors import CommunicationError

        try:
            if self._client is None:
                self._client = ChannelClient(self._reporter.address, self._reporter.secret,
                                             timeout_s=self._reporter.timeout_s)
            self._client.send({"kind": ROWS, "done": self._pending})
        except CommunicationError as exc:  # the stage goes on without its progress
            log.warning("the stage's progress is not reported: %s", exc)
            self._failed = True
            return
        self._pending, self._sent_at = 0, time.monotonic()


class RowProgress:
    """The driver's side of a stage's progress: the reporter its tasks carry, and the rows
    they have reported so far."""

    def __init__(self, reporter: RowReporter) -> None:
        self.reporter = reporter
        self.reported = 0


@contextlib.contextmanager
def row_progress(spark: SparkSession, total: int, cluster: ClusterConfig | None = None, *,
                 show: bool = True) -> Iterator[RowProgress | None]:
    """Draw a bar of ``total`` rows while the block runs the stage whose tasks report to the
    yielded progress's :attr:`~RowProgress.reporter`; the bar ends with the block. The driver
    listens on ``cluster``'s network and ports, its tasks wait for it at most its
    ``timeout_s`` (10 s at most: progress is not worth a long wait). With ``show`` false,
    nothing: the block gets ``None``."""
    if not show:
        yield None
        return
    import keras

    from sparkdl.comm.channel import ChannelServer
    from sparkdl.comm.network import parse_port_range
    from sparkdl.config import ClusterConfig

    cluster = cluster or ClusterConfig()
    advertise, bind = channel_hosts(spark, cluster.network_mask)
    secret, stop = secrets.token_bytes(32), threading.Event()
    bar = keras.utils.Progbar(total, unit_name="row")
    with ChannelServer(secret, bind_host=bind, advertise_host=advertise,
                       port_range=parse_port_range(cluster.port_range),
                       timeout_s=cluster.timeout_s, max_blob=0) as server:
        reporter = RowReporter(server.address, secret, min(cluster.timeout_s, CONNECT_S))
        progress = RowProgress(reporter)
        drawer = threading.Thread(target=_draw, args=(server.inbox, bar, progress, total, stop),
                                  name="sparkdl-row-progress", daemon=True)
        drawer.start()
        try:
            yield progress
        except BaseException:  # a failed stage keeps its bar where it was
            stop.set()
            drawer.join(DRAIN_S)
            raise
        # the tasks' last messages may still be on their way when the stage's result is in
        drained_by = time.monotonic() + DRAIN_S
        while progress.reported < total and time.monotonic() < drained_by:
            time.sleep(0.02)
        stop.set()
        drawer.join(DRAIN_S)
    bar.update(total, finalize=True)  # every row was processed, reported or not


def _draw(inbox: queue.Queue[Any], bar: Any, progress: RowProgress, total: int,
          stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            message = inbox.get(timeout=0.1)
        except queue.Empty:
            continue
        if message.data.get("kind") == ROWS:
            progress.reported += int(message.data.get("done", 0))
            bar.update(min(total, progress.reported))
