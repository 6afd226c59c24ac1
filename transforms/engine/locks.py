"""One writer per checkpoint: a lock file per query under `<home>/locks`, held while a process runs
the query (`eventide run`, a Dagster run, `eventide serve`).

An exclusive `flock`, so a crashed holder releases it with its process. The file says who holds it
(pid, command, since) for the message the next one gets.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import sys
import time
from pathlib import Path

from transforms.settings import Settings


class QueryBusy(RuntimeError):
    """Another process runs this query; `holder` says who."""

    def __init__(self, query: str, holder: str):
        self.query, self.holder = query, holder
        super().__init__(f"query {query!r} is being run by {holder}; it processes everything landed, so this "
                         "run skips it (stop that process to run it here)")


def lock_path(settings: Settings, query: str) -> Path:
    return settings.home / "locks" / f"{query}.lock"


def holder_of(settings: Settings, query: str) -> dict | None:
    """Who holds the query's lock now (pid, command, since), or None. Read without taking the lock: the
    holder writes the file when it takes it and empties it when it lets go; a holder that died is not
    alive."""
    holder = holder_of_path(lock_path(settings, query))
    return holder if holder and _alive(holder.get("pid", -1)) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, TypeError):
        return True
    return True


def describe(holder: dict | None) -> str:
    if not holder:
        return "another process"
    return f"{holder.get('command', 'a process')} (pid {holder.get('pid', '?')}, since {holder.get('since', '?')})"


class QueryLock:
    """The lock of one query, taken with `try_acquire` or `acquire` and given back with `release`."""

    def __init__(self, settings: Settings, query: str, command: str | None = None):
        self.query = query
        self.path = lock_path(settings, query)
        self.command = command or _command()
        self._file = None

    @property
    def held(self) -> bool:
        return self._file is not None

    def try_acquire(self) -> bool:
        if self.held:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return False
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"pid": os.getpid(), "command": self.command,
                            "since": dt.datetime.now().isoformat(timespec="seconds")}))
        f.flush()
        self._file = f
        return True

    def acquire(self, wait_seconds: float = 0.0, poll_seconds: float = 0.2) -> None:
        """Take the lock, waiting up to `wait_seconds`; QueryBusy (saying who holds it) if still held."""
        deadline = time.monotonic() + wait_seconds
        while not self.try_acquire():
            if time.monotonic() >= deadline:
                raise QueryBusy(self.query, describe(holder_of_path(self.path)))
            time.sleep(poll_seconds)

    def release(self) -> None:
        if self._file is not None:
            self._file.seek(0)
            self._file.truncate()
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def holder_of_path(path: Path) -> dict | None:
    with contextlib.suppress(OSError, ValueError):
        return json.loads(path.read_text() or "{}")
    return None


def _command() -> str:
    argv = [os.path.basename(sys.argv[0]), *sys.argv[1:3]] if sys.argv and sys.argv[0] else ["python"]
    return " ".join(argv)
