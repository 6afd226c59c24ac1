"""A streaming query's checkpoint, read without Spark: which landing segments its committed batches
processed (for `eventide status` and for archiving what every query has committed).

`commits/<batch>` files say which batches committed; the offset log `offsets/<batch>` gives, per
source, how far a batch read (the file source's offset is `{"logOffset": n}`: its own batch counter,
which falls behind the query's batch ids when the query also reads the timer clock); the file source's
metadata log `sources/<i>/<n>` (and `<n>.compact`, every 10 entries) names the files of each of its
batches.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse

from transforms.ingestion.segments import parse_segment_name


def batch_ids(folder: Path) -> list[int]:
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def clear_unplanned(checkpoint: Path) -> None:
    """Remove what a process killed before the checkpoint's first batch was planned left behind.

    Spark writes `offsets/0` to a hidden temp file and renames it; killed in between, the temp file (and
    its checksum) stays. Without an `offsets/<n>` file the query starts at batch 0, and Spark then
    refuses any file in offsets/, commits/ or state/ (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY) on
    every restart. Nothing in them can be committed while no batch was planned, so they go."""
    if batch_ids(checkpoint / "offsets"):
        return
    for name in ("offsets", "commits", "state"):
        if (checkpoint / name).is_dir():
            shutil.rmtree(checkpoint / name)


def _log_lines(path: Path) -> list[str]:
    """The entries of a Spark metadata log file (`v1`, then one entry a line); [] if unreadable."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    return lines[1:] if lines and lines[0].startswith("v") else []


def _source_entries(folder: Path) -> list[tuple[int, str]]:
    """(batch id, file name) of every file a file source's metadata log lists: the latest compacted
    file (which holds every entry up to its batch) and the batch files after it."""
    compacts = [int(p.name[: -len(".compact")]) for p in folder.iterdir()
                if p.name.endswith(".compact") and p.name[: -len(".compact")].isdigit()]
    start = max(compacts, default=-1)
    files = [folder / f"{start}.compact"] if start >= 0 else []
    files += [folder / str(b) for b in batch_ids(folder) if b > start]
    out = []
    for path in files:
        for line in _log_lines(path):
            try:
                entry = json.loads(line)
                out.append((int(entry["batchId"]), Path(unquote(urlparse(entry["path"]).path)).name))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
    return out


def _landing_source(checkpoint: Path) -> tuple[int, list[tuple[int, str]]] | None:
    """The index and entries of the source that reads the landing: the one whose metadata log lists
    landing segments (a query with timers also reads Spark's rate-micro-batch clock, which has none)."""
    sources = checkpoint / "sources"
    for index in batch_ids(sources):
        entries = _source_entries(sources / str(index))
        if any(parse_segment_name(name) for _, name in entries):
            return index, entries
    return None


def _file_source_offset(checkpoint: Path, batch: int, index: int) -> int | None:
    """The file source's offset (`logOffset`) in the offset log of `batch`: the source at `index` if
    that is a file source offset, else the only file source offset there; None if unknown."""
    lines = _log_lines(checkpoint / "offsets" / str(batch))[1:]  # after the batch metadata line
    found = []
    for line in lines:
        try:
            value = json.loads(line)
        except ValueError:
            value = None
        found.append(value["logOffset"] if isinstance(value, dict) and "logOffset" in value else None)
    if index < len(found) and found[index] is not None:
        return int(found[index])
    offsets = [f for f in found if f is not None]
    return int(offsets[0]) if len(offsets) == 1 else None


def processed_segments(checkpoint: Path) -> tuple[int | None, set[str]]:
    """(last committed batch, names of the landing segments processed by it), from a checkpoint."""
    committed = batch_ids(checkpoint / "commits")
    if not committed:
        return None, set()
    last = committed[-1]
    source = _landing_source(checkpoint)
    if source is None:
        return last, set()
    index, entries = source
    # The offset log maps the query's batch to the file source's own batch counter; without it (never
    # seen), the two counters are assumed equal (true for a query without timers).
    upto = _file_source_offset(checkpoint, last, index)
    upto = last if upto is None else upto
    return last, {name for batch, name in entries if batch <= upto and parse_segment_name(name)}


def has_commits(checkpoint: Path) -> bool:
    return bool(batch_ids(checkpoint / "commits"))


def landing_log_of(checkpoint: Path) -> str | None:
    """The landing log a checkpoint's file source reads (the folder of the files it lists), or None."""
    sources = checkpoint / "sources"
    for index in batch_ids(sources):
        folder = sources / str(index)
        for path in sorted(folder.iterdir(), key=lambda p: p.name):
            for line in _log_lines(path):
                try:
                    file = Path(unquote(urlparse(json.loads(line)["path"]).path))
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue
                if parse_segment_name(file.name):
                    return file.parent.name
    return None


def latest_checkpoints(root: Path) -> list[Path]:
    """The checkpoint of every query under `root` (`<query>/v<generation>`): its latest generation only
    (an older one was abandoned by a recompute)."""
    out = []
    for query in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else ():
        generations = [(int(g.name[1:]), g) for g in query.iterdir() if g.name[:1] == "v" and g.name[1:].isdigit()]
        if generations:
            out.append(max(generations)[1])
    return out


# Spark's error class when a checkpoint's stateful operators are not the query's (state metadata).
OPERATORS_CHANGED = "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA"


def explain_checkpoint_error(error: BaseException | str, plan) -> str | None:
    """What to do when Spark refuses a query's checkpoint because the app's stateful steps changed
    under it (a level added, removed or reordered), else None. `plan` is the query's QueryPlan."""
    if OPERATORS_CHANGED not in str(error):
        return None
    levels = 1 + len(plan.levels) if plan.keyed else 0
    return (
        f"the stateful steps of {plan.name!r} changed since its checkpoint (checkpoints/{plan.name}/v{plan.generation}) "
        f"was started; the pipeline now has {levels} level(s) of keyed state, and Spark keeps each level's state in "
        "an operator of its own, which an existing checkpoint cannot gain, lose or reorder. Restore the pipeline as "
        f"it was, or start a new generation, Application({plan.app!r}, ..., generation={plan.generation + 1}): a fresh "
        "checkpoint that processes the whole log again. Delta takes the new generation for a new writer, so give "
        "its append sinks new tables (or remove the old ones first), else their rows are written twice"
    )
