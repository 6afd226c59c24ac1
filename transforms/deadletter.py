"""The dead-letter queue: the quarantined messages still waiting, and their replay after a fix. No Dagster.

The `quarantine` table holds one row per (stream, seq, step) that failed (transforms/engine/sinks.py).
The dead-letter view is those rows minus the replayed ones: a row whose (stream, seq) is in
`quarantine_replays` was sent through again, and if it failed again it is back under its new seq with
its new reason.

Replay re-lands each selected payload in the log (the landing folder or Kafka) as a new message (a new seq; connection
`replay:<original seq>`), so the current decoders and every pipeline see it as they see any message,
exactly once. The log itself is the record of what was replayed: before landing, replay reads
the `replay:` connections already landed and skips those messages, so a rerun, or a rerun after a crash
between landing and recording, never lands a message twice; then it records every landed replay in
`quarantine_replays` (insert-only, keyed by (stream, original_seq)). The pipelines then run as usual.

What is replayed: rows rejected by a decoder. A decoder belongs to its stream, so every query reading
the stream rejected the payload and nothing has it yet. Not replayed, and said so:
- step `gateway`: bytes the gateway could not frame (an oversized or cut-off frame, a torn journal
  tail). They are not one message; fix the sender and send the data again.
- any later step (a computation, key_by, a state computation, a sink's schema): the message was decoded,
  so it is in bronze and in every other app reading the stream; landing it again would count it twice
  there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from transforms import lake
from transforms.engine.sinks import QUARANTINE_TABLE
from transforms.ingestion import open_log
from transforms.settings import Settings

REPLAYS_TABLE = "quarantine_replays"
REPLAYS_SCHEMA = pa.schema(
    [
        ("stream", pa.string()),
        ("original_seq", pa.int64()),  # the quarantined message
        ("new_seq", pa.int64()),  # the same payload, landed again
        ("replayed_at", pa.timestamp("us", tz="UTC")),
    ]
)
REPLAY_CONNECTION = "replay:"  # + the original seq: the landing log's record of a replay
GATEWAY_STEP = "gateway"
DECODER_STEP = "decoder "  # + the decoder's name (transforms/engine/stages.py)
_GOT = ", got "


def reason_group(reason: str | None) -> str:
    """A reason without its per-message detail, to count by. Reasons read "<what>: expected X, got Y"
    (the bundled decoders, framing): the group keeps "expected X" and drops what came. Other reasons
    (a user function's error) are grouped by their first line as is."""
    if not reason:
        return ""
    first = reason.splitlines()[0]
    cut = first.find(_GOT)
    return first[:cut] + _GOT + "..." if cut >= 0 else first


def replay_blocker(step: str) -> str | None:
    """Why a quarantine row of this step is not replayed, or None if it is."""
    if step.startswith(DECODER_STEP):
        return None
    if step == GATEWAY_STEP:
        return ("bytes the gateway could not frame (oversized or cut off) are not one message: "
                "fix the sender and send the data again")
    return (f"the message was decoded and failed later ({step}): it is in bronze and in every other app "
            "reading its stream, so landing it again would count it twice there")


# -- the view ----------------------------------------------------------------------------------------
def replays(settings: Settings) -> pa.Table:
    path = settings.table_path(REPLAYS_TABLE)
    return lake.read(path) if lake.exists(path) else REPLAYS_SCHEMA.empty_table()


def dead_letters(settings: Settings, stream: str | None = None, reason: str | None = None) -> pa.Table:
    """The quarantine rows not replayed, by seq; `stream` exact, `reason` a substring (any case)."""
    path = settings.table_path(QUARANTINE_TABLE)
    if not lake.exists(path):
        return pa.table({})
    rows = lake.read(path)
    done = replays(settings).select(["stream", "original_seq"]).rename_columns(["stream", "seq"])
    if done.num_rows:
        rows = rows.join(done, ["stream", "seq"], join_type="left anti")
    if stream is not None:
        rows = rows.filter(pc.equal(rows.column("stream"), stream))
    if reason:
        rows = rows.filter(pc.fill_null(pc.match_substring(rows.column("reason"), reason, ignore_case=True), False))
    return rows.sort_by([("seq", "ascending"), ("step", "ascending")]) if rows.num_rows else rows


def counts(rows: pa.Table) -> list[dict]:
    """Dead letters by stream, step and reason group, most first."""
    out: dict[tuple[str, str, str], int] = {}
    if rows.num_rows:
        for s, st, r in zip(*(rows.column(c).to_pylist() for c in ("stream", "step", "reason"))):
            key = (s, st, reason_group(r))
            out[key] = out.get(key, 0) + 1
    return [{"stream": s, "step": st, "reason": r, "messages": n, "replayable": replay_blocker(st) is None}
            for (s, st, r), n in sorted(out.items(), key=lambda kv: (-kv[1], kv[0]))]


# -- replay ------------------------------------------------------------------------------------------
@dataclass
class ReplayResult:
    selected: int = 0
    landed: dict[tuple[str, int], int] = field(default_factory=dict)  # (stream, original seq) -> new seq
    already_landed: int = 0  # selected, but a replay of it was landed before (a rerun)
    recorded: int = 0  # rows added to quarantine_replays (landed now, or before a crash)
    skipped: dict[str, int] = field(default_factory=dict)  # why not replayed -> rows


def landed_replays(settings: Settings) -> pa.Table:
    """Every replay in the log: (stream, original_seq, new_seq, replayed_at)."""
    parts = []
    log = open_log(settings)
    for group in sorted(settings.registry.logs):
        t = log.read(group, columns=["stream", "seq", "receive_time", "connection"])
        t = t.filter(pc.starts_with(t.column("connection"), REPLAY_CONNECTION))
        if t.num_rows:
            original = pc.cast(pc.utf8_slice_codeunits(t.column("connection"), len(REPLAY_CONNECTION)), pa.int64())
            parts.append(pa.table([t.column("stream"), original, t.column("seq"),
                                   t.column("receive_time").cast(pa.timestamp("us", tz="UTC"))], schema=REPLAYS_SCHEMA))
    return pa.concat_tables(parts) if parts else REPLAYS_SCHEMA.empty_table()


def _record(settings: Settings) -> int:
    """Record every landed replay in quarantine_replays (those already there are kept); rows added."""
    landed = landed_replays(settings)
    path = settings.table_path(REPLAYS_TABLE)
    before = lake.count(path)
    if not landed.num_rows or before == landed.num_rows:
        return 0
    from transforms.spark import get_spark

    last = lake.committed_batch(path, REPLAYS_TABLE)
    rows = get_spark(settings).createDataFrame(landed)
    lake.merge_once(rows, path, ["stream", "original_seq"], REPLAYS_TABLE, 0 if last is None else last + 1, update=False)
    return lake.count(path) - before


def replay(settings: Settings, stream: str | None = None, reason: str | None = None) -> ReplayResult:
    """Land the selected dead letters again as new messages, once each, and record them. The pipelines
    are not run here (orchestration/deadletter.py runs them)."""
    rows = dead_letters(settings, stream, reason)
    result = ReplayResult(selected=rows.num_rows)
    wanted = []
    for r in rows.to_pylist() if rows.num_rows else []:
        why = replay_blocker(r["step"])
        if why is None:
            wanted.append(r)
        else:
            result.skipped[why] = result.skipped.get(why, 0) + 1
    if wanted:
        # Opening the writer first: the landing's turns a crashed run's journal into a segment, which the
        # scan then sees. Closing it flushes (segments closed, or every message acknowledged by Kafka).
        keys = []
        with open_log(settings).writer() as writer:
            done = set(zip(*(landed_replays(settings).column(c).to_pylist() for c in ("stream", "original_seq"))))
            for r in wanted:
                if (r["stream"], r["seq"]) in done:
                    result.already_landed += 1
                    continue
                done.add((r["stream"], r["seq"]))
                writer.append(r["stream"], r["payload"], f"{REPLAY_CONNECTION}{r['seq']}")
                keys.append((r["stream"], r["seq"]))
        if keys:  # their new sequence numbers, as the log gave them
            replays = landed_replays(settings)
            new = dict(zip(zip(replays.column("stream").to_pylist(), replays.column("original_seq").to_pylist()),
                           replays.column("new_seq").to_pylist()))
            result.landed = {k: new[k] for k in keys if k in new}
    result.recorded = _record(settings)
    return result
