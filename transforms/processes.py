"""Facts about local processes, from /proc."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class LocalProcess:
    """One process as /proc showed it: its state letter ("Z" for a zombie) and its parent; its command
    line and environment are read when asked (empty once it is gone, or when they are not ours to read)."""

    pid: int
    state: str
    ppid: int

    @property
    def zombie(self) -> bool:
        return self.state == "Z"

    def cmdline(self) -> list[bytes]:
        return self._nul_separated("cmdline")

    def environ(self) -> list[bytes]:
        return self._nul_separated("environ")

    def _nul_separated(self, name: str) -> list[bytes]:
        try:
            data = (PROC / str(self.pid) / name).read_bytes()
        except OSError:
            return []
        return data.rstrip(b"\0").split(b"\0") if data else []


def _stat(pid: int) -> LocalProcess | None:
    try:
        # The command name (in parentheses) may hold spaces and parentheses: split after the last one.
        state, ppid = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[:2]
    except (OSError, IndexError, ValueError):
        return None
    return LocalProcess(pid, state, int(ppid))


def local_processes() -> Iterator[LocalProcess]:
    """Every process /proc shows now, zombies included; one that exits meanwhile is left out."""
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (process := _stat(int(entry.name))) is not None:
            yield process


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is not)."""
    process = _stat(pid)
    return process is not None and not process.zombie


def live_children(pid: int) -> list[int]:
    """The live child processes of `pid` (zombies left out)."""
    return [p.pid for p in local_processes() if p.ppid == pid and not p.zombie]
