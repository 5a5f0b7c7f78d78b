"""The multi-host harness (benchmarks.netcluster) as one fixture factory for the cluster
tests. Needs root (network namespaces): a test that asks for a cluster is skipped elsewhere."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from benchmarks.netcluster import NetCluster, NetClusterError, check_privileges

try:
    check_privileges()
    NETCLUSTER_SKIP: str | None = None
except NetClusterError as exc:
    NETCLUSTER_SKIP = str(exc)


@pytest.fixture(scope="module")
def netcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., NetCluster]]:
    """``netcluster(hosts, cores_per_host, name=..., subnet=..., **options)``: a running
    :class:`NetCluster` (options as its constructor's: ``rate``, ``gpus_per_host``) with its
    state in a fresh directory, brought down at the end of the module. Each module passes its
    own ``name`` and ``subnet``, so a cluster someone started with the CLI is left alone."""
    clusters: list[NetCluster] = []

    def make(hosts: int, cores_per_host: int, *, name: str, subnet: str,
             **options: Any) -> NetCluster:
        if NETCLUSTER_SKIP:
            pytest.skip(NETCLUSTER_SKIP)
        state = tmp_path_factory.mktemp(f"netcluster-{name}")
        cluster = NetCluster(hosts, cores_per_host, state_dir=state, name=name, subnet=subnet,
                             **options)
        clusters.append(cluster)  # brought down even when up() fails half-way
        return cluster.up()

    try:
        yield make
    finally:
        for cluster in reversed(clusters):
            cluster.down()
