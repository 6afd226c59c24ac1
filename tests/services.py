"""A service in a child process of its own, for the tests that start one: the gateway alone
(`serve_forever`) or a command such as `eventide serve`."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from transforms.processes import local_processes

# What tests/conftest.py sets to make the tests' JVMs cheaper: kept in every process a test starts, also
# where it gives the process a clean EVENTIDE_ environment.
TEST_SPEED_SETTINGS = ("EVENTIDE_SPARK_JAVA_OPTIONS", "EVENTIDE_SPARK_CONF")


def clean_env() -> dict[str, str]:
    """This process's environment without its EVENTIDE_ settings (each test names its own), except the
    tests' JVM speed settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith("EVENTIDE_") or k in TEST_SPEED_SETTINGS}


SERVE = (
    "from transforms.ingestion.gateway import serve_forever; from transforms.settings import Settings; "
    "serve_forever(Settings.from_env(), progress_interval=0.2)"
)


class Service:
    """`serve_forever` (or the command `argv`, e.g. `eventide serve`) in a child process, its output
    collected by a thread. In a session of its own: whatever a test leaves running (a failed assert
    before its stop) is killed with its JVM and workers after the test (tests/conftest.py)."""

    live: list[Service] = []

    def __init__(self, env: dict[str, str], cwd: Path, argv: list[str] | None = None):
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        self.proc = subprocess.Popen(
            argv or [sys.executable, "-c", SERVE],
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            # The test runner may run with SIGTERM ignored; children inherit dispositions.
            preexec_fn=lambda: (
                signal.signal(signal.SIGTERM, signal.SIG_DFL),
                signal.signal(signal.SIGINT, signal.SIG_DFL),
            ),
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        Service.live.append(self)

    def java_command_lines(self) -> list[str]:
        """The command lines of the JVMs in the service's session (Spark's driver and its launcher)."""
        lines = []
        for process in local_processes():
            if process.ppid == self.proc.pid and (cmdline := process.cmdline()) and cmdline[0].endswith(b"java"):
                lines.append(b" ".join(cmdline).decode(errors="replace"))
        return lines

    def kill_all(self) -> None:
        """SIGKILL to the service's whole session (its JVM and Python workers too), if any is left."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for_line(self, start: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(min(remaining, 1.0), 0.01))
            except queue.Empty:
                if remaining > 1.0 and self.proc.poll() is None:
                    continue
                raise AssertionError(f"no line starting {start!r} (exit code {self.proc.poll()}); "
                                     f"output so far: {self.output}") from None
            self.output.append(line)
            if line.startswith(start):
                return line

    def stop(self, sig: int) -> int:
        os.kill(self.proc.pid, sig)
        code = self.proc.wait(30)
        # Its last lines may still be in the pipe when it exits: the reader queues them up to EOF.
        self._reader.join(10)
        return code
