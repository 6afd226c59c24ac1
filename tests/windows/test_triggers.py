"""Trigger windows (marker, day change, count): feed a stream, assert the exact windows out."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from windows import Aggregator, CloseReason, TriggerState, TriggerWindows, is_marker

MARK = "END_OF_DAY"


def collect() -> Aggregator:
    """The accumulator is the list of message values (so tests see exactly what went where)."""
    return Aggregator(
        create=list,
        add=lambda acc, m: acc + [m["v"]],
        add_frame=lambda acc, f: acc + f["v"].tolist(),
    )


def windows_def(max_count=None, day_change=True) -> TriggerWindows:
    return TriggerWindows(
        collect(),
        is_marker=lambda m: m["v"] == MARK,
        boundary=(lambda m: m["day"]) if day_change else None,
        max_count=max_count,
    )


def msgs(*spec):
    """("a", 1) -> a line on day 1; MARK -> a marker. Sequence numbers from 1."""
    out = []
    for s in spec:
        out.append({"v": MARK, "day": None} if s == MARK else {"v": s[0], "day": s[1]})
    return out


def one_by_one(wd, messages, state=None, key="src", first_seq=1):
    state = state or TriggerState()
    out = []
    for i, m in enumerate(messages):
        out.extend(wd.process(state, key, first_seq + i, m).windows)
    return out, state


def as_frames(wd, messages, cuts=(), state=None, key="src", first_seq=1):
    """Feed `messages` as DataFrames split at `cuts` (micro-batches), through process_frame."""
    state = state or TriggerState()
    frame = pd.DataFrame(messages, columns=["v", "day"])
    frame["_seq"] = range(first_seq, first_seq + len(frame))
    out = []
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(frame)), len(frame)]
    for a, b in zip(bounds, bounds[1:]):
        part = frame.iloc[a:b].reset_index(drop=True)
        out.extend(wd.process_frame(state, key, part, seq=part["_seq"], markers=(part["v"] == MARK).to_numpy(),
                                    boundaries=part["day"].to_numpy(dtype=object)).windows)
    return out, state


def summary(windows):
    return [(w.value, w.close_reason.value, w.first_seq, w.last_seq, w.boundary) for w in windows]


def test_marker_closes_the_open_window_and_empty_windows_emit_nothing():
    stream = msgs(MARK, ("a", 1), ("b", 1), MARK, MARK, ("c", 1))
    out, state = one_by_one(windows_def(), stream)
    assert summary(out) == [(["a", "b"], "marker", 2, 3, 1)]
    assert out[0].window_id == "src/2-3" and out[0].key == "src" and out[0].size == 2
    assert state.open.value == ["c"]  # still open: no trigger yet


def test_new_day_closes_the_previous_day_without_markers():
    out, state = one_by_one(windows_def(), msgs(("a", 7), ("b", 7), ("c", 8), ("d", 9), ("e", 9)))
    assert summary(out) == [(["a", "b"], "day_change", 1, 2, 7), (["c"], "day_change", 3, 3, 8)]
    assert state.open.value == ["d", "e"] and state.open.boundary == 9


def test_two_days_between_markers_give_two_windows():
    out, _ = one_by_one(windows_def(), msgs(("a", 7), ("b", 8), MARK))
    assert summary(out) == [(["a"], "day_change", 1, 1, 7), (["b"], "marker", 2, 2, 8)]


def test_count_limit():
    out, state = one_by_one(windows_def(max_count=2), msgs(("a", 1), ("b", 1), ("c", 1), ("d", 2), MARK))
    assert summary(out) == [(["a", "b"], "count", 1, 2, 1), (["c"], "day_change", 3, 3, 1), (["d"], "marker", 4, 4, 2)]
    assert state.open is None


def test_frames_across_micro_batches_equal_one_by_one():
    stream = msgs(("a", 7), ("b", 7), MARK, ("c", 8), ("d", 9), ("e", 9), ("f", 9), MARK, ("g", 10))
    expected, _ = one_by_one(windows_def(max_count=2), stream)
    for cuts in [(), (1,), (2, 3), (4, 5, 6), tuple(range(1, len(stream)))]:
        got, state = as_frames(windows_def(max_count=2), stream, cuts)
        assert got == expected, cuts
        assert state.open.value == ["g"]


message = st.one_of(st.just(MARK), st.tuples(st.sampled_from("xyz"), st.integers(1, 3)))


@settings(max_examples=200, deadline=None)
@given(stream=st.lists(message, max_size=40), cuts=st.lists(st.integers(0, 40), max_size=5),
       max_count=st.one_of(st.none(), st.integers(1, 5)), day_change=st.booleans())
def test_batch_form_equals_one_message_form(stream, cuts, max_count, day_change):
    wd = windows_def(max_count, day_change)
    expected, s1 = one_by_one(wd, msgs(*stream))
    got, s2 = as_frames(wd, msgs(*stream), cuts)
    assert got == expected
    assert (s1.open is None) == (s2.open is None)
    if s1.open is not None:
        assert (s1.open.value, s1.open.first_seq, s1.open.last_seq, s1.open.size) == (
            s2.open.value, s2.open.first_seq, s2.open.last_seq, s2.open.size)
    # Every line lands in exactly one window (closed or open), in order.
    lines = [s[0] for s in stream if s != MARK]
    assert [v for w in expected for v in w.value] + (s1.open.value if s1.open else []) == lines


def test_is_marker_ignores_trailing_newlines_only():
    assert is_marker(b"END_OF_DAY") and is_marker(b"END_OF_DAY\n") and is_marker("END_OF_DAY\r\n")
    assert not is_marker(b" END_OF_DAY") and not is_marker(b"END_OF_DAY.") and not is_marker(None)
    assert is_marker(b"EOD\r\n", marker="EOD")


def test_close_reasons_are_named_values():
    assert [str(r) for r in CloseReason] == ["marker", "day_change", "count", "watermark", "timer"]
    with pytest.raises(ValueError):
        TriggerWindows(collect(), max_count=0)


# -- folding runs ahead of the state (prefold) --------------------------------------------------------
def windows_merging(day_change=True) -> TriggerWindows:
    """`windows_def` whose aggregator can merge (list concatenation: order-sensitive, so a run merged out of
    place shows)."""
    return TriggerWindows(
        Aggregator(create=list, add=lambda acc, m: acc + [m["v"]], add_frame=lambda acc, f: acc + f["v"].tolist(),
                   merge=lambda a, b: a + b),
        is_marker=lambda m: m["v"] == MARK,
        boundary=(lambda m: m["day"]) if day_change else None,
    )


def prefolded_frames(wd, messages, seqs, cuts, breaks, min_run, state=None, key="src"):
    """`as_frames`, each micro-batch first folded by `prefold` (`breaks`: positions where the key's order has
    a gap) and fed as its runs' last rows carrying their `Folded`, between the messages left as they are."""
    state = state or TriggerState()
    frame = pd.DataFrame(messages, columns=["v", "day"])
    frame["_seq"] = seqs
    broken = pd.Series(False, index=frame.index)
    broken.iloc[[b for b in breaks if b < len(frame)]] = True
    out, folded_rows = [], 0
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(frame)), len(frame)]
    for a, b in zip(bounds, bounds[1:]):
        part = frame.iloc[a:b].reset_index(drop=True)
        marks, days = (part["v"] == MARK).to_numpy(), part["day"].to_numpy(dtype=object)
        runs = wd.prefold(part, part["_seq"].to_numpy(), broken.iloc[a:b].to_numpy(), marks, days, min_run)
        keep, folded = [True] * len(part), [None] * len(part)
        for lo, hi, f in runs:
            assert f.seqs() == part["_seq"].iloc[lo:hi].tolist() and f.size == hi - lo
            keep[lo:hi - 1] = [False] * (hi - 1 - lo)
            folded[hi - 1] = f
            folded_rows += 1
        part, folded = part[np.asarray(keep, dtype=bool)].reset_index(drop=True), [f for f, k in zip(folded, keep) if k]
        out.extend(wd.process_frame(state, key, part, seq=part["_seq"], markers=(part["v"] == MARK).to_numpy(),
                                    boundaries=part["day"].to_numpy(dtype=object), folded=folded).windows)
    return out, state, folded_rows


@settings(max_examples=300, deadline=None)
@given(stream=st.lists(message, max_size=40), steps=st.lists(st.integers(1, 3), min_size=40, max_size=40),
       cuts=st.lists(st.integers(0, 40), max_size=4), breaks=st.lists(st.integers(0, 40), max_size=4),
       min_run=st.integers(2, 4), day_change=st.booleans())
def test_prefolded_runs_give_the_windows_of_one_message_at_a_time(stream, steps, cuts, breaks, min_run, day_change):
    wd = windows_merging(day_change)
    seqs = [sum(steps[: i + 1]) for i in range(len(stream))]  # gaps: other keys' messages in between
    expected, s1 = [], TriggerState()
    for s, m in zip(seqs, msgs(*stream)):
        expected.extend(wd.process(s1, "src", s, m).windows)
    got, s2, _ = prefolded_frames(wd, msgs(*stream), seqs, cuts, breaks, min_run)
    assert got == expected
    assert (s1.open is None) == (s2.open is None)
    if s1.open is not None:
        assert vars(s1.open) == vars(s2.open)


def test_a_run_is_cut_by_markers_new_days_and_breaks_and_folds_only_long_runs():
    wd = windows_merging()
    stream = msgs(("a", 1), ("b", 1), ("c", 1), MARK, ("d", 1), ("e", 2), ("f", 2), ("g", 2), ("h", 2), ("i", 2))
    frame = pd.DataFrame(stream, columns=["v", "day"])
    seqs = [1, 2, 3, 4, 5, 6, 7, 9, 10, 11]
    breaks = [False] * 8 + [True, False]  # "h" may not follow "g" directly
    runs = wd.prefold(frame, seqs, breaks, (frame["v"] == MARK).to_numpy(), frame["day"].to_numpy(dtype=object), 2)
    assert [(lo, hi, f.value, f.seq_ranges, f.size) for lo, hi, f in runs] == [
        (0, 3, ["a", "b", "c"], ((1, 3),), 3), (5, 8, ["e", "f", "g"], ((6, 7), (9, 9)), 3), (8, 10, ["h", "i"], ((10, 11),), 2)]
    assert [lo for lo, _, _ in wd.prefold(frame, seqs, breaks, None, frame["day"].to_numpy(dtype=object), 3)] == [0, 5]


def test_prefold_needs_a_merge_and_no_count_limit():
    frame = pd.DataFrame(msgs(("a", 1), ("b", 1)), columns=["v", "day"])
    assert windows_merging().can_prefold and not windows_def().can_prefold
    assert not TriggerWindows(windows_merging().aggregator, max_count=3).can_prefold
    with pytest.raises(ValueError, match="merge"):
        windows_def().prefold(frame, [1, 2], [True, False])
