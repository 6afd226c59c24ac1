"""A TCP sink's sender: a small process of its own that sends the sink's batches and keeps its marker.

Why a process: a plain TCP receiver acknowledges nothing, so a sender stopped in the middle of a
batch leaves the receiver with part of it, and a replay cannot know which part. The query's process
hands each batch over whole (on this process's stdin); this process, in a session of its own (a
`kill -9` of `eventide serve` or a Ctrl-C in its terminal does not reach it), sends it and records it
in the marker before it reads the end of its input and exits. The next sender of the sink takes the
sink's lock only once this one is gone, so the replay after a kill of the queries' process sees the
batch sent, never half sent. Only a kill of this process itself (or of the machine) can still cut a
batch; the marker's "sending" record then says so (sinks.TCPSinkWriter decides what to do).

Protocol: after "ready", per batch the parent writes "BATCH LAST SIZE\\n" and SIZE bytes; the reply is
"sent BATCH" or "error MESSAGE". Before the sink's lock is free it says "waiting PID".
Stdlib only, so it starts in tens of milliseconds.
"""

from __future__ import annotations

import fcntl
import os
import select
import socket
import sys
from pathlib import Path

from transforms.files import write_text_atomic
from transforms.ports import LOOPBACK

CONNECT_TIMEOUT_SECONDS = 30
LOCK_POLL_SECONDS = 0.05


def lock_path(marker: Path) -> Path:
    return marker.with_suffix(".lock")


def _reply(line: str) -> None:
    try:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):  # the parent is gone: finish the batch anyway, then exit
        pass


def _read_exact(stream, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _take_lock(marker: Path, stdin):
    """The sink's lock, once the previous sender is gone; None if our parent went away meanwhile."""
    lock = open(lock_path(marker), "a+")  # noqa: SIM115 - held until this process exits
    said = False
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if not said:
                lock.seek(0)
                _reply(f"waiting {lock.read().strip() or '?'}")
                said = True
        # The parent sends nothing before "ready": input now means it closed, so stop waiting.
        if select.select([stdin], [], [], LOCK_POLL_SECONDS)[0] and not stdin.peek(1):
            lock.close()
            return None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


def serve(marker: Path, address: str, stdin=None) -> None:
    stdin = stdin or sys.stdin.buffer
    host, _, port = address.rpartition(":")
    lock = _take_lock(marker, stdin)  # kept open (and locked) for the life of the process
    if lock is None:
        return
    _reply("ready")
    conn = None
    while header := stdin.readline():
        batch, last, size = (int(x) for x in header.split())
        data = _read_exact(stdin, size)
        if data is None:  # the parent died while handing the batch over: nothing of it was sent
            break
        try:
            if conn is None:  # nothing is sent yet: a failure here leaves nothing in doubt
                conn = socket.create_connection((host or LOOPBACK, int(port)), timeout=CONNECT_TIMEOUT_SECONDS)
        except OSError as e:
            _reply(f"error {e}. Is the receiver listening?")
            continue
        write_text_atomic(marker, f"{last} sending {batch}")
        try:
            conn.sendall(data)
        except OSError as e:  # the marker stays "sending": the batch is in doubt
            conn.close()
            conn = None
            _reply(f"error {e}")
            continue
        write_text_atomic(marker, str(batch))
        _reply(f"sent {batch}")
    if conn is not None:
        conn.close()


if __name__ == "__main__":
    serve(Path(sys.argv[1]), sys.argv[2])
