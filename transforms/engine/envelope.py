"""What travels between the stages: the envelope row, pickled messages, and user-code calls.

Every row between stages is an envelope: its kind, sequence, part (position among the outputs of one
input message), branch, key, the pickled message, and the input's landing metadata. A user function
that raises (or breaks its contract) turns its message into a quarantine envelope instead.
"""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from transforms.api import UserFunctionError

ENVELOPE = pa.schema(
    [
        ("kind", pa.string()),  # "msg" (keyed, before state), "out" (to sinks), "quarantine"
        ("seq", pa.int64()),
        ("part", pa.int32()),
        ("branch", pa.int32()),
        ("key", pa.string()),
        ("msg", pa.binary()),
        ("stream", pa.string()),
        ("receive_time", pa.timestamp("us", tz="UTC")),
        ("connection", pa.string()),
        ("step", pa.string()),
        ("reason", pa.string()),
        ("payload", pa.binary()),
        # A later level's message: the key of the previous level that produced it. One input's outputs
        # from several keys reach the next level key by key (engine/levels.py); null at the first level.
        ("origin", pa.string()),
    ]
)
DECODED_PREFIX = "m__"  # decoded message columns beside the envelope (a decoder may have a field `kind` too)
QUARANTINE_KEY = "\x00quarantine"  # quarantine envelopes pass through the stateful step untouched
TICK_STREAM = "\x00tick"  # clock rows that make a query with timers run a batch every trigger


# -- message serialization -------------------------------------------------------------------------
_BY_VALUE: set[type] = set()


def dumps(obj: Any) -> bytes:
    """Pickle a message, output or state. Classes defined in a user's `__main__` script cannot be found
    by name in Spark's workers, so those (remembered per type) go through cloudpickle, by value."""
    if type(obj) not in _BY_VALUE:
        try:
            return pickle.dumps(obj, protocol=5)
        except (pickle.PicklingError, AttributeError, TypeError):
            _BY_VALUE.add(type(obj))
    from pyspark import cloudpickle

    return cloudpickle.dumps(obj, protocol=5)


# -- user-code calls --------------------------------------------------------------------------------
class Quarantined(Exception):
    """A message failed in `step`; it becomes a quarantine envelope with `reason`."""

    def __init__(self, step: str, reason: str):
        super().__init__(reason)
        self.step = step
        self.reason = reason


def describe(e: BaseException) -> str:
    """`Type: message at file:line` of where user code raised."""
    tb = traceback.extract_tb(e.__traceback__)
    where = f" at {Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
    return f"{type(e).__name__}: {e}{where}"


def call_user(step_name: str, fail_fast: bool, fn: Callable, *args):
    """Call user code: an error raises Quarantined, or with `fail_fast` stops the query."""
    try:
        return fn(*args)
    except UserFunctionError as e:
        # A broken contract (e.g. wrong return type): the message says which function and what it returned.
        if fail_fast:
            raise
        raise Quarantined(step_name, str(e)) from None
    except Exception as e:
        if fail_fast:
            raise RuntimeError(f"{step_name!r} raised on a message (EVENTIDE_FAIL_FAST is on): {describe(e)}") from e
        raise Quarantined(step_name, describe(e)) from None


# -- frames -----------------------------------------------------------------------------------------
def spark_frame(table: pa.Table) -> pd.DataFrame:
    """An Arrow table as a pandas frame, converted as Spark converts a stateful step's input (time stamps
    tz-naive in UTC, the session's zone; dates as datetime.date): the keyed step's frames and the pre
    stage's (stages.prefold_runs) hand the user's functions the same values."""
    df = table.to_pandas()
    for f in table.schema:
        if pa.types.is_timestamp(f.type):
            column = df[f.name]
            if f.type.tz is not None:
                column = column.dt.tz_convert("UTC").dt.tz_localize(None)
            df[f.name] = column.astype("datetime64[ns]")
    return df


# -- records ----------------------------------------------------------------------------------------
def frame_to_records(name: str, out: Any) -> list:
    """What a batch function returned, as a list of records."""
    if out is None:
        return []
    if isinstance(out, pd.DataFrame):
        return out.to_dict("records")
    if isinstance(out, list):
        return out
    raise UserFunctionError(f"batch function {name!r} returned {type(out).__name__}, expected a pandas DataFrame")
