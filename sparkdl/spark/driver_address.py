"""Where a channel the driver listens on for a stage's tasks binds, and what the tasks dial."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from sparkdl import session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def channel_hosts(spark: SparkSession, network_mask: str | None) -> tuple[str, str]:
    """``(advertise, bind)``: the address executors reach the driver at and the one it listens
    on. Loopback on local masters (the executors share the driver's machine); else the
    driver's address inside ``network_mask`` (``cluster.network_mask``, ``$SPARKDL_IP``), on
    every interface. On Spark Connect the channel listens in this client process, not in the
    server's driver."""
    if session.is_local(spark):
        return "127.0.0.1", "127.0.0.1"
    from sparkdl.comm.network import select_bind_address

    driver = (socket.gethostname() if session.is_connect(spark)
              else session.conf_get(spark, "spark.driver.host") or socket.gethostname())
    return select_bind_address(network_mask, driver), "0.0.0.0"
