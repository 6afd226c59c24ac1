"""Real Spark clusters on loopback for tests: a standalone master with workers, and a Spark Connect server.

Both come from the installed pyspark (its `bin/spark-class` / `bin/spark-submit` and jars); nothing is
downloaded. Each daemon runs in its own process group and is stopped by PID (SIGTERM, then SIGKILL),
together with what it started (a worker forks one executor JVM per application, an executor forks
Python workers). Every process started here carries a marker in its environment
(`EVENTIDE_TEST_CLUSTER=<id>`), inherited by whatever it starts, so `leftover_pids()` finds any
survivor, even one that left the process group.

    with standalone_cluster(tmp_path, workers=2) as cluster:
        ...  SparkSession.builder.master(cluster.url) in a subprocess (one SparkContext per JVM) ...
    with connect_server(tmp_path) as url:   # "sc://127.0.0.1:PORT"
        ...  SparkSession.builder.remote(url) ...
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from transforms.ports import free_port
from transforms.processes import local_processes

JAVA_17 = "/usr/lib/jvm/java-17-openjdk-amd64"
MARKER = "EVENTIDE_TEST_CLUSTER"
# JVM options of the test daemons: the client compiler only and a serial GC start a JVM several times
# faster on a small, busy machine (measured under load: cluster up in 4.6 s instead of 19 s).
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
class ClusterError(RuntimeError):
    """A daemon did not come up in time, or died; the message has the tails of the logs."""


def pyspark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_env(tmp: Path, marker: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a daemon: Java 17, loopback, SPARK_HOME = the pyspark package, an empty
    configuration folder (no stray spark-defaults), the venv's Python for Python workers."""
    home = pyspark_home()
    conf_dir = tmp / "conf"
    conf_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update({
        "JAVA_HOME": os.environ.get("JAVA_HOME") or JAVA_17,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_HOME": str(home),
        "SPARK_CONF_DIR": str(conf_dir),
        "SPARK_LOG_DIR": str(tmp / "logs"),
        "SPARK_PID_DIR": str(tmp),
        "SPARK_DAEMON_MEMORY": "512m",
        "SPARK_DAEMON_JAVA_OPTS": FAST_JVM,
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",  # else it takes port 6066
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON") or sys.executable,
        "PYSPARK_DRIVER_PYTHON": os.environ.get("PYSPARK_DRIVER_PYTHON") or sys.executable,
        MARKER: marker,
    })
    env.update(extra or {})
    return env


def _default_signals() -> None:
    # A process started from a shell in the background may inherit SIGINT/SIGTERM ignored; the JVM
    # keeps an ignored signal ignored, and then SIGTERM would not stop it.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass
class Daemon:
    """A process started in its own process group (its PID is the group's id), logging to `log`."""

    name: str
    args: list[str]
    log: Path
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def start(self, env: dict[str, str], cwd: Path) -> Daemon:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         env=env, cwd=cwd, start_new_session=True, preexec_fn=_default_signals)
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the daemon's process group (a worker, its executor and their Python workers): what
        the loss of a machine looks like."""
        if self.running():
            _signal_group(self.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the process group, SIGKILL it after `grace` seconds; reap the daemon."""
        if self.proc is None:
            return
        _signal_group(self.pid, signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        # The group may outlive its leader (an executor of a worker that exited on SIGTERM).
        deadline = time.monotonic() + grace
        while _group_alive(self.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal_group(self.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(10)

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return f"--- {self.name}: no log at {self.log}"
        state = "running" if self.running() else f"exited {self.proc.returncode if self.proc else '?'}"
        return f"--- {self.name} ({state}), last lines of {self.log}:\n" + "\n".join(text[-lines:])


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def leftover_pids(marker: str) -> list[int]:
    """Live processes (zombies excluded) whose environment carries `marker`: started by a harness run."""
    needle = f"{MARKER}={marker}".encode()
    return [p.pid for p in local_processes() if p.pid != os.getpid() and not p.zombie and needle in p.environ()]


def _kill_leftovers(marker: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while pids := leftover_pids(marker):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise ClusterError(f"processes survived SIGKILL: {pids}")
        time.sleep(0.1)


def _get_json(url: str, timeout: float = 2.0):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


# -- standalone -------------------------------------------------------------------------------------
@dataclass
class StandaloneCluster:
    url: str  # spark://127.0.0.1:PORT
    web_url: str  # the master's web UI: /json/ has its workers and applications
    master: Daemon
    workers: list[Daemon]
    marker: str
    tmp: Path

    def status(self) -> dict:
        """The master's JSON status: `workers` (id, host, port, cores, coresused, state, ...),
        `activeapps`, `completedapps`, ..."""
        return _get_json(f"{self.web_url}/json/")

    def alive_workers(self) -> list[dict]:
        return [w for w in self.status().get("workers", []) if w.get("state") == "ALIVE"]

    def logs(self, lines: int = 40) -> str:
        return "\n".join(d.tail(lines) for d in [self.master, *self.workers])


@contextmanager
def standalone_cluster(tmp: Path, workers: int = 2, cores_per_worker: int = 1, memory: str = "1g",
                       timeout: float = 90.0, env: dict[str, str] | None = None) -> Iterator[StandaloneCluster]:
    """A standalone master and `workers` workers on 127.0.0.1, all ALIVE when this yields; stopped (with
    every executor they forked) on exit. `tmp`: logs (`tmp/logs`) and work folders. `env`: added to the
    daemons' environment (executors inherit it from their worker)."""
    tmp = Path(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    marker = uuid.uuid4().hex
    spark_class = str(pyspark_home() / "bin" / "spark-class")
    daemon_env = spark_env(tmp, marker, env)
    port, web_port = free_port(), free_port()
    master = Daemon("master", [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(web_port)], tmp / "logs" / "master.log")
    handles = [
        Daemon(f"worker-{i}", [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                               "--cores", str(cores_per_worker), "--memory", memory, "--webui-port", "0",
                               "--work-dir", str(tmp / f"work-{i}"), f"spark://127.0.0.1:{port}"],
               tmp / "logs" / f"worker-{i}.log")
        for i in range(workers)
    ]
    cluster = StandaloneCluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{web_port}", master, handles,
                                marker, tmp)
    try:
        master.start(daemon_env, tmp)
        # A worker that finds no master retries only 5 to 15 s later: start the workers once it listens.
        _wait(lambda: _port_open(port), timeout, cluster.logs, f"the master on 127.0.0.1:{port}", [master])
        for w in handles:
            w.start(daemon_env, tmp)
        _wait(lambda: len(_alive_or_none(cluster)) >= workers, timeout, cluster.logs,
              f"{workers} ALIVE workers at {cluster.web_url}/json/", [master, *handles])
        yield cluster
    finally:
        for d in [*handles, master]:
            d.stop()
        _kill_leftovers(marker)


def _alive_or_none(cluster: StandaloneCluster) -> list[dict]:
    try:
        return cluster.alive_workers()
    except OSError:  # the web UI is not up yet
        return []


def _wait(ready, timeout: float, logs, what: str, daemons: list[Daemon]) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        dead = [d.name for d in daemons if not d.running()]
        if dead:
            raise ClusterError(f"{', '.join(dead)} exited while waiting for {what}\n{logs()}")
        if time.monotonic() > deadline:
            raise ClusterError(f"no {what} after {timeout:.0f} s\n{logs()}")
        time.sleep(0.25)


# -- Spark Connect ----------------------------------------------------------------------------------
@contextmanager
def connect_server(tmp: Path, timeout: float = 120.0, info: dict | None = None) -> Iterator[str]:
    """A Spark Connect server on 127.0.0.1 (master local[2]); yields `sc://127.0.0.1:PORT`.

    Started through spark-submit (SparkConnectServer reads its settings from the submit's `--conf`, not
    from its own arguments), log in `tmp/logs/connect.log`. Python code the clients send (UDFs,
    mapInArrow, foreachBatch functions) runs in Python workers of this server. `info`, if given,
    receives `daemon` and `marker` (to look at the log or the processes)."""
    tmp = Path(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    marker = uuid.uuid4().hex
    port = free_port()
    confs = {"spark.connect.grpc.binding.address": "127.0.0.1",
             "spark.connect.grpc.binding.port": str(port),
             "spark.driver.bindAddress": "127.0.0.1",
             "spark.driver.host": "127.0.0.1",
             "spark.ui.enabled": "false",
             "spark.sql.warehouse.dir": str(tmp / "spark-warehouse"),
             "spark.driver.extraJavaOptions": f"{FAST_JVM} -Dderby.system.home={tmp / 'derby'}"}
    args = [str(pyspark_home() / "bin" / "spark-submit"), "--master", "local[2]",
            "--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "--name", "eventide-connect"]
    for key, value in confs.items():
        args += ["--conf", f"{key}={value}"]
    daemon = Daemon("connect", args, tmp / "logs" / "connect.log")
    if info is not None:
        info.update(daemon=daemon, marker=marker)
    try:
        daemon.start(spark_env(tmp, marker), tmp)
        _wait(lambda: _port_open(port), timeout, daemon.tail, f"Spark Connect on 127.0.0.1:{port}", [daemon])
        yield f"sc://127.0.0.1:{port}"
    finally:
        daemon.stop()
        _kill_leftovers(marker)
