"""Wallaroo's wire protocol: a fixed-size length header (default 4 bytes, big-endian `>I`), then the payload.

The one implementation used by the gateway, the sender, `ingest` and the decoders.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


class FrameTooLarge(ValueError):
    def __init__(self, length: int, limit: int):
        super().__init__(f"frame length {length} exceeds the limit of {limit} bytes")
        self.length = length
        self.limit = limit


class TruncatedFrame(ValueError):
    def __init__(self, partial: bytes, expected: int | None):
        what = "header" if expected is None else f"payload ({len(partial)} of {expected} bytes)"
        super().__init__(f"stream ended inside a frame: incomplete {what}")
        self.partial = partial
        self.expected = expected


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
            raise FrameTooLarge(len(payload), self.max_frame_bytes)
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
            raise TruncatedFrame(bytes(self._buf), expected)


def iter_file_messages(path, framing: Framing = DEFAULT_FRAMING) -> Iterator[bytes]:
    """Messages of a file the way Wallaroo's sender sent them.

    `.msg` files are already framed and are split into their frames; any other file yields one
    message per line with its trailing newline kept (LF or CRLF). A final line without a newline
    is sent as is.
    """
    from pathlib import Path

    path = Path(path)
    data = path.read_bytes()
    if path.suffix == ".msg":
        try:
            yield from framing.split(data)
        except (TruncatedFrame, FrameTooLarge) as e:
            raise ValueError(f"{path}: not a valid framed .msg file: {e}") from e
        return
    # Split on LF only (like Wallaroo's sender): CRLF lines stay whole, a lone CR stays inside its line.
    yield from io.BytesIO(data).readlines()
