"""sparkdl.testing.netcluster: argument checks and the error where privileges are missing
(the cluster itself is exercised in tests/cluster)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparkdl.testing.netcluster import NetCluster, NetClusterError, rate_bits_per_s

REPO = Path(__file__).resolve().parents[2]


def test_rates():
    assert rate_bits_per_s("100mbit") == 1e8
    assert rate_bits_per_s("1gbit") == 1e9
    assert rate_bits_per_s("12.5mbps") == 1e8
    assert rate_bits_per_s(None) is None and rate_bits_per_s("none") is None
    with pytest.raises(NetClusterError, match=r"rate: expected a tc rate like '100mbit'.*'fast'"):
        rate_bits_per_s("fast")


def test_bad_arguments():
    with pytest.raises(NetClusterError, match=r"hosts: expected 1\.\.200, got 0"):
        NetCluster(hosts=0)
    with pytest.raises(NetClusterError, match="name: expected"):
        NetCluster(name="Bad-Name")
    with pytest.raises(NetClusterError, match="subnet: expected three octets"):
        NetCluster(subnet="10.77")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root to drop to an unprivileged user")
def test_unprivileged_user_gets_one_clear_error(tmp_path):
    code = (
        "from sparkdl.testing.netcluster import NetCluster\n"
        f"NetCluster(hosts=1, state_dir={str(tmp_path / 'state')!r}).up()\n"
    )
    proc = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
         sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(REPO)}, cwd="/", capture_output=True, text=True,
        timeout=120, check=False,
    )
    assert proc.returncode != 0
    assert "NetClusterError: the cluster harness needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)" in (
        proc.stderr
    ), proc.stderr[-2000:]
