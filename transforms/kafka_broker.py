"""Apache Kafka for development and tests: one node in KRaft mode (broker and controller in one JVM), run
from Apache Kafka's own jars, which `make setup` resolves once (jvm/kafka/pom.xml, into <venv>/kafka-jars;
never on Spark's class path). Nothing here reaches a network beyond 127.0.0.1.

    eventide kafka --port 9092 --dir .eventide/kafka    # in the foreground; SIGTERM or Ctrl-C stops it

`run_broker` is that command. DIR holds everything: `server.properties` (written at every start, so PORT may
change), `log4j2.properties`, `cluster-id` (made on first use, kept) and `data/` (log.dirs, the metadata log
too), formatted with Kafka's StorageTool on first use only: a second start on DIR keeps the data. A signal
to the command is forwarded to the JVM, whose shutdown hook stops the broker cleanly; the command waits for
it and exits 0.

`start_broker` is for tests (and anything else that wants a throwaway broker): `eventide kafka` in a
subprocess on a free port, waited for until it answers a client, stopped by PID:

    with start_broker(tmp_path / "kafka") as broker:
        Producer({"bootstrap.servers": broker.bootstrap_servers})...

Stdlib only (confluent-kafka is imported by `BrokerProcess.wait_ready` alone); no Spark, no Dagster.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from transforms.ports import LOOPBACK, free_port
from transforms.processes import live_children

KAFKA_VERSION = "4.1.1"  # org.apache.kafka:kafka_2.13, jvm/kafka/pom.xml
KAFKA_JARS_ENV = "EVENTIDE_KAFKA_JARS"
JAVA_OPTS_ENV = "EVENTIDE_KAFKA_JAVA_OPTS"
NODE_ID = 1
# A development broker: a small heap, and the client compiler only with a serial GC, the options with which
# tests/spark_cluster.py measured Spark's daemons starting several times faster on a small, busy machine.
DEFAULT_JAVA_OPTS = "-Xms128m -Xmx512m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Djava.awt.headless=true"
STOP_TIMEOUT_SECONDS = 60.0


class KafkaBrokerError(RuntimeError):
    """The broker cannot start (jars or java missing, port taken, formatting failed) or did not stop."""


# -- what the broker runs from ------------------------------------------------------------------------
def kafka_jars_dir() -> Path:
    """Where `make setup` put Kafka's jars: EVENTIDE_KAFKA_JARS, else `<sys.prefix>/kafka-jars` (the venv's)."""
    return Path(os.environ.get(KAFKA_JARS_ENV) or Path(sys.prefix) / "kafka-jars")


def class_path() -> str:
    """The broker's class path (`<folder>/*`); KafkaBrokerError says what to run when the jars are missing."""
    folder = kafka_jars_dir()
    if not (folder.is_dir() and any(folder.glob("kafka_2.13-*.jar"))):
        raise KafkaBrokerError(
            f"Apache Kafka's jars are not in {folder}: run `make setup` in the Eventide checkout (it resolves "
            f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION} of jvm/kafka/pom.xml from Maven Central once), or "
            f"point {KAFKA_JARS_ENV} at a folder holding those jars"
        )
    return str(folder / "*")


def java_executable() -> str:
    """JAVA_HOME's java, else the one on PATH; KafkaBrokerError when there is none."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found:
        return found
    where = f"JAVA_HOME={home} has no bin/java and " if home else ""
    raise KafkaBrokerError(
        f"java not found: {where}there is no java on PATH. Kafka {KAFKA_VERSION} needs Java 17 or newer: "
        "install it (e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME to it"
    )


def new_cluster_id() -> str:
    """A cluster id as Kafka's `random-uuid` makes it: 16 random bytes, URL-safe base64 without padding,
    not starting with '-' (it would read as an option)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def check_port_free(port: int, what: str = "--port") -> None:
    """KafkaBrokerError naming the port when something listens on 127.0.0.1:`port` (bound as the JVM
    binds: SO_REUSEADDR, so a port in TIME_WAIT counts as free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOOPBACK, port))
        except OSError as e:
            raise KafkaBrokerError(
                f"port {port} on {LOOPBACK} is in use ({e.strerror}): another broker or program listens there. "
                f"Stop it, or pick another {what}"
            ) from None


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


# -- DIR: configuration and storage ------------------------------------------------------------------
def server_properties(folder: Path, port: int, controller_port: int) -> str:
    """KRaft combined mode (broker + controller, node 1) on 127.0.0.1 only; every replication setting 1."""
    data = Path(folder).absolute() / "data"
    return "\n".join([
        "# Written by `eventide kafka` at every start (transforms/kafka_broker.py); edits are overwritten.",
        "process.roles=broker,controller",
        f"node.id={NODE_ID}",
        f"controller.quorum.voters={NODE_ID}@{LOOPBACK}:{controller_port}",
        f"listeners=PLAINTEXT://{LOOPBACK}:{port},CONTROLLER://{LOOPBACK}:{controller_port}",
        f"advertised.listeners=PLAINTEXT://{LOOPBACK}:{port}",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name=PLAINTEXT",
        "controller.listener.names=CONTROLLER",
        f"log.dirs={data}",
        "num.partitions=1",
        "default.replication.factor=1",
        "min.insync.replicas=1",
        "offsets.topic.replication.factor=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        # One partition each for the internal topics, not 50: the first consumer group or transaction of a
        # fresh DIR does not wait for 50 partitions to be created and loaded (fewer files too).
        "offsets.topic.num.partitions=1",
        "transaction.state.log.num.partitions=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        # One member per group in development: no 3 s wait for more before the first assignment.
        "group.initial.rebalance.delay.ms=0",
        "",
    ])


LOG4J2_PROPERTIES = """\
# Written by `eventide kafka`: the broker logs to its standard output.
appender.out.type = Console
appender.out.name = out
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
# Quiet: the request log, every configuration object's dump of all its values (~1,000 lines a start),
# each partition's state changes.
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
"""


def is_formatted(folder: Path) -> bool:
    return (Path(folder) / "data" / "meta.properties").is_file()


def _java_args(java: str, jars: str, folder: Path, main: str, *args: str) -> list[str]:
    opts = (os.environ.get(JAVA_OPTS_ENV) or DEFAULT_JAVA_OPTS).split()
    log4j = (Path(folder).absolute() / "log4j2.properties").as_uri()
    return [java, *opts, f"-Dlog4j2.configurationFile={log4j}", "-cp", jars, main, *args]


def prepare(folder: Path, port: int, controller_port: int, java: str, jars: str,
            say: Callable[[str], None] = print) -> Path:
    """Write DIR's configuration for this start; format DIR/data with Kafka's StorageTool if it is not
    formatted yet (with DIR/cluster-id, made on first use). Returns server.properties' path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    props = folder / "server.properties"
    props.write_text(server_properties(folder, port, controller_port))
    (folder / "log4j2.properties").write_text(LOG4J2_PROPERTIES)
    if is_formatted(folder):
        return props
    id_file = folder / "cluster-id"
    cluster_id = id_file.read_text().strip() if id_file.is_file() else ""
    if not cluster_id:
        cluster_id = new_cluster_id()
        id_file.write_text(cluster_id + "\n")
    say(f"eventide kafka: formatting {folder / 'data'} (cluster id {cluster_id}), once")
    out = subprocess.run(_java_args(java, jars, folder, "kafka.tools.StorageTool", "format",
                                    "--cluster-id", cluster_id, "--config", str(props)),
                         stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if out.returncode != 0 or not is_formatted(folder):
        raise KafkaBrokerError(f"Kafka's StorageTool could not format {folder / 'data'} (exit {out.returncode}):\n"
                               + (out.stdout + out.stderr).strip()[-3000:])
    return props


# -- the foreground command ---------------------------------------------------------------------------
def _child_setup() -> Callable[[], None]:
    """What the JVM's process does before exec: default SIGTERM/SIGINT (a shell may start us with them
    ignored, and the JVM keeps an ignored signal ignored), and on Linux a SIGTERM when its parent dies (a
    kill -9 of `eventide kafka` still stops the broker cleanly instead of leaving it on the port and DIR).
    libc is loaded here, before the fork: the child only calls."""
    prctl = None
    if sys.platform.startswith("linux"):
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl

    def setup() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if prctl is not None:
            prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return setup


def run_broker(folder: Path, port: int, controller_port: int | None = None,
               say: Callable[[str], None] = print, stop_timeout: float = STOP_TIMEOUT_SECONDS) -> int:
    """Run the broker in the foreground until it exits or this process gets SIGTERM/SIGINT (forwarded to
    the JVM as SIGTERM: Kafka's shutdown hook stops the broker cleanly). Returns 0 after a stop asked by
    a signal; the JVM's exit code when it stopped otherwise; 1 when it outlived `stop_timeout` (killed)."""
    folder = Path(folder)
    jars = class_path()
    java = java_executable()
    check_port_free(port)
    if controller_port is None:
        controller_port = free_port()
        while controller_port == port:
            controller_port = free_port()
    elif controller_port == port:
        raise KafkaBrokerError(f"--controller-port {controller_port} is --port too: the controller needs its own")
    else:
        check_port_free(controller_port, "--controller-port")

    stopping: list[int] = []
    child: list[subprocess.Popen] = []

    def forward(signum, _frame) -> None:
        stopping.append(signum)
        if child and child[0].poll() is None:
            child[0].send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            props = prepare(folder, port, controller_port, java, jars, say)
        except KafkaBrokerError:
            if stopping:  # Ctrl-C in the terminal reaches the StorageTool too: a stop, not a failure
                return 0
            raise
        if stopping:
            return 0
        say(f"eventide kafka: Apache Kafka {KAFKA_VERSION} (KRaft, broker and controller) starting on "
            f"{LOOPBACK}:{port} (controller {LOOPBACK}:{controller_port}), data in {folder.absolute() / 'data'}")
        proc = subprocess.Popen(_java_args(java, jars, folder, "kafka.Kafka", str(props)),
                                stdin=subprocess.DEVNULL, preexec_fn=_child_setup())
        child.append(proc)
        if stopping:  # a signal between prepare and Popen
            proc.send_signal(signal.SIGTERM)
        threading.Thread(target=_announce, args=(proc, port, say), daemon=True).start()
        deadline = None
        while True:
            try:
                rc = proc.wait(0.2)
                break
            except subprocess.TimeoutExpired:
                if stopping and deadline is None:
                    deadline = time.monotonic() + stop_timeout
                if deadline is not None and time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    say(f"eventide kafka: the broker did not stop within {stop_timeout:.0f} s of the signal: killed")
                    return 1
        # After SIGTERM the JVM exits 143 (128 + 15) once Kafka's shutdown hook has stopped the broker.
        if stopping and rc in (0, 128 + signal.SIGTERM, 128 + signal.SIGINT, -signal.SIGTERM):
            say(f"eventide kafka: stopped (broker exit code {rc})")
            return 0
        if stopping:
            say(f"eventide kafka: the broker failed while stopping, exit code {rc} (its log is above)")
            return rc
        say(f"eventide kafka: the broker exited by itself, with code {rc} (its log is above)")
        return rc
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _announce(proc: subprocess.Popen, port: int, say: Callable[[str], None]) -> None:
    while proc.poll() is None:
        if _port_open(port):
            say(f"eventide kafka: listening on {LOOPBACK}:{port} (bootstrap.servers={LOOPBACK}:{port}); "
                "Ctrl-C or SIGTERM stops it")
            return
        time.sleep(0.2)


# -- a broker for tests ---------------------------------------------------------------------------------
def _default_signals() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass
class BrokerProcess:
    """`eventide kafka` running in a subprocess (its output in `log`)."""

    folder: Path
    port: int
    log: Path
    proc: subprocess.Popen = field(repr=False)
    java_pid: int | None = None  # the JVM, once wait_ready has seen it

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def bootstrap_servers(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            text = []
        state = "running" if self.proc.poll() is None else f"exited {self.proc.returncode}"
        return f"--- eventide kafka ({state}), last lines of {self.log}:\n" + "\n".join(text[-lines:])

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until the broker answers a client's metadata request naming itself; KafkaBrokerError with the
        log's tail when it exits or the time is up."""
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        admin = None
        while True:
            if self.proc.poll() is not None:
                raise KafkaBrokerError(f"eventide kafka exited before the broker was ready\n{self.tail()}")
            if time.monotonic() > deadline:
                raise KafkaBrokerError(f"the broker on {self.bootstrap_servers} was not ready after "
                                       f"{timeout:.0f} s\n{self.tail()}")
            if _port_open(self.port):
                admin = admin or AdminClient({"bootstrap.servers": self.bootstrap_servers})
                try:
                    if NODE_ID in admin.list_topics(timeout=2).brokers:
                        break
                except Exception:  # KafkaException: not answering yet
                    pass
            time.sleep(0.2)
        javas = [p for p in live_children(self.pid) if _comm(p) == "java"]
        self.java_pid = javas[0] if javas else None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Signal `eventide kafka` by PID and wait for it (SIGKILL to it and its JVM after `timeout`);
        returns its exit code."""
        if self.proc.poll() is None:
            os.kill(self.pid, sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            for pid in [self.pid, *([self.java_pid] if self.java_pid else [])]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.wait()
            raise KafkaBrokerError(f"eventide kafka did not exit within {timeout:.0f} s of signal {sig}: "
                                   f"killed\n{self.tail()}") from None

    def __enter__(self) -> BrokerProcess:
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.stop()


def _comm(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


def start_broker(folder: Path, port: int | None = None, timeout: float = 60.0,
                 command: list[str] | None = None) -> BrokerProcess:
    """`eventide kafka --port PORT --dir FOLDER` in a subprocess (PORT: a free one), its output in
    FOLDER.log, ready when this returns (else KafkaBrokerError with the log's tail, the process stopped).
    `command`: how to run `eventide` (default: this Python's `-m orchestration.cli`)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    log = folder.with_name(folder.name + ".log")
    argv = [*(command or [sys.executable, "-m", "orchestration.cli"]), "kafka", "--port", str(port),
            "--dir", str(folder)]
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=_default_signals)
    broker = BrokerProcess(folder, port, log, proc)
    try:
        broker.wait_ready(timeout)
    except BaseException:
        if proc.poll() is None:
            try:
                broker.stop(timeout=30)
            except KafkaBrokerError:
                pass  # killed; the error that matters is the one being raised
        raise
    return broker
