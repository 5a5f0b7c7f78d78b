"""One multi-host harness (benchmarks.netcluster) for every cluster test: 2 hosts x 3 cores,
2 fake GPUs a host, 100 Mbit/s links, brought up once for the session (a cluster start is
tens of seconds on a slow machine) and down at its end. Needs root (network namespaces): a
test that asks for it is skipped elsewhere.

The tests share it in file order: the elastic fits remove a host and restore it; the
pipelines ask for the GPUs; the scaling benchmark attaches to it (``--cluster``) and sets
the rate back as it found it; ``test_down_leaves_nothing`` brings it down and runs last."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from benchmarks.netcluster import NetCluster, NetClusterError, check_privileges

HOSTS, CORES, GPUS, RATE = 2, 3, 2, "100mbit"
LAST = "test_down_leaves_nothing"

try:
    check_privileges()
    NETCLUSTER_SKIP: str | None = None
except NetClusterError as exc:
    NETCLUSTER_SKIP = str(exc)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetCluster]:
    """The running cluster, its state in a fresh directory; its own name and subnet, so a
    cluster someone started with the CLI is left alone."""
    if NETCLUSTER_SKIP:
        pytest.skip(NETCLUSTER_SKIP)
    shared = NetCluster(HOSTS, CORES, rate=RATE, gpus_per_host=GPUS,
                        state_dir=tmp_path_factory.mktemp("netcluster"), name="sdlt",
                        subnet="10.77.9")
    try:  # brought down even when up() fails half-way
        yield shared.up()
    finally:
        shared.down()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Bringing the shared cluster down is checked after every other test has used it."""
    last = [item for item in items if item.name == LAST]
    items[:] = [item for item in items if item.name != LAST] + last
