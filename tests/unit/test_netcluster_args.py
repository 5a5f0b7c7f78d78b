"""benchmarks.netcluster: argument checks and the error where privileges are missing
(the cluster itself is exercised in tests/cluster)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.netcluster import NetCluster, NetClusterError, host_cpus, rate_bits_per_s

REPO = Path(__file__).resolve().parents[2]


def test_rates():
    assert rate_bits_per_s("100mbit") == 1e8
    assert rate_bits_per_s("1gbit") == 1e9
    assert rate_bits_per_s("12.5mbps") == 1e8
    assert rate_bits_per_s(None) is None and rate_bits_per_s("none") is None
    with pytest.raises(NetClusterError, match=r"rate: expected a tc rate like '100mbit'.*'fast'"):
        rate_bits_per_s("fast")


def test_each_host_gets_an_equal_share_of_the_cores_when_there_are_enough():
    assert host_cpus([0, 1], 2) == [[0], [1]]
    assert host_cpus([3, 1, 2, 0, 4], 2) == [[0, 1], [2, 3]]  # the remainder unused
    assert host_cpus([0, 1], 3) == [None, None, None]  # fewer cores than hosts: all share
    hosts = NetCluster(2, 2, own_cores=False).hosts
    assert [h.cpus for h in hosts] == [None, None]


def test_bad_arguments():
    with pytest.raises(NetClusterError, match=r"hosts: expected 1\.\.200, got 0"):
        NetCluster(hosts=0)
    with pytest.raises(NetClusterError, match="name: expected"):
        NetCluster(name="Bad-Name")
    with pytest.raises(NetClusterError, match="subnet: expected three octets"):
        NetCluster(subnet="10.77")


def _harness_up_as(tmp_path: Path, setpriv_args: list[str]) -> subprocess.CompletedProcess:
    """``NetCluster(...).up()`` in a child started through ``setpriv`` with these arguments."""
    code = (
        "from benchmarks.netcluster import NetCluster\n"
        f"NetCluster(hosts=1, state_dir={str(tmp_path / 'state')!r}).up()\n"
    )
    return subprocess.run(
        ["setpriv", *setpriv_args, sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(REPO)}, cwd="/", capture_output=True, text=True,
        timeout=120, check=False,
    )


NEEDS_ROOT = "NetClusterError: the cluster harness needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)"
ROOT_AND_SETPRIV = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to start a child without privileges",
)


@ROOT_AND_SETPRIV
def test_a_process_without_the_capabilities_gets_one_clear_error(tmp_path):
    """uid 0 with every capability dropped: it still reads the checkout and the venv wherever
    they lie (it owns them), so this runs from any directory."""
    proc = _harness_up_as(tmp_path, ["--inh-caps=-all", "--ambient-caps=-all",
                                     "--bounding-set=-all"])
    assert proc.returncode != 0
    assert NEEDS_ROOT in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "state").exists()  # refused before anything was created


@ROOT_AND_SETPRIV
def test_an_unprivileged_user_gets_one_clear_error(tmp_path):
    unprivileged = ["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"]
    probe = subprocess.run(
        ["setpriv", *unprivileged, sys.executable, "-c", "import benchmarks.netcluster"],
        env={**os.environ, "PYTHONPATH": str(REPO)}, cwd="/", capture_output=True, text=True,
        timeout=120, check=False,
    )
    if probe.returncode != 0:  # e.g. the checkout or the venv in a 0700 directory
        pytest.skip(f"user 65534 cannot import sparkdl from {REPO} with {sys.executable}: "
                    f"{probe.stderr.strip().splitlines()[-1:]}")
    proc = _harness_up_as(tmp_path, unprivileged)
    assert proc.returncode != 0
    assert NEEDS_ROOT in proc.stderr, proc.stderr[-2000:]
