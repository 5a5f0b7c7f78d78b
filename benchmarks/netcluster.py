"""A multi-host Spark standalone cluster on one Linux machine, for tests and benchmarks.

The master runs in the root network namespace on a bridge address; each worker ("host") runs
in its own network namespace, joined to the bridge by a veth pair, with its own IP, an optional
token-bucket rate limit (``tc tbf``) on its link in both directions, and its own ``/dev/shm``
(a private tmpfs in a mount namespace), so nothing is shared between hosts but the filesystem
(where the data lives) and the wire. Each host's processes run on cores of their own, an
equal share of the machine's, when there are at least as many cores as hosts: workers that
share cores are woken onto each other's and slow each other down, which real hosts never do.
Fake GPUs come from a resource discovery script.

Command line (needs root or CAP_NET_ADMIN + CAP_SYS_ADMIN)::

    python -m benchmarks.netcluster up --hosts 2 --cores 2 --rate 100mbit [--gpus 2]
    python -m benchmarks.netcluster status
    python -m benchmarks.netcluster down

From Python::

    with NetCluster(hosts=2, cores_per_host=2, rate="100mbit") as cluster:
        subprocess.run([spark_submit(), "--master", cluster.master_url, *cluster.submit_args(),
                        "jobs/pipeline.py", ...])

``up`` records what it created (pids, namespaces, links) in the state directory, so ``down``
works from another process, and a second ``up`` first removes what a crashed one left.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sparkdl.comm.network import split_host_port
from sparkdl.cpus import plan_cores
from sparkdl.errors import SparkDLError

DEFAULT_NAME = "sdl"
DEFAULT_SUBNET = "10.77.0"  # /24; the bridge is .1, host i is .(11 + i)
DEFAULT_STATE_DIR = "/tmp/sparkdl-netcluster"
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps)$")
_RATE_BITS = {
    "bit": 1,
    "kbit": 1e3,
    "mbit": 1e6,
    "gbit": 1e9,
    "tbit": 1e12,
    "bps": 8,
    "kbps": 8e3,
    "mbps": 8e6,
    "gbps": 8e9,
}
_CAP_NET_ADMIN, _CAP_SYS_ADMIN = 12, 21


class NetClusterError(SparkDLError):
    """The cluster harness cannot run here, or the cluster failed to come up."""


@dataclass
class Host:
    """One worker host: its network namespace, address, bridge-side link and worker pid."""

    index: int
    netns: str
    ip: str
    link: str  # the bridge-side veth (the namespace side is ``eth0``)
    pid: int | None = None
    cpus: list[int] | None = None  # the cores its processes run on (None: every core)


@contextlib.contextmanager
def _on_cores(cpus: list[int] | None) -> Iterator[None]:
    """Children started inside run on ``cpus``: they inherit the starting thread's cores,
    which are set for the block only (this thread only: Linux's masks are per thread)."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def host_cpus(cpus: list[int], hosts: int) -> list[list[int] | None]:
    """Each host's own share of ``cpus`` (consecutive, equal, the remainder unused), as
    :func:`sparkdl.cpus.plan_cores` gives workers theirs; ``None`` for every host when there
    are fewer cores than hosts (and for one host that would get them all)."""
    share = len(cpus) // hosts
    return [plan_cores(cpus, i, hosts, share, "on") if share else None for i in range(hosts)]


def rate_bits_per_s(rate: str | None) -> float | None:
    """``"100mbit"`` → 1e8; ``None``/``"none"`` → ``None`` (no limit). tc's units."""
    if rate is None or str(rate).lower() in ("", "none", "unlimited"):
        return None
    match = _RATE.match(str(rate).strip().lower())
    if not match:
        raise NetClusterError(f"rate: expected a tc rate like '100mbit' or '1gbit', got {rate!r}")
    return float(match.group(1)) * _RATE_BITS[match.group(2)]


def check_privileges() -> None:
    """Raise :class:`NetClusterError` unless this process may create namespaces and links."""
    missing = [tool for tool in ("ip", "tc", "unshare", "nsenter") if shutil.which(tool) is None]
    if missing:
        raise NetClusterError(
            f"the cluster harness needs {', '.join(missing)} (iproute2, util-linux)"
        )
    caps = 0
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                caps = int(line.split()[1], 16)
    if not (caps >> _CAP_NET_ADMIN & 1 and caps >> _CAP_SYS_ADMIN & 1):
        raise NetClusterError(
            "the cluster harness needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network "
            f"namespaces, veth links, tc qdiscs and tmpfs mounts; running as uid {os.getuid()}"
        )


def spark_home() -> str:
    """The pip-installed pyspark directory (it has ``bin/spark-class`` and ``bin/spark-submit``)."""
    import pyspark

    return os.path.dirname(pyspark.__file__)


def spark_submit() -> str:
    """Path of pyspark's ``spark-submit``."""
    return os.path.join(spark_home(), "bin", "spark-submit")


class NetCluster:
    """A Spark standalone master plus ``hosts`` workers, each in its own network namespace.

    Args:
        hosts: number of worker hosts (network namespaces), 1 to 200.
        cores_per_host: cores each worker offers.
        rate: tc rate limit of each host's link in each direction (``"100mbit"``), or ``None``.
        gpus_per_host: fake GPUs each worker advertises (ids ``"0"`` .. ``str(n - 1)``).
        state_dir: where state, logs and the discovery script go.
        name: prefix of every namespace and link created (bridge ``{name}br0``).
        subnet: first three octets of the private /24 used.
        worker_memory: ``SPARK_WORKER_MEMORY`` of each worker.
        shm_size: size of each host's private ``/dev/shm``.
        timeout_s: bound on every wait (master up, workers registered).
        own_cores: give each host's processes (its worker, executors, Python workers) cores
            of their own, an equal share of this process's, as real hosts have; when there
            are fewer cores than hosts, every host runs on every core.
    """

    def __init__(
        self,
        hosts: int = 2,
        cores_per_host: int = 2,
        rate: str | None = None,
        gpus_per_host: int = 0,
        *,
        state_dir: str | os.PathLike[str] = DEFAULT_STATE_DIR,
        name: str = DEFAULT_NAME,
        subnet: str = DEFAULT_SUBNET,
        worker_memory: str = "2g",
        shm_size: str = "512m",
        master_port: int = 7077,
        webui_port: int = 8080,
        timeout_s: float = 120.0,
        own_cores: bool = True,
    ) -> None:
        if not 1 <= hosts <= 200:
            raise NetClusterError(f"hosts: expected 1..200, got {hosts}")
        if not re.fullmatch(r"[a-z][a-z0-9]{0,5}", name):
            raise NetClusterError(f"name: expected 1-6 lowercase letters/digits, got {name!r}")
        if not re.fullmatch(r"\d{1,3}\.\d{1,3}\.\d{1,3}", subnet):
            raise NetClusterError(f"subnet: expected three octets like '10.77.0', got {subnet!r}")
        self.rate = rate
        self.rate_bits = rate_bits_per_s(rate)
        self.cores_per_host = int(cores_per_host)
        self.gpus_per_host = int(gpus_per_host)
        self.state_dir = Path(state_dir)
        self.name = name
        self.bridge = f"{name}br0"
        self.master_ip = f"{subnet}.1"
        self.master_port = int(master_port)
        self.webui_port = int(webui_port)
        self.worker_memory = worker_memory
        self.shm_size = shm_size
        self.timeout_s = float(timeout_s)
        cores = (host_cpus(sorted(os.sched_getaffinity(0)), hosts)
                 if own_cores and hasattr(os, "sched_getaffinity") else [None] * hosts)
        self.hosts = [
            Host(i, f"{name}-h{i}", f"{subnet}.{11 + i}", f"{name}-h{i}b", cpus=cores[i])
            for i in range(hosts)
        ]
        self.master_pid: int | None = None

    # Public API ---------------------------------------------------------------------------

    @property
    def master_url(self) -> str:
        return f"spark://{self.master_ip}:{self.master_port}"

    @property
    def json_url(self) -> str:
        return f"http://{self.master_ip}:{self.webui_port}/json/"

    def __enter__(self) -> NetCluster:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self, *, owner: int | None = None) -> NetCluster:
        """Create the network, start the master and workers, wait until all registered.

        ``owner``: the pid whose life the cluster is bound to (default: this process); while it
        lives, another ``up`` with the same ``name`` refuses to replace this cluster. The CLI
        passes 0 (no owner: a later ``up`` replaces it).
        """
        owner = os.getpid() if owner is None else owner
        check_privileges()
        _claim(self.name, self.state_dir, owner, write=False)  # refuse a live one's names
        teardown(self.state_dir, self.name)  # whatever a crashed run left behind
        self.state_dir.mkdir(parents=True, exist_ok=True)
        _claim(self.name, self.state_dir, owner)
        try:
            self._save_state()
            self._create_network()
            self._start_master()
            for host in self.hosts:
                self._start_worker(host)
            self._wait_for_workers()
        except BaseException:
            self.down()
            raise
        return self

    def up_network(self, *, owner: int | None = None) -> NetCluster:
        """Create only the network (namespaces, links, rate limits), no Spark: for benchmarks
        whose own processes join a host with :func:`join_netns` (``down`` removes it)."""
        owner = os.getpid() if owner is None else owner
        check_privileges()
        _claim(self.name, self.state_dir, owner, write=False)
        teardown(self.state_dir, self.name)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        _claim(self.name, self.state_dir, owner)
        try:
            self._save_state()
            self._create_network()
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Stop every process and remove every namespace, link and qdisc this cluster made."""
        teardown(self.state_dir, self.name)

    def submit_args(self, *, gpus_per_task: float = 0) -> list[str]:
        """spark-submit options that make a driver in the root namespace work with this
        cluster: the driver on the bridge address, executors on this Python, small memory."""
        conf = {
            "spark.driver.host": self.master_ip,
            "spark.driver.bindAddress": self.master_ip,
            "spark.executor.memory": "1g",
            "spark.executor.cores": str(self.cores_per_host),
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
            "spark.ui.enabled": "false",
        }
        if gpus_per_task:
            conf["spark.executor.resource.gpu.amount"] = str(self.gpus_per_host)
            conf["spark.task.resource.gpu.amount"] = f"{gpus_per_task:g}"
            conf["spark.python.worker.reuse"] = "false"
        return [arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]

    def exec(self, host: int, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
        """Run ``argv`` inside host ``host``'s network and mount namespaces (bounded:
        ``timeout`` defaults to ``timeout_s``)."""
        kwargs.setdefault("timeout", self.timeout_s)
        with _on_cores(self.hosts[host].cpus):
            return subprocess.run(self._enter(host) + list(argv), **kwargs)

    def popen(self, host: int, argv: list[str], **kwargs: Any) -> subprocess.Popen:
        """Start ``argv`` inside host ``host``'s namespaces, on its cores."""
        with _on_cores(self.hosts[host].cpus):
            return subprocess.Popen(self._enter(host) + list(argv), **kwargs)

    def set_rate(self, rate: str | None) -> None:
        """Change every host link's ``tc tbf`` limit (both directions) on the running cluster;
        ``None`` removes the limit. Takes effect at once, without restarting anything."""
        bits = rate_bits_per_s(rate)
        for host in self.hosts:
            for prefix in (["tc"], ["tc", "-n", host.netns]):
                dev = host.link if len(prefix) == 1 else "eth0"
                subprocess.run([*prefix, "qdisc", "del", "dev", dev, "root"],
                               capture_output=True, timeout=30)  # absent when unlimited
                if bits is not None:
                    _run([*prefix, "qdisc", "add", "dev", dev, "root", *_tbf(str(rate), bits)])
        self.rate, self.rate_bits = rate, bits
        self._save_state()

    def remove_host(self, host: int) -> None:
        """Lose host ``host`` for good: SIGKILL every process in its namespaces (the worker,
        its executors and their Python workers), so the master and the drivers see it vanish
        and no worker comes back (:meth:`restore_host` starts one again). The namespace and
        its link stay until :meth:`down`."""
        target = self.hosts[host]
        listed = subprocess.run(["ip", "netns", "pids", target.netns], capture_output=True,
                                text=True, timeout=30, check=False)
        pids = [int(p) for p in listed.stdout.split() if p.isdigit()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + self.timeout_s
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        target.pid = None
        self._save_state()

    def restore_host(self, host: int) -> None:
        """Start host ``host``'s worker again (after :meth:`remove_host`) and wait until it
        registered."""
        self._start_worker(self.hosts[host])
        self._save_state()
        self._wait_for_workers()

    @classmethod
    def attach(cls, state_dir: str | os.PathLike[str] = DEFAULT_STATE_DIR) -> NetCluster:
        """The cluster recorded in ``state_dir`` (started by ``up``, e.g. from the CLI)."""
        state_file = Path(state_dir) / "state.json"
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError) as exc:
            raise NetClusterError(f"no running cluster recorded in {state_file}: {exc}") from None
        hosts = state["hosts"]
        first_ip = hosts[0]["ip"]
        cluster = cls(len(hosts), state.get("cores_per_host", 2), state.get("rate"),
                      state.get("gpus_per_host", 0), state_dir=state_dir, name=state["name"],
                      subnet=first_ip.rsplit(".", 1)[0])
        cluster.hosts = [Host(**h) for h in hosts]
        cluster.master_pid = state.get("master_pid")
        master = state["master_url"].removeprefix("spark://")
        cluster.master_ip, cluster.master_port = split_host_port(master)
        return cluster

    def status(self) -> dict[str, Any]:
        """The master's JSON status (workers, cores, resources)."""
        with urllib.request.urlopen(self.json_url, timeout=5) as response:
            return json.load(response)

    def transfer_seconds(self, src: int, dst: int, nbytes: int) -> float:
        """Seconds to send ``nbytes`` over TCP from host ``src`` to host ``dst`` and get the
        receiver's acknowledgement (a measurement of the links, not of sparkdl)."""
        port = 47000 + dst
        receiver = (
            "import socket,sys\n"
            f"s=socket.create_server(('{self.hosts[dst].ip}',{port}));s.settimeout({self.timeout_s})\n"
            "print('ready',flush=True)\n"
            "c,_=s.accept();c.settimeout(60);n=0\n"
            f"while n<{nbytes}:\n"
            "    b=c.recv(1<<20)\n"
            "    if not b: sys.exit(1)\n"
            "    n+=len(b)\n"
            "c.sendall(b'k');c.close()\n"
        )
        sender = (
            "import socket,time\n"
            f"data=bytes({nbytes});t=time.perf_counter()\n"
            f"c=socket.create_connection(('{self.hosts[dst].ip}',{port}),timeout=60)\n"
            "c.sendall(data);c.recv(1)\n"
            "print(time.perf_counter()-t)\n"
        )
        return self._probe(src, dst, receiver, sender, "receiver")

    def round_trip_seconds(self, src: int, dst: int, count: int = 200) -> float:
        """Median round trip of a 64-byte message on one TCP connection from host ``src`` to
        host ``dst`` and back (ping-pong, ``TCP_NODELAY``)."""
        port = 47100 + dst
        echo = (
            "import socket\n"
            f"s=socket.create_server(('{self.hosts[dst].ip}',{port}));s.settimeout(60)\n"
            "print('ready',flush=True)\n"
            "c,_=s.accept();c.settimeout(60)\n"
            "c.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1)\n"
            "while True:\n"
            "    b=c.recv(64)\n"
            "    if not b: break\n"
            "    c.sendall(b)\n"
        )
        ping = (
            "import socket,statistics,time\n"
            f"c=socket.create_connection(('{self.hosts[dst].ip}',{port}),timeout=60)\n"
            "c.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1)\n"
            "t=[]\n"
            f"for _ in range({count}):\n"
            "    a=time.perf_counter();c.sendall(bytes(64));n=0\n"
            "    while n<64: n+=len(c.recv(64-n))\n"
            "    t.append(time.perf_counter()-a)\n"
            "print(statistics.median(t))\n"
        )
        return self._probe(src, dst, echo, ping, "echo server")

    def _probe(self, src: int, dst: int, server: str, client: str, what: str) -> float:
        """Run the Python ``server`` on host ``dst`` until it prints ``ready``, then the
        ``client`` on host ``src``; the float the client prints (both bounded in time)."""
        rx = self.popen(dst, [sys.executable, "-c", server], stdout=subprocess.PIPE, text=True)
        try:
            if rx.stdout is None or rx.stdout.readline().strip() != "ready":
                raise NetClusterError(f"the {what} on host {dst} did not start")
            out = self.exec(src, [sys.executable, "-c", client], capture_output=True,
                            text=True, check=True, timeout=120)
            return float(out.stdout.strip())
        finally:
            with contextlib.suppress(subprocess.TimeoutExpired):
                rx.wait(timeout=10)
            if rx.poll() is None:
                rx.kill()
                rx.wait(timeout=10)

    # Internals ----------------------------------------------------------------------------

    def _enter(self, host: int) -> list[str]:
        pid = self.hosts[host].pid
        if pid is None:
            raise NetClusterError(f"host {host} has no running worker")
        return ["nsenter", "-t", str(pid), "-n", "-m", "--"]

    def _save_state(self) -> None:
        state = {
            "name": self.name,
            "bridge": self.bridge,
            "master_url": self.master_url,
            "json_url": self.json_url,
            "master_pid": self.master_pid,
            "hosts": [asdict(h) for h in self.hosts],
            "rate": self.rate,
            "gpus_per_host": self.gpus_per_host,
            "cores_per_host": self.cores_per_host,
        }
        tmp = self.state_dir / "state.json.tmp"
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_dir / "state.json")

    def _create_network(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.master_ip}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for host in self.hosts:
            ns = host.netns
            _ip("netns", "add", ns)
            _ip("link", "add", host.link, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", host.link, "master", self.bridge, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "route", "add", "default", "via", self.master_ip)
            if self.rate_bits is not None:
                tbf = ["root", *_tbf(str(self.rate), self.rate_bits)]
                _run(["tc", "qdisc", "add", "dev", host.link, *tbf])
                _run(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", *tbf])

    def _env(self, local_ip: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=spark_home(),
            SPARK_LOCAL_IP=local_ip,
            SPARK_DAEMON_MEMORY="512m",
            SPARK_CONF_DIR=str(self.state_dir / "conf"),
            PYSPARK_PYTHON=sys.executable,
        )
        (self.state_dir / "conf").mkdir(exist_ok=True)
        return env

    def _spawn(self, argv: list[str], log: Path, env: dict[str, str],
               cpus: list[int] | None = None) -> int:
        """Start ``argv`` in its own session, on ``cpus`` when given."""
        with open(log, "ab") as out, _on_cores(cpus):
            process = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # survives this process (``up`` from the CLI)
            )
        return process.pid

    def _start_master(self) -> None:
        spark_class = os.path.join(spark_home(), "bin", "spark-class")
        self.master_pid = self._spawn(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                self.master_ip,
                "--port",
                str(self.master_port),
                "--webui-port",
                str(self.webui_port),
            ],
            self.state_dir / "master.log",
            self._env(self.master_ip),
        )
        self._save_state()
        self._wait(
            "the master's web UI",
            lambda: self.status() is not None,
            [self.master_pid],
            self.state_dir / "master.log",
        )

    def _start_worker(self, host: Host) -> None:
        spark_class = os.path.join(spark_home(), "bin", "spark-class")
        env = self._env(host.ip)
        env["SPARK_WORKER_MEMORY"] = self.worker_memory
        if self.gpus_per_host:
            script = self.state_dir / "gpus.sh"
            ids = json.dumps([str(i) for i in range(self.gpus_per_host)])
            script.write_text(f'#!/bin/sh\necho \'{{"name":"gpu","addresses":{ids}}}\'\n')
            script.chmod(0o755)
            env["SPARK_WORKER_OPTS"] = (
                f"-Dspark.worker.resource.gpu.amount={self.gpus_per_host} "
                f"-Dspark.worker.resource.gpu.discoveryScript={script}"
            )
        work = self.state_dir / f"work-h{host.index}"
        work.mkdir(exist_ok=True)
        # ip netns exec, unshare (no --fork) and sh's exec all replace themselves, so the pid
        # is the worker JVM's; its mount namespace holds the private /dev/shm
        mount = f"mount -t tmpfs -o size={self.shm_size},mode=1777 {self.name}shm /dev/shm"
        argv = [
            "ip",
            "netns",
            "exec",
            host.netns,
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f'{mount} && exec "$@"',
            "sh",
            spark_class,
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            host.ip,
            "--cores",
            str(self.cores_per_host),
            "--memory",
            self.worker_memory,
            "--work-dir",
            str(work),
            self.master_url,
        ]
        host.pid = self._spawn(argv, self.state_dir / f"worker-h{host.index}.log", env,
                               cpus=host.cpus)
        self._save_state()

    def _wait_for_workers(self) -> None:
        wanted = {h.ip for h in self.hosts}

        def registered() -> bool:
            alive = {w["host"] for w in self.status().get("workers", []) if w["state"] == "ALIVE"}
            return wanted <= alive

        pids = [self.master_pid] + [h.pid for h in self.hosts]
        self._wait("every worker to register", registered, pids, self.state_dir)

    def _wait(self, what: str, ready: Any, pids: list[int | None], logs: Path) -> None:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            for pid in pids:
                if pid is not None and not _alive(pid):
                    raise NetClusterError(f"a cluster process (pid {pid}) died; see {logs}")
            with contextlib.suppress(OSError, ValueError):
                if ready():
                    return
            time.sleep(0.5)
        raise NetClusterError(
            f"timed out after {self.timeout_s:g} s waiting for {what}; see {logs}"
        )


def teardown(
    state_dir: str | os.PathLike[str] = DEFAULT_STATE_DIR, name: str = DEFAULT_NAME
) -> None:
    """Remove a cluster: the processes recorded in ``state_dir`` and every process in its
    namespaces, then the namespaces (with their veths and qdiscs) and the bridge. Safe to call
    when nothing is there."""
    state_file = Path(state_dir) / "state.json"
    state: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        state = json.loads(state_file.read_text())
    name = state.get("name", name)
    namespaces = [h["netns"] for h in state.get("hosts", [])]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    namespaces += [
        line.split()[0]
        for line in listed.stdout.splitlines()
        if line.split() and re.fullmatch(rf"{name}-h\d+", line.split()[0])
    ]
    namespaces = list(dict.fromkeys(namespaces))
    pids = [state.get("master_pid")] + [h.get("pid") for h in state.get("hosts", [])]
    for ns in namespaces:
        out = subprocess.run(
            ["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30
        )
        pids += [int(p) for p in out.stdout.split() if p.isdigit()]
    _kill([p for p in pids if p], recorded=set(pids[: 1 + len(state.get("hosts", []))]))
    # the bridge-side veths first: deleting a namespace frees its veth pair only asynchronously
    links = [h["link"] for h in state.get("hosts", [])] + [f"{ns}b" for ns in namespaces]
    for link in [*dict.fromkeys(links), state.get("bridge", f"{name}br0")]:
        subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=30)
    for ns in namespaces:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
    for done in (state_file, _claim_file(name)):
        with contextlib.suppress(FileNotFoundError):
            done.unlink()


def _claim_file(name: str) -> Path:
    return Path(DEFAULT_STATE_DIR).with_name(f"sparkdl-netcluster-{name}.owner")


def _claim(name: str, state_dir: Path, owner: int, *, write: bool = True) -> None:
    """Record ``owner`` as the user of the names and subnet of cluster ``name``, unless a live
    other process holds them (a crashed owner's claim is taken over)."""
    claim = _claim_file(name)
    with contextlib.suppress(OSError, ValueError):
        held = json.loads(claim.read_text())
        pid = int(held.get("owner") or 0)
        if pid and pid != owner and _alive(pid):
            raise NetClusterError(
                f"cluster name {name!r} is in use by process {pid} (state dir "
                f"{held.get('state_dir')}); stop it or pick another name and subnet"
            )
    if write:
        claim.write_text(json.dumps({"owner": owner, "state_dir": str(state_dir)}))


def _kill(pids: list[int], recorded: set[Any]) -> None:
    """SIGTERM, then SIGKILL after a bounded wait. A pid from the state file is only killed
    while it still runs a Spark daemon (it may have been reused after a crash)."""
    targets = []
    for pid in dict.fromkeys(pids):
        if pid in recorded and "org.apache.spark" not in _cmdline(pid):
            continue
        targets.append(pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
                if pid in recorded:  # the daemon's session: executors, Python workers
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pid, sig)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in targets):
            time.sleep(0.1)
        targets = [p for p in targets if _alive(p)]
        if not targets:
            return


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def join_netns(netns: str) -> None:
    """Move the calling process (single-threaded, e.g. just forked) into network namespace
    ``netns`` (``setns(2)``), so the sockets it opens from now on live on that host."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{netns}", os.O_RDONLY)
    try:
        if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            raise NetClusterError(f"setns into {netns}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


def _tbf(rate: str, bits: float) -> list[str]:
    """A ``tc`` token-bucket qdisc spec; tbf needs a bucket of at least one timer tick of
    traffic, 10 ms of it here."""
    burst = max(32 * 1024, int(bits / 8 / 100))
    return ["tbf", "rate", rate, "burst", str(burst), "latency", "100ms"]


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise NetClusterError(f"{' '.join(argv)} failed: {done.stderr.strip()}")


def _ip(*args: str) -> None:
    _run(["ip", *args])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.netcluster", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--cores", type=int, default=2, help="cores per host")
    parser.add_argument("--rate", default=None, help="tc rate per link direction, e.g. 100mbit")
    parser.add_argument("--gpus", type=int, default=0, help="fake GPUs per host")
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR)
    parser.add_argument("--name", default=DEFAULT_NAME)
    parser.add_argument("--subnet", default=DEFAULT_SUBNET)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            cluster = NetCluster(
                args.hosts,
                args.cores,
                args.rate,
                args.gpus,
                state_dir=args.state_dir,
                name=args.name,
                subnet=args.subnet,
                timeout_s=args.timeout,
            )
            cluster.up(owner=0)
            print(cluster.master_url)
            print("submit options:", " ".join(cluster.submit_args()), file=sys.stderr)
        elif args.command == "down":
            teardown(args.state_dir, args.name)
        else:
            state_file = Path(args.state_dir) / "state.json"
            if not state_file.exists():
                print(f"no cluster recorded in {args.state_dir}")
                return 1
            state = json.loads(state_file.read_text())
            with contextlib.suppress(OSError, ValueError):
                with urllib.request.urlopen(state["json_url"], timeout=5) as response:
                    master = json.load(response)
                state["alive_workers"] = master.get("aliveworkers")
            print(json.dumps(state, indent=2))
    except NetClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
