"""Facts about local processes, from /proc."""

from __future__ import annotations

from pathlib import Path


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is not)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
