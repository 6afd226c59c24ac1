"""The console of a command that runs Dagster steps in its own process (`eventide run`, the demo, replay).

Kept apart from the runner so that a command can take the console before it imports Dagster or starts
the JVM: both redirect this process's standard output for a while (Dagster a step's, the JVM's start
to the Spark log).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def console() -> Iterator[Callable[[str], None]]:
    """A `progress` for `run_all` that writes each line to this process's standard output as it is now,
    through a descriptor of its own, so a line said inside a Dagster step reaches the console at once
    and in order. Dagster captures a step's own output and mirrors it to the console through `tail -F`,
    which polls each second and is stopped when the step ends: a line it has not read by then never
    reaches the console (dagster-io/dagster#23336; a test under load saw none of a run's query lines)."""
    sys.stdout.flush()
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1, encoding="utf-8", errors="replace")

    def say(line: str) -> None:
        sys.stdout.flush()  # whatever this process printed before, first
        out.write(f"{line}\n")
        out.flush()

    try:
        yield say
    finally:
        out.close()
