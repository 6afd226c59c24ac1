"""Folding a key's runs of messages in the pre stage (Settings.prefold): the pre stage and keyed step of a
trigger-window query, fed micro-batches spread over tasks as Spark's file source spreads landed files
(a task reads several files in any order, its rows in Arrow batches of any size), give the same outputs
and states with folding as without (hypothesis). A task's batch folds only over consecutive sequence
numbers: a gap may hide another task's message of the same key."""

import dataclasses
import pickle
from unittest import mock

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import settings as examples
from hypothesis import strategies as st

import transforms.engine.stages as stages
from transforms.api import Application, Context, DeltaSink, decoder, source
from transforms.engine.envelope import QUARANTINE_KEY, spark_frame
from transforms.engine.keyed_state import _run_key, input_order
from transforms.engine.plan import plan_queries
from transforms.engine.stages import make_pre_stage
from transforms.ingestion.landing import LANDING_SCHEMA
from transforms.registry import registry_of
from transforms.settings import Settings
from transforms.windowing import field_is, trigger_windows
from windows import Aggregator

ITEM = pa.schema([("k", pa.string()), ("kind", pa.string()), ("day", pa.int64()), ("v", pa.string())])


@decoder(schema=ITEM)
def decode_item(payload: bytes) -> dict:
    """`k,day,v` a line of key k; `k,M` a marker of key k; anything else fails (quarantine)."""
    k, *rest = payload.decode().split(",")
    if rest == ["M"]:
        return {"k": k, "kind": "marker", "day": None, "v": None}
    day, v = rest
    return {"k": k, "kind": "line", "day": int(day), "v": v}


def _merge(a: list, b: list) -> list:
    return a + b


# The values in order: a run merged out of place changes the result.
IN_ORDER = Aggregator(create=list, add=lambda acc, m: acc + [m["v"]], add_frame=lambda acc, f: acc + f["v"].tolist(),
                      merge=_merge, columns=("v",))
WINDOWS = trigger_windows(is_marker=field_is("kind", "marker"), boundary="day")


def _plan(aggregator: Aggregator = IN_ORDER, prefold: bool = True):
    app = Application("items", source("items", decode_item).key_by("k").to(WINDOWS.over(aggregator))
                      .to_sink(DeltaSink("item_windows")))
    (plan,) = plan_queries(app, Settings(prefold=prefold, app_registry=registry_of([app])))
    return plan


def _landing(rows: list[tuple[int, bytes]]) -> pa.RecordBatch:
    n = len(rows)
    return pa.RecordBatch.from_pydict({"stream": ["items"] * n, "seq": [s for s, _ in rows], "receive_time": [None] * n,
                                       "connection": ["c"] * n, "payload": [p for _, p in rows],
                                       "landing_error": [None] * n}, schema=LANDING_SCHEMA)


class Query:
    """The plan's pre stage in each task over its Arrow batches, then each key's rows (reversed, as a shuffle
    may deliver them, then in `input_order`) through `_run_key`; states kept per key between batches."""

    def __init__(self, plan):
        self.plan, self.states = plan, {}
        self.columns = [f"m__{n}" for n in plan.decoded_schema.names]
        self.keyed_rows = 0

    def batch(self, tasks: list[list[list[tuple[int, bytes]]]]) -> list[tuple]:
        stage_schema = self.plan.stage_schema
        env = pa.concat_tables([pa.Table.from_batches(list(make_pre_stage(self.plan, False)(iter(
            _landing(b) for b in task if b))), schema=stage_schema) for task in tasks])
        self.keyed_rows += env.num_rows
        out = []
        for key, rows in spark_frame(env).groupby("key", sort=False):
            rows = rows.iloc[::-1].reset_index(drop=True)
            rows = rows.take(input_order(rows)).reset_index(drop=True)
            if key == QUARANTINE_KEY:
                out.extend(("quarantine", s, r) for s, r in zip(rows["seq"], rows["reason"]))
                continue
            done = _run_key(rows, self.states.setdefault(key, {}), self.plan.branches, False, self.columns, Context(key))
            out.extend((k, s, p, pickle.loads(m) if m is not None else r)
                       for k, s, p, m, r in zip(done["kind"], done["seq"], done["part"], done["msg"], done["reason"]))
        return sorted(out, key=repr)

    def open_windows(self) -> dict:
        """Each key's open window (its fields), None if it has none."""
        found = {}
        for key, states in self.states.items():
            (state,) = states.values()  # the window step's TriggerState
            found[key] = None if state.open is None else vars(state.open)
        return found


item = st.one_of(st.tuples(st.sampled_from("ab"), st.integers(1, 3), st.sampled_from("xyz")),
                 st.tuples(st.sampled_from("ab")), st.just(None))


def _payload(it) -> bytes:
    if it is None:
        return b"not an item"
    return f"{it[0]},M".encode() if len(it) == 1 else f"{it[0]},{it[1]},{it[2]}".encode()


@st.composite
def micro_batches(draw):
    """Two micro-batches of landed items, each cut into files (consecutive sequence numbers), the files
    spread over 1-3 tasks, each task reading its files in any order and its rows in Arrow batches of any
    size."""
    items = draw(st.lists(item, min_size=1, max_size=60))
    rows = [(seq, _payload(it)) for seq, it in enumerate(items, start=1)]
    split = draw(st.integers(0, len(rows)))
    batches = []
    for part in (rows[:split], rows[split:]):
        cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(part) - 1)), max_size=4))))
        files = [part[a:b] for a, b in zip([0, *cuts], [*cuts, len(part)]) if part[a:b]]
        tasks: list[list] = [[] for _ in range(draw(st.integers(1, 3)))]
        for f in draw(st.permutations(files)):
            tasks[draw(st.integers(0, len(tasks) - 1))].extend(f)
        arrow_batches = []
        for task in tasks:
            cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(task) - 1)), max_size=3))))
            arrow_batches.append([task[a:b] for a, b in zip([0, *cuts], [*cuts, len(task)])])
        batches.append(arrow_batches)
    return batches


@examples(max_examples=150, deadline=None)
@given(batches=micro_batches(), min_run=st.integers(2, 5))
def test_folded_runs_give_the_outputs_and_states_of_the_messages_one_by_one(batches, min_run):
    folded, reference = Query(_plan()), Query(_plan(prefold=False))
    with mock.patch.object(stages, "PREFOLD_MIN_RUN", min_run):  # small runs fold too: the threshold is for speed
        for tasks in batches:
            assert folded.batch(tasks) == reference.batch(tasks)
            assert folded.open_windows() == reference.open_windows()
    assert folded.keyed_rows <= reference.keyed_rows


def test_a_long_run_reaches_the_keyed_step_as_one_row_and_a_gap_cuts_it():
    lines = [(seq, f"a,1,v{seq}".encode()) for seq in range(1, 301)]
    plan = _plan()
    assert plan.prefold and not _plan(prefold=False).prefold
    whole = Query(plan)
    whole.batch([[lines]])
    assert whole.keyed_rows == 1
    # Seqs 101-200 are another task's: this task's batch jumps from 100 to 201, so it keeps two runs apart.
    tasks = [[lines[:100] + lines[200:]], [lines[100:200]]]
    gapped = Query(plan)
    outputs = gapped.batch(tasks)
    assert gapped.keyed_rows == 3
    assert outputs == Query(_plan(prefold=False)).batch(tasks)
    assert gapped.open_windows()["a"]["value"] == [f"v{s}" for s in range(1, 301)]


def test_a_merge_that_fails_quarantines_every_message_of_the_folded_runs():
    def failing(a, b):
        raise ValueError("no merging here")

    plan = _plan(dataclasses.replace(IN_ORDER, merge=failing))
    query = Query(plan)
    lines = [(seq, f"a,1,v{seq}".encode()) for seq in range(1, 201)]
    out = query.batch([[lines[:100]], [lines[100:]]])
    assert query.keyed_rows == 2
    assert sorted(s for kind, s, *_ in out if kind == "quarantine") == list(range(1, 201))
    assert {r for kind, _, _, r in out if kind == "quarantine"} == {"ValueError: no merging here at test_prefold.py:" +
                                                                    str(failing.__code__.co_firstlineno + 1)}


def test_a_query_whose_window_cannot_merge_or_counts_is_not_folded():
    assert not _plan(dataclasses.replace(IN_ORDER, merge=None)).prefold
    app = Application("items", source("items", decode_item).key_by("k").to(
        trigger_windows(is_marker=field_is("kind", "marker"), boundary="day", max_count=5).over(IN_ORDER))
        .to_sink(DeltaSink("item_windows")))
    assert not plan_queries(app, Settings(app_registry=registry_of([app])))[0].prefold


def test_the_log_apps_query_is_folded():
    from examples.logs import app

    (plan,) = plan_queries(app, Settings(app_registry=registry_of([app])))
    assert plan.prefold and plan.decoded_schema.names == ["kind", "day", "status"]


def _failing_add_frame(acc, frame):
    raise ValueError("cannot fold")


def test_a_fold_that_fails_leaves_the_batch_to_the_keyed_step_or_stops_under_fail_fast():
    aggregator = dataclasses.replace(IN_ORDER, add_frame=_failing_add_frame)
    lines = [(seq, f"a,1,v{seq}".encode()) for seq in range(1, 101)]
    folded, reference = Query(_plan(aggregator)), Query(_plan(aggregator, prefold=False))
    out = folded.batch([[lines]])
    assert folded.keyed_rows == 100 and out == reference.batch([[lines]])
    assert {kind for kind, *_ in out} == {"quarantine"}
    with pytest.raises(RuntimeError, match="EVENTIDE_FAIL_FAST is on.*cannot fold"):
        list(make_pre_stage(_plan(aggregator), True)(iter([_landing(lines)])))
