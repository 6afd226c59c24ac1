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
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse

from transforms.files import fsync_dir
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


def _latest_compact(folder: Path) -> int:
    """The batch of a metadata log's latest compacted file (-1: none yet)."""
    compacts = [int(p.name[: -len(".compact")]) for p in folder.iterdir()
                if p.name.endswith(".compact") and p.name[: -len(".compact")].isdigit()] if folder.is_dir() else []
    return max(compacts, default=-1)


def _entry(line: str) -> tuple[int, str] | None:
    """(batch id, file name) of a file source's log entry; None if it is not one."""
    try:
        entry = json.loads(line)
        return int(entry["batchId"]), unquote(entry["path"].rsplit("/", 1)[-1])  # a URL's last part: its name
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _source_entries(folder: Path) -> list[tuple[int, str]]:
    """(batch id, file name) of every file a file source's metadata log lists: the latest compacted
    file (which holds every entry up to its batch) and the batch files after it."""
    start = _latest_compact(folder)
    files = [folder / f"{start}.compact"] if start >= 0 else []
    files += [folder / str(b) for b in batch_ids(folder) if b > start]
    return [e for path in files for line in _log_lines(path) if (e := _entry(line)) is not None]


def _first_segment(checkpoint: Path) -> tuple[int, Path] | None:
    """(index of the source that reads the landing, the first segment its metadata log names): the first
    source whose log names a landing segment (a query with timers also reads Spark's rate-micro-batch
    clock, whose log names none). Reads each log file only up to its first such entry."""
    sources = checkpoint / "sources"
    for index in batch_ids(sources):
        for path in sorted((sources / str(index)).iterdir(), key=lambda p: p.name):
            for line in _log_lines(path) if not path.name.startswith(".") else ():
                try:
                    file = Path(unquote(urlparse(json.loads(line)["path"]).path))
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue
                if parse_segment_name(file.name):
                    return index, file
    return None


def _landing_source(checkpoint: Path) -> tuple[int, list[tuple[int, str]]] | None:
    """The index and entries of the source that reads the landing (see _first_segment)."""
    found = _first_segment(checkpoint)
    return None if found is None else (found[0], _source_entries(checkpoint / "sources" / str(found[0])))


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


def forget_source_files(checkpoint: Path, forget: Callable[[str], bool]) -> tuple[int, int]:
    """Drop from the landing source's metadata log the entries of the files `forget(name)` says the query
    will never list again; returns (entries in the compacted file before, entries dropped). Call it only
    while no query runs on the checkpoint.

    Spark's file source keeps every file it ever read in that log (its compaction keeps every entry),
    rewrites the whole list every tenth batch and loads it at every start. Only the latest compacted
    file is rewritten (it holds every entry up to its batch; the batch files after it hold nine batches
    at most), and the entries of the source's last two committed batches and any later one are kept:
    at a restart Spark plans the last committed batch again and runs one planned but not committed.
    The rewrite is a new file renamed over the old one; Hadoop's checksum file of the old content goes
    first, so no reader checks the new content against it (a file without one is not checked)."""
    committed = batch_ids(checkpoint / "commits")
    found = _first_segment(checkpoint) if committed else None
    if found is None:
        return 0, 0
    index = found[0]
    folder = checkpoint / "sources" / str(index)
    compact = _latest_compact(folder)
    if compact < 0:
        return 0, 0
    upto = _file_source_offset(checkpoint, committed[-1], index)
    upto = committed[-1] if upto is None else upto
    path = folder / f"{compact}.compact"
    lines = path.read_text().splitlines()
    if not lines or not lines[0].startswith("v"):
        return 0, 0
    kept = [lines[0]] + [line for line in lines[1:]
                         if (e := _entry(line)) is None or e[0] >= upto - 1 or not forget(e[1])]
    dropped = len(lines) - len(kept)
    if dropped:
        tmp = folder / f".{path.name}.eventide-trim"  # a name Spark's log does not list
        with tmp.open("w") as out:
            out.write("\n".join(kept))
            out.flush()
            os.fsync(out.fileno())
        (folder / f".{path.name}.crc").unlink(missing_ok=True)
        fsync_dir(folder)
        os.replace(tmp, path)
        fsync_dir(folder)
    return len(lines) - 1, dropped


def file_list_bytes(checkpoint: Path) -> int:
    """The size of a checkpoint's file sources' latest compacted logs: what a start loads, and what each
    tenth batch rewrites (see forget_source_files)."""
    sources = checkpoint / "sources"
    return sum((sources / str(i) / f"{c}.compact").stat().st_size
               for i in batch_ids(sources) if (c := _latest_compact(sources / str(i))) >= 0)


def has_commits(checkpoint: Path) -> bool:
    return bool(batch_ids(checkpoint / "commits"))


def landing_log_of(checkpoint: Path) -> str | None:
    """The landing log a checkpoint's file source reads (the folder of the files it lists), or None."""
    found = _first_segment(checkpoint)
    return None if found is None else found[1].parent.name


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
