"""`eventide quarantine`: the dead-letter queue (transforms/deadletter.py) on the command line.

    eventide quarantine                        counts by stream, step and reason group
    eventide quarantine --reason R --stream S  the rows of that selection, payloads in base64
    eventide quarantine replay [--stream S] [--reason R]
                                               land the selection again, then run the pipelines
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

import pyarrow as pa

from transforms.deadletter import REPLAYS_TABLE, counts, dead_letters, replay
from transforms.settings import Settings

ROW_COLUMNS = ("seq", "stream", "step", "reason", "payload_base64")


def _table(rows: list[dict], columns: list[str]) -> str:
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines += ["  ".join(str(r[c]).ljust(w) for c, w in zip(columns, widths)).rstrip() for r in rows]
    return "\n".join(lines) + "\n"


def row_records(rows: pa.Table) -> list[dict]:
    """The rows as the CLI shows them: the payload's exact bytes in base64, under a name that says so."""
    return [{"seq": r["seq"], "stream": r["stream"], "step": r["step"], "reason": r["reason"],
             "payload_base64": base64.b64encode(r["payload"] or b"").decode("ascii")} for r in rows.to_pylist()]


def show_quarantine(settings: Settings, stream: str | None, reason: str | None, fmt: str = "table",
                    limit: int | None = None) -> str:
    rows = dead_letters(settings, stream, reason)
    if stream is None and reason is None:  # the overview
        by = counts(rows)
        if fmt == "json":
            return "".join(json.dumps(r) + "\n" for r in by)
        if not by:
            return "the dead-letter queue is empty\n"
        shown = [{**r, "replayable": "yes" if r["replayable"] else "no"} for r in by]
        return (_table(shown, ["messages", "stream", "step", "replayable", "reason"])
                + f"{rows.num_rows} message(s) waiting. The rows: --stream S and/or --reason TEXT; "
                "after a fix: `eventide quarantine replay` (same selection options)\n")
    records = row_records(rows)
    more = len(records) - limit if limit is not None and len(records) > limit else 0
    records = records[:limit] if more else records
    if fmt == "json":
        return "".join(json.dumps(r) + "\n" for r in records)
    if not records:
        return "no dead letters match\n"
    return _table(records, list(ROW_COLUMNS)) + (f"... {more} more (--limit)\n" if more else "")


def replay_and_run(settings: Settings, stream: str | None, reason: str | None,
                   progress: Callable[[str], None] = print) -> int:
    """Replay the selection, then run everything (`eventide run`) so the replayed messages go through.
    Returns the exit status: non-zero when the run failed or a check did."""
    from orchestration.runner import run_all

    result = replay(settings, stream, reason)
    progress(f"selected {result.selected} dead letter(s)")
    for why, n in result.skipped.items():
        progress(f"  not replayed: {n}: {why}")
    if result.already_landed:
        progress(f"  {result.already_landed} already landed again by an earlier replay (not landed twice)")
    if result.landed:
        progress(f"  landed {len(result.landed)} again as new messages: "
                 + ", ".join(f"{s} {old} -> {new}" for (s, old), new in sorted(result.landed.items())[:10])
                 + (" ..." if len(result.landed) > 10 else ""))
    if not result.landed and not result.recorded:
        progress("nothing to replay")
        return 0
    progress(f"  recorded in {REPLAYS_TABLE}: {result.recorded}; running the pipelines ...")
    summary = run_all(settings, progress=lambda line: progress(f"  {line}"))
    still = dead_letters(settings, stream)
    again = [r for r in row_records(still) if r["seq"] in set(result.landed.values())]
    for r in again:
        progress(f"  still failing: {r['stream']} seq {r['seq']}: {r['step']}: {r['reason']}")
    progress(f"replayed {len(result.landed)}: {len(result.landed) - len(again)} went through, {len(again)} failed again "
             "(in the dead-letter queue under their new seq)")
    for f in summary.check_failures:
        progress("\n".join(f.lines()))
    for f in summary.failures:
        progress(f"error: {f}")
    return 0 if summary.passed else 1
