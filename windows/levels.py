"""Windows into windows, as plain Python: the reference form of a multi-level pipeline.

In a pipeline, a level is a key and the state step after it (`transforms.api.Pipeline.levels`); each
level's outputs are the next level's messages, e.g. per key 50 ms event-time sums, then 1 s sums of
those (Wallaroo's `multi_aggregation`). `reference_levels` runs the levels one after the other, each
over its whole input at once, key by key, and hands the next level the outputs in the engine's order:
by the input message each answers (its landing sequence number), then by the key that produced them
(one input's outputs from several keys: key by key), then the order that key produced them.

`reference_event_time_windows` is one key's tumbling or sliding event-time windows found by brute
force over the key's whole input (each message's watermark taken from the messages before it), not
by `EventTimeWindows`' incremental state: `event_time_level` makes it a level.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from windows.core import Aggregator, CloseReason, WindowResult

# One level: (key, run). `key`: a function of a message giving its key at this level, or None for the
# key the previous level gave it. `run(key, inputs)`: one key's whole input, [(seq, message)] in order,
# to its outputs in the order it produces them, each as (index in `inputs` of the message it answers, output).
Run = Callable[[str, list[tuple[int, Any]]], list[tuple[int, Any]]]
Level = tuple[Callable[[Any], Any] | None, Run]


def reference_levels(messages: Sequence[tuple[int, Any]], levels: Sequence[Level],
                     first_key: Callable[[Any], Any] | None = None) -> list[tuple[int, str, Any]]:
    """The last level's outputs of `messages` ([(seq, message)] in landing order) through `levels`, as
    (seq, key, output) in output order: sorted by the seq of the landed message each descends from,
    then by the key that produced it, then by its place among that key's outputs of that message (its
    input's place, then its own among the outputs answering that input). `first_key`: the first
    level's key when its own is None."""
    items = [(seq, 0, None, m) for seq, m in messages]  # (seq, part: place among the seq's items, key, message)
    for n, (key_of, run) in enumerate(levels):
        key_of = key_of if key_of is not None or n else first_key
        by_key: dict[str, list] = {}
        for seq, part, key, m in items:
            by_key.setdefault(key if key_of is None else str(key_of(m)), []).append((seq, part, m))
        outputs = []
        for key, inputs in by_key.items():
            answered: dict[int, int] = {}
            for i, out in run(key, [(seq, m) for seq, _, m in inputs]):
                seq, part, _ = inputs[i]
                j = answered[i] = answered.get(i, -1) + 1
                outputs.append(((seq, key, part, j), key, out))
        outputs.sort(key=lambda o: o[0])
        items, place = [], {}
        for (seq, *_), key, out in outputs:
            place[seq] = place.get(seq, -1) + 1
            items.append((seq, place[seq], key, out))
    return [(seq, key, out) for seq, _, key, out in items]


def reference_event_time_windows(aggregator: Aggregator, size_ms: int, key: str,
                                 events: Sequence[tuple[int, int, Any]], slide_ms: int | None = None,
                                 allowed_lateness_ms: int = 0) -> tuple[list[tuple[int, WindowResult]], list[WindowResult]]:
    """One key's event-time windows `[start, start + size_ms)` (starts multiples of `slide_ms`, default
    `size_ms`) of `events`, [(seq, event_ms, message)] in arrival order. A message is late (dropped) when
    its time is below the watermark the messages before it set: their latest time minus the lateness. A
    window closes on the first message after which the watermark reaches its end. Returns the closed
    windows as (index of the message that closed it, result), in closing order (one message's by start),
    and the windows still open at the end (by start)."""
    slide = slide_ms or size_ms
    times = [int(t) for _, t, _ in events]
    latest, marks, late = None, [], []
    for t in times:
        late.append(latest is not None and t < latest - allowed_lateness_ms)
        latest = t if latest is None else max(latest, t)
        marks.append(latest - allowed_lateness_ms)  # the watermark after this message
    starts = sorted({s for t, bad in zip(times, late) if not bad
                     for s in range((t // slide) * slide, t - size_ms, -slide) if s <= t < s + size_ms})
    closed, still_open = [], []
    for start in starts:
        end = start + size_ms
        at = next((i for i, mark in enumerate(marks) if mark >= end), None)
        members = [i for i, (t, bad) in enumerate(zip(times, late)) if not bad and start <= t < end
                   and (at is None or i <= at)]
        value = aggregator.create()
        for i in members:
            value = aggregator.add(value, events[i][2])
        seqs = [events[i][0] for i in members]
        result = WindowResult(key, f"{key}/{start}-{end}", CloseReason.WATERMARK, value, min(seqs), max(seqs),
                              len(members), start_ms=start, end_ms=end)
        if at is None:
            still_open.append(result)
        else:
            closed.append((at, result))
    closed.sort(key=lambda c: (c[0], c[1].start_ms))
    return closed, still_open


def event_time_level(aggregator: Aggregator, size_ms: int, event_time: Callable[[Any], int], *,
                     key: Callable[[Any], Any] | None = None, slide_ms: int | None = None,
                     allowed_lateness_ms: int = 0, emit: Callable[[WindowResult], Any] | None = None) -> Level:
    """A level of event-time windows for `reference_levels`: keyed by `key` (None: the key the messages
    have), each closed window output as its WindowResult or as `emit(result)`."""

    def run(k: str, inputs: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
        events = [(seq, event_time(m), m) for seq, m in inputs]
        closed, _ = reference_event_time_windows(aggregator, size_ms, k, events, slide_ms, allowed_lateness_ms)
        return [(i, w if emit is None else emit(w)) for i, w in closed]

    return key, run
