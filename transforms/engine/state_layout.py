"""How a checkpoint groups its keyed state: by key, or by a hash bucket of the key (see keyed_state.py).
A checkpoint keeps the layout it started with, recorded in a file of its own."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

from transforms.engine.plan import QueryPlan
from transforms.files import write_text_atomic

STATE_BUCKETS = 64  # part of a bucketed checkpoint's layout: fixed once it has state


class StateLayout(str, Enum):
    KEY = "key"
    BUCKET = f"bucket-{STATE_BUCKETS}"


LAYOUT_FILE = "eventide-state-layout"


def state_layout(plan: QueryPlan, checkpoint: Path, wanted: str = "bucket") -> StateLayout:
    """The checkpoint's layout of keyed state: what it started with (written into it on first use).
    A new checkpoint gets `wanted` ("bucket" or "key"), or "key" if the plan has timers; one that has
    planned a batch but has no record predates buckets, so it stays grouped by key."""
    record = checkpoint / LAYOUT_FILE
    try:
        return StateLayout(record.read_text().strip())
    except FileNotFoundError:
        pass
    except ValueError as e:
        raise ValueError(f"{record}: unknown state layout {record.read_text().strip()!r} (expected one of "
                         f"{[m.value for m in StateLayout]}); restore the file or start a new generation") from e
    started = (checkpoint / "offsets").is_dir() and any((checkpoint / "offsets").iterdir())
    layout = StateLayout.KEY if plan.timers or started or wanted == "key" else StateLayout.BUCKET
    write_text_atomic(record, layout.value + "\n")  # a crash never leaves half a record
    return layout
