"""Getting files into the log: over TCP to a running gateway (`send_files`, like Wallaroo's sender) or
directly, without a network (`ingest_files`, through the configured log's writer: the landing folder or
Kafka). Both produce the same messages.

Messages of a file follow `transforms.ingestion.framing.iter_file_messages`: a text file gives one message per
line with its trailing newline; a framed file is split into its frames (over TCP: sent byte for byte).
`framed=None` guesses from the extension (`.msg` = framed) and refuses a file whose content says the
guess is wrong; `framed=True/False` (`--framed`/`--lines`) is obeyed. With `end_of_day`, one message
whose payload is exactly the marker (`END_OF_DAY`) follows each file.

Every file is checked before anything is sent or landed, so a bad file in the list does not leave
half a batch behind.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from transforms.ingestion import open_log
from transforms.ingestion.framing import (
    DEFAULT_FRAMING,
    LANDED_ACK,
    Framing,
    is_framed_file,
    iter_file_messages,
    text_file_lines,
)
from transforms.ingestion.log import LogWriter
from transforms.settings import Settings

_SEND_BATCH_BYTES = 1 << 20  # frame lines into ~1 MiB writes: few syscalls, bounded memory


class InputFileError(ValueError):
    """A file cannot be sent: unreadable, not in the format it is read as, or a line over the frame limit."""


class GatewayUnavailable(ConnectionError):
    """Nothing accepts connections at the address; the message says how to start the gateway."""


def _file_messages(path: Path, framing: Framing, framed: bool | None) -> Iterator[bytes]:
    try:
        yield from iter_file_messages(path, framing, framed)
    except OSError as e:
        raise InputFileError(f"{path}: cannot read: {e.strerror or e}") from e
    except ValueError as e:  # iter_file_messages names the file (invalid frames, or a likely wrong guess)
        raise InputFileError(str(e)) from e


def _text_lines(path: Path, framing: Framing, framed: bool | None):
    try:
        return text_file_lines(path, framing, framed)
    except OSError as e:
        raise InputFileError(f"{path}: cannot read: {e.strerror or e}") from e
    except ValueError as e:
        raise InputFileError(str(e)) from e


def _check_file(path: Path, framing: Framing, framed: bool | None) -> int:
    """Number of messages in the file; raises InputFileError if it cannot be sent whole."""
    if path.is_dir():
        raise InputFileError(f"{path}: is a directory, expected a file")
    if not is_framed_file(path, framed):  # text lines, checked without a Python object per line
        _, offsets = _text_lines(path, framing, framed)
        over = np.flatnonzero(np.diff(offsets) > framing.max_frame_bytes)
        if over.size:
            line = int(over[0])
            raise InputFileError(
                f"{path}: line {line + 1} is {int(offsets[line + 1] - offsets[line])} bytes, over the frame "
                f"limit of {framing.max_frame_bytes} bytes"
            )
        return len(offsets) - 1
    count = 0
    for count, payload in enumerate(_file_messages(path, framing, framed), start=1):
        if len(payload) > framing.max_frame_bytes:
            raise InputFileError(
                f"{path}: line {count} is {len(payload)} bytes, over the frame limit of "
                f"{framing.max_frame_bytes} bytes"
            )
    return count


def _check_files(files: Iterable[str | os.PathLike], framing: Framing, framed: bool | None) -> list[tuple[Path, int]]:
    paths = [Path(f) for f in files]
    if not paths:
        raise InputFileError("no files given")
    return [(p, _check_file(p, framing, framed)) for p in paths]


def send_files(
    stream: str,
    files: Iterable[str | os.PathLike],
    host: str,
    port: int,
    end_of_day: bool = False,
    framing: Framing = DEFAULT_FRAMING,
    marker: str = "END_OF_DAY",
    timeout: float = 60.0,
    framed: bool | None = None,
    progress: Callable[[str], None] | None = None,
) -> int:
    """Send the files' messages over one TCP connection; returns how many messages were sent.
    `progress` hears how far it got every few seconds (a big file takes a while).

    After sending, the socket is half-closed and this waits for the gateway to close its side, which it
    does only after landing and syncing everything received: when this returns, the messages are
    landed (visible to pipelines once their segment closes, within `segment_max_seconds`).
    """
    plan = _check_files(files, framing, framed)
    marker_frame = framing.encode(marker.encode())
    where = f"{host}:{port}"
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except ConnectionRefusedError:
        raise GatewayUnavailable(
            f"cannot send {stream}: connection to {where} refused. Is `eventide serve` running? Start it, "
            f"or land the files without a network with `eventide ingest {stream} FILE...`."
        ) from None
    except OSError as e:
        raise GatewayUnavailable(f"cannot send {stream}: cannot connect to {where}: {e.strerror or e}") from e
    sent = 0
    meter = _Meter(sum(p.stat().st_size for p, _ in plan), progress)
    with sock:
        try:
            for path, count in plan:
                if is_framed_file(path, framed):
                    data = path.read_bytes()  # already framed and checked: byte for byte
                    for i in range(0, len(data), _SEND_BATCH_BYTES):
                        sock.sendall(data[i:i + _SEND_BATCH_BYTES])
                        meter.add(min(_SEND_BATCH_BYTES, len(data) - i))
                else:
                    for chunk in _framed_chunks(_file_messages(path, framing, False), framing):
                        sock.sendall(chunk)
                        meter.add(len(chunk))
                sent += count
                if end_of_day:
                    sock.sendall(marker_frame)
                    sent += 1
            _wait_until_landed(sock, timeout)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise ConnectionError(
                f"the gateway at {where} closed the connection while sending {stream} "
                f"(after about {sent} messages): {e.strerror or e}. Its framing limits may differ from "
                "the sender's; the gateway quarantines what it could not frame."
            ) from e
        except TimeoutError:
            raise TimeoutError(
                f"sending {stream} to {where} timed out after about {sent} messages: the gateway did not "
                f"read or confirm them within {timeout} s"
            ) from None
    return sent


PROGRESS_EVERY_SECONDS = 2.0


class _Meter:
    """Says how many bytes of the files went out, at most every `every` seconds."""

    def __init__(self, total: int, say: Callable[[str], None] | None, every: float | None = None):
        self.total, self.say = max(total, 1), say
        self.every = PROGRESS_EVERY_SECONDS if every is None else every
        self.done = 0
        self.started = self.last = time.monotonic()

    def add(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.say and now - self.last >= self.every:
            self.last = now
            mb = self.done / 1e6
            self.say(f"sent {mb:,.1f} of {self.total / 1e6:,.1f} MB ({min(100, 100 * self.done // self.total)}%), "
                     f"{mb / (now - self.started):,.1f} MB/s")


def _batches(payloads: Iterable[bytes], limit: int) -> Iterator[list[bytes]]:
    """Consecutive payloads in lists of about `limit` bytes (a landing segment's worth)."""
    batch: list[bytes] = []
    size = 0
    for payload in payloads:
        batch.append(payload)
        size += len(payload)
        if size >= limit:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _line_batches(data: bytes, offsets, limit: int, after: list[bytes]) -> Iterator[pa.Array]:
    """The lines of `data` (split at `offsets`, framing.line_offsets) as binary arrays over its bytes, of
    about `limit` bytes each like `_batches`, with the payloads `after` at the end of the last one."""
    n = len(offsets) - 1
    start = 0
    while start < n:
        end = int(np.searchsorted(offsets, offsets[start] + limit, side="left"))  # lines reaching the limit
        end = min(max(end, start + 1), n)
        first, last = int(offsets[start]), int(offsets[end])
        lines = pa.BinaryArray.from_buffers(pa.binary(), end - start, [
            None, pa.py_buffer((offsets[start:end + 1] - first).astype(np.int32)), pa.py_buffer(memoryview(data)[first:last])])
        start = end
        yield pa.concat_arrays([lines, pa.array(after, pa.binary())]) if after and start == n else lines
    if after and n == 0:
        yield pa.array(after, pa.binary())


def _framed_chunks(payloads: Iterable[bytes], framing: Framing) -> Iterator[bytes]:
    batch: list[bytes] = []
    size = 0
    for payload in payloads:
        batch.append(payload)
        size += len(payload) + framing.header_length
        if size >= _SEND_BATCH_BYTES:
            yield framing.encode_many(batch)
            batch, size = [], 0
    if batch:
        yield framing.encode_many(batch)


def _wait_until_landed(sock: socket.socket, timeout: float) -> None:
    # Half-close: the gateway sees end of stream, lands the tail, confirms with LANDED_ACK and closes
    # its side. Without this, a sender exiting right after sendall could not know what was landed; and
    # a close without the confirmation means the gateway stopped or died first.
    sock.shutdown(socket.SHUT_WR)
    sock.settimeout(timeout)
    received = b""
    while chunk := sock.recv(4096):
        received += chunk[:16]
    if LANDED_ACK not in received:
        raise ConnectionError("the gateway closed the connection without confirming that it landed what was "
                              "sent (was it stopped?); some of it may be landed: check `eventide status` "
                              "before sending again")


def ingest_files(
    settings: Settings,
    stream: str,
    files: Iterable[str | os.PathLike],
    end_of_day: bool = False,
    writer: LogWriter | None = None,
    framed: bool | None = None,
) -> int:
    """Write the files' messages to the log (`writer`, default: the configured log's), without a network;
    returns how many were written.

    Everything is flushed before returning: landing segments closed, or every message acknowledged by
    Kafka (else LogWriteError), so the messages are visible to the pipelines. Raises LandingBusy if a
    running gateway holds the landing area (send through it instead).
    """
    settings.group_of(stream)  # an unknown stream fails before anything is read
    framing = Framing(settings.header_length, settings.length_fmt, settings.max_frame_bytes)
    plan = _check_files(files, framing, framed)
    marker = settings.marker.encode()
    own_writer = writer is None
    if own_writer:
        writer = open_log(settings).writer()
    landed = 0
    try:
        for path, _count in plan:
            connection = f"file:{path.name}"
            if is_framed_file(path, framed):
                messages = _file_messages(path, framing, True)
                if end_of_day:
                    messages = itertools.chain(messages, [marker])
                batches = _batches(messages, settings.segment_max_bytes)
            else:  # text: the lines as arrays over the file's bytes, a segment's worth each
                batches = _line_batches(*_text_lines(path, framing, False), settings.segment_max_bytes,
                                        [marker] if end_of_day else [])
            for batch in batches:
                writer.append_many(stream, batch, connection)  # in bulk: a file needs no per-message journal
                landed += len(batch)
        writer.flush()
    finally:
        if own_writer:
            writer.close()
    return landed
