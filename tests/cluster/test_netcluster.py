"""A real multi-host Spark standalone cluster on one machine (benchmarks.netcluster):
the harness itself, and the digits pipeline through spark-submit on 2 hosts x 2 workers
(sharing with PowerSGD, and dense) with GPU scheduling on fake GPUs. Needs root (network
namespaces); skipped elsewhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from _submit_env import submit_env

from benchmarks.netcluster import NetCluster, spark_submit

REPO = Path(__file__).resolve().parents[2]
CONF = str(REPO / "conf" / "digits.yaml")
HOSTS, GPUS = 2, 2  # as the shared cluster (tests/cluster/conftest.py)

pytestmark = pytest.mark.slow


def submit(cluster: NetCluster, script: str, args: list[str], tmp_path: Path,
           extra_conf: dict[str, str] | None = None, gpus_per_task: float = 0,
           timeout: float = 300) -> subprocess.CompletedProcess:
    """spark-submit to the harness exactly as docs/deployment.md shows."""
    conf = {"spark.executorEnv.PYTHONPATH": str(REPO), **(extra_conf or {})}
    command = [spark_submit(), "--master", cluster.master_url,
               *cluster.submit_args(gpus_per_task=gpus_per_task)]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    return subprocess.run([*command, script, *args], cwd=REPO, env=submit_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_harness_hosts_links_and_shm(cluster):
    ips = [h.ip for h in cluster.hosts]
    assert len(set(ips)) == HOSTS
    status = cluster.status()
    assert sorted(w["host"] for w in status["workers"] if w["state"] == "ALIVE") == sorted(ips)
    assert all(w["resources"]["gpu"]["addresses"] == ["0", "1"] for w in status["workers"])

    # each namespace has exactly its own address (the executors' addresses are checked below)
    for host in cluster.hosts:
        out = cluster.exec(host.index, ["ip", "-4", "-o", "addr", "show", "scope", "global"],
                           capture_output=True, text=True, check=True).stdout
        assert [line.split()[3] for line in out.splitlines()] == [f"{host.ip}/24"]

    # each host has its own /dev/shm
    name = f"/dev/shm/sparkdl-probe-{uuid.uuid4().hex[:8]}"
    try:
        cluster.exec(0, ["touch", name], check=True)
        assert cluster.exec(0, ["test", "-e", name]).returncode == 0
        assert cluster.exec(1, ["test", "-e", name]).returncode != 0
        assert not os.path.exists(name)
    finally:
        cluster.exec(0, ["rm", "-f", name])

    # each host runs on cores of its own (an equal share of the machine's), as real hosts do:
    # its worker JVM, and every process started in it
    mine = os.sched_getaffinity(0)
    if len(mine) >= HOSTS:
        owned = [set(h.cpus or ()) for h in cluster.hosts]
        assert all(owned) and not owned[0] & owned[1], owned
        for host in cluster.hosts:
            assert sorted(os.sched_getaffinity(host.pid)) == host.cpus
            out = cluster.exec(host.index, [sys.executable, "-c",
                                            "import os; print(sorted(os.sched_getaffinity(0)))"],
                               capture_output=True, text=True, check=True).stdout
            assert out.strip() == str(host.cpus)
    assert os.sched_getaffinity(0) == mine  # starting them left this process's cores alone

    # the links are rate-limited: 4 MB over 100 Mbit/s takes at least 0.32 s
    seconds = cluster.transfer_seconds(0, 1, 4 << 20)
    assert seconds >= 0.25, seconds


def _pipeline(cluster, tmp_path, mode: str, epochs: int, *, compression: str = "threshold",
              sets: tuple[str, ...] = (), **submit_kwargs):
    """The digits pipeline through spark-submit with 4 workers; its metrics.json."""
    out, data = tmp_path / "out", tmp_path / "data"
    args = ["--conf", CONF, "--set", "training.num_workers=4", "--set", f"training.mode={mode}",
            "--set", f"training.epochs={epochs}", "--set", f"output.dir={out}",
            "--set", f"data.dir={data}", "--set", f"training.compression={compression}"]
    args += [arg for item in sets for arg in ("--set", item)]
    proc = submit(cluster, "jobs/pipeline.py", args, tmp_path, timeout=400, **submit_kwargs)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "metrics.json").read_text())


def test_pipeline_powersgd_sharing_with_gpu_scheduling(cluster, tmp_path):
    """Sharing with PowerSGD (the YAML path of a user: training.compression) on 2 hosts x 2
    workers with fake GPUs: replicas identical, and every barrier task and every evaluate task
    was pinned to exactly its assigned GPU before TensorFlow loaded."""
    trace = tmp_path / "gpu-trace.jsonl"
    conf = {"spark.executorEnv.SPARKDL_GPU_TRACE": str(trace)}
    metrics = _pipeline(cluster, tmp_path, "sharing", 6, compression="powersgd",
                        extra_conf=conf, gpus_per_task=1)
    assert metrics["mode"] == "sharing"
    _check_cross_host_fit(cluster, metrics)

    records = [json.loads(line) for line in trace.read_text().splitlines()]
    train = [r for r in records if r["role"] == "train"]
    model = [r for r in records if r["role"] == "model"]
    assert len(train) == 4, records
    assert model, "no evaluate/predict task recorded a pin"
    for record in train + model:
        assert len(record["addresses"]) == 1, record
        assert record["cuda_visible_devices"] == record["addresses"][0], record
        assert record["allow_growth"] == "true", record
        assert record["tensorflow_loaded"] is False, record
    _check_two_gpus_per_host(cluster, train)


def test_only_the_training_stage_of_a_dense_pipeline_asks_for_gpus(cluster, tmp_path):
    """Dense on 2 hosts x 2 workers with stage-level scheduling: the executors offer GPUs but
    no spark.task.resource.gpu.amount is set; cluster.task_gpus=1 puts a ResourceProfile on the
    training stage alone. Each barrier task got one GPU (CUDA_VISIBLE_DEVICES pinned before
    TensorFlow loaded), the two of each host its two; the ETL and evaluate tasks ran on CPU
    slots with no GPU. (Sharing with the threshold compressor across the hosts:
    test_elastic_harness.py's reference run.)"""
    trace = tmp_path / "gpu-trace.jsonl"
    conf = {"spark.executorEnv.SPARKDL_GPU_TRACE": str(trace),
            "spark.executor.resource.gpu.amount": str(GPUS),
            "spark.python.worker.reuse": "false"}
    metrics = _pipeline(cluster, tmp_path, "dense", 6, extra_conf=conf,
                        sets=("cluster.task_gpus=1",))
    assert metrics["mode"] == "dense"
    _check_cross_host_fit(cluster, metrics)
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    train = [r for r in records if r["role"] == "train"]
    model = [r for r in records if r["role"] == "model"]
    assert len(train) == 4, records
    assert model, "no evaluate task recorded its pin"
    for record in train:
        assert len(record["addresses"]) == 1, record
        assert record["cuda_visible_devices"] == record["addresses"][0], record
        assert record["tensorflow_loaded"] is False, record
    assert all(r["addresses"] is None for r in model), model
    _check_two_gpus_per_host(cluster, train)


def _check_cross_host_fit(cluster: NetCluster, metrics: dict) -> None:
    assert metrics["replicas_identical"] is True
    assert metrics["test_accuracy"] >= 0.9
    hosts = {address.rsplit(":", 1)[0] for address in metrics["executor_addresses"]}
    assert hosts == {h.ip for h in cluster.hosts}
    # auto: 2 hosts x 2 ranks, the hosts read from the barrier's task infos
    assert metrics["topology"] == "hierarchical"


def _check_two_gpus_per_host(cluster: NetCluster, train: list[dict]) -> None:
    """The two barrier tasks of each host got the host's two GPUs, one each."""
    per_host: dict[str, list[str]] = {}
    for record in train:
        per_host.setdefault(record["local_ip"], []).append(record["addresses"][0])
    assert {ip: sorted(ids) for ip, ids in per_host.items()} == {
        h.ip: ["0", "1"] for h in cluster.hosts
    }


def test_set_rate_and_attach(cluster):
    """Another process attaches to the running cluster from its state directory and changes
    the links' rate limit in both directions; the original limit comes back."""
    attached = NetCluster.attach(cluster.state_dir)
    assert attached.master_url == cluster.master_url
    assert [h.ip for h in attached.hosts] == [h.ip for h in cluster.hosts]

    def qdiscs() -> list[str]:
        shown = []
        for host in cluster.hosts:
            shown.append(subprocess.run(["tc", "qdisc", "show", "dev", host.link],
                                        capture_output=True, text=True, check=True).stdout)
            shown.append(subprocess.run(["tc", "-n", host.netns, "qdisc", "show", "dev", "eth0"],
                                        capture_output=True, text=True, check=True).stdout)
        return shown

    try:
        attached.set_rate(None)
        assert not any("tbf" in q for q in qdiscs())
        attached.set_rate("1gbit")
        assert all("tbf" in q and "rate 1Gbit" in q for q in qdiscs())
    finally:
        attached.set_rate("100mbit")
    assert all("rate 100Mbit" in q for q in qdiscs())
    assert json.loads((cluster.state_dir / "state.json").read_text())["rate"] == "100mbit"


def test_down_leaves_nothing(cluster):
    pids = [cluster.master_pid] + [h.pid for h in cluster.hosts]
    cluster.down()
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    assert not any(h.netns in netns for h in cluster.hosts), netns
    assert cluster.bridge not in links and not any(h.link in links for h in cluster.hosts)
    assert not [p for p in pids if p and os.path.exists(f"/proc/{p}")]
    assert not (cluster.state_dir / "state.json").exists()
