"""Wallaroo's wire protocol: a fixed-size length header (default 4 bytes, big-endian `>I`), then the payload.

The one implementation used by the gateway, the sender, `ingest` and the decoders, and the reading of
input files (`iter_file_messages`: framed files or text lines).
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


# Reasons count payload bytes (what the header announces, what arrived), never header bytes with them.
class FrameTooLarge(ValueError):
    """A frame whose payload is over the limit: announced by a received header, or to be sent (`announced=False`)."""

    def __init__(self, length: int, limit: int, announced: bool = True):
        what = f"frame header announces {length} payload bytes" if announced else f"payload of {length} bytes"
        super().__init__(f"{what}, over the limit of {limit}")
        self.length = length
        self.limit = limit


class TruncatedFrame(ValueError):
    """The input ended inside a frame: `partial` holds its bytes as received (header included)."""

    def __init__(self, partial: bytes, expected: int | None, header_length: int = 4):
        if expected is None:
            why = f"frame header incomplete: only {len(partial)} of its {header_length} bytes arrived"
        else:
            why = f"frame announced {expected} payload bytes, only {len(partial) - header_length} arrived"
        super().__init__(why)
        self.partial = partial
        self.expected = expected
        self.header_length = header_length


@dataclass(frozen=True)
class Framing:
    header_length: int = 4
    length_fmt: str = ">I"
    max_frame_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if struct.calcsize(self.length_fmt) != self.header_length:
            raise ValueError(f"length format {self.length_fmt!r} is not {self.header_length} bytes long")

    def encode(self, payload: bytes) -> bytes:
        if len(payload) > self.max_frame_bytes:
            raise FrameTooLarge(len(payload), self.max_frame_bytes, announced=False)
        return struct.pack(self.length_fmt, len(payload)) + payload

    def encode_many(self, payloads: Iterable[bytes]) -> bytes:
        return b"".join(self.encode(p) for p in payloads)

    def decoder(self) -> FrameDecoder:
        return FrameDecoder(self)

    def split(self, data: bytes) -> list[bytes]:
        """All frames of a complete buffer; raises TruncatedFrame/FrameTooLarge on bad input."""
        dec = self.decoder()
        frames = dec.feed(data)
        dec.finish()
        return frames


DEFAULT_FRAMING = Framing()

# The gateway's confirmation: a client that half-closes its socket gets this byte once everything it
# sent is landed, then the close. A close without it (the gateway stopped or died) confirms nothing.
LANDED_ACK = b"\x06"


class FrameDecoder:
    """Incremental decoder: feed any chunks, get whole payloads back in order.

    After FrameTooLarge the stream cannot be resynchronised (the length is untrustworthy), so the
    decoder refuses further input; `pending()` returns the bytes received after the last whole frame.
    """

    def __init__(self, framing: Framing = DEFAULT_FRAMING):
        self.framing = framing
        self._buf = bytearray()
        self._poisoned: FrameTooLarge | None = None

    def feed(self, chunk: bytes) -> list[bytes]:
        if self._poisoned:
            raise self._poisoned
        self._buf += chunk
        out: list[bytes] = []
        hl = self.framing.header_length
        pos = 0
        buf = self._buf
        while len(buf) - pos >= hl:
            (length,) = struct.unpack_from(self.framing.length_fmt, buf, pos)
            if length > self.framing.max_frame_bytes:
                del buf[:pos]
                self._poisoned = FrameTooLarge(length, self.framing.max_frame_bytes)
                if out:
                    # Hand back what was whole; the error surfaces on the next feed/finish.
                    return out
                raise self._poisoned
            end = pos + hl + length
            if end > len(buf):
                break
            out.append(bytes(buf[pos + hl : end]))
            pos = end
        if pos:
            del buf[:pos]
        return out

    def pending(self) -> bytes:
        return bytes(self._buf)

    def finish(self) -> None:
        """Call at end of stream: raises if a partial frame (or an oversized one) is left."""
        if self._poisoned:
            raise self._poisoned
        if self._buf:
            hl = self.framing.header_length
            expected = None
            if len(self._buf) >= hl:
                (expected,) = struct.unpack_from(self.framing.length_fmt, self._buf, 0)
            raise TruncatedFrame(bytes(self._buf), expected, hl)


class FramingMismatch(ValueError):
    """A file read by its extension's guess looks like the other format; the message says which flag to pass."""


def is_framed_file(path, framed: bool | None = None) -> bool:
    """How a file is read: `framed` when given, else guessed from the extension (`.msg` = framed)."""
    from pathlib import Path

    return framed if framed is not None else Path(path).suffix == ".msg"


def iter_file_messages(path, framing: Framing = DEFAULT_FRAMING, framed: bool | None = None) -> Iterator[bytes]:
    """Messages of a file the way Wallaroo's sender sent them.

    Framed files are split into their frames; text files yield one message per line with its trailing
    newline kept (LF or CRLF); a final line without a newline is sent as is. `framed=None` guesses from
    the extension (`.msg` = framed, else lines) and raises FramingMismatch when the content says the
    guess is likely wrong (a text file named .msg, frames named .txt); an explicit `framed` is obeyed.
    """
    from pathlib import Path

    path = Path(path)
    data = path.read_bytes()
    guessed = framed is None
    if is_framed_file(path, framed):
        try:
            frames = framing.split(data)
        except (TruncatedFrame, FrameTooLarge) as e:
            why = _not_framed_reason(data, framing) if guessed else None
            if why:
                raise FramingMismatch(f"{path} does not look framed ({why}): it looks like text lines; pass --lines") from e
            raise ValueError(f"{path}: not a valid framed file: {e}") from e
        yield from frames
        return
    if guessed:
        _refuse_if_framed(path, data, framing)
    # Split on LF only (like Wallaroo's sender): CRLF lines stay whole, a lone CR stays inside its line.
    yield from io.BytesIO(data).readlines()


def line_offsets(data: bytes):
    """Where the lines of `data` start, and its end: line i is data[offsets[i]:offsets[i + 1]], split
    as iter_file_messages splits text (after each LF, the LF kept; a last line without one as is).
    The vectorized form of `io.BytesIO(data).readlines()` (a numpy int64 array): a 10M-line file
    is split without making a Python object per line."""
    import numpy as np

    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 0x0A) + 1
    tail = [len(data)] if len(data) and (not len(ends) or ends[-1] != len(data)) else []
    return np.concatenate([[0], ends, tail]).astype(np.int64)


def text_file_lines(path, framing: Framing = DEFAULT_FRAMING, framed: bool | None = None):
    """(the file's bytes, line_offsets of them) for a file read as text lines, with the same checks as
    iter_file_messages (a file that looks framed while guessed to be text raises FramingMismatch)."""
    from pathlib import Path

    path = Path(path)
    data = path.read_bytes()
    if framed is None:
        _refuse_if_framed(path, data, framing)
    return data, line_offsets(data)


def _refuse_if_framed(path, data: bytes, framing: Framing) -> None:
    why = _binary_reason(data, framing)
    if why:
        raise FramingMismatch(
            f"{path} looks like length-prefixed frames, not text lines ({why}); pass --framed "
            "(or --lines to send it as text anyway)"
        )


_TEXT_BYTES = frozenset(range(0x20, 0x7F)) | {0x09, 0x0A, 0x0D}


def _not_framed_reason(data: bytes, framing: Framing) -> str | None:
    """Why a file that failed to split is probably not frames at all, or None (then: a broken framed file)."""
    hl = framing.header_length
    if len(data) < hl:
        return f"{len(data)} bytes, shorter than one {hl}-byte length header"
    if all(b in _TEXT_BYTES for b in data[:hl]):
        return f"it starts with text {data[:hl]!r}, not a length header"
    (length,) = struct.unpack_from(framing.length_fmt, data, 0)
    if length > framing.max_frame_bytes:
        return f"its first length header says {length} bytes, over the frame limit of {framing.max_frame_bytes}"
    if hl + length > len(data):
        return f"its first length header says {length} bytes but the file has {len(data) - hl} after it"
    return None


def _binary_reason(data: bytes, framing: Framing) -> str | None:
    """Why a file to be read as text lines looks like frames (or binary), or None."""
    frames = _tiling_frames(data, framing)
    if frames:
        return f"{frames} frames with {framing.header_length}-byte length headers tile it exactly"
    nul = data.find(b"\0")
    if nul >= 0:
        return f"it is binary: a NUL byte at offset {nul}"
    return None


def _tiling_frames(data: bytes, framing: Framing) -> int:
    """How many frames tile `data` exactly (0 if they do not): each header plausible, none left over."""
    hl, fmt, limit = framing.header_length, framing.length_fmt, framing.max_frame_bytes
    if all(b in _TEXT_BYTES for b in data[:hl]):
        return 0  # a text start is not a plausible header (with 4 bytes it is over any sane limit anyway)
    pos = count = 0
    while pos < len(data):
        if len(data) - pos < hl:
            return 0
        (length,) = struct.unpack_from(fmt, data, pos)
        if length > limit:
            return 0
        pos += hl + length
        count += 1
    return count if pos == len(data) else 0
