"""The length-prefixed wire protocol: round trips under any chunking, and bad input is always reported."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.ingestion.framing import (
    DEFAULT_FRAMING,
    FrameTooLarge,
    Framing,
    TruncatedFrame,
    iter_file_messages,
)

DATA = Path(__file__).resolve().parents[3] / "data" / "wallaroo"

payload_lists = st.lists(st.binary(max_size=300), max_size=40)

# (header_length, length_fmt): Wallaroo's default and the other widths a decoder may be configured with.
FORMATS = [(4, ">I"), (2, ">H"), (1, "B"), (8, ">Q"), (4, "<I")]


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` split at the given offsets (any order, duplicates allowed: empty chunks are valid input)."""
    points = sorted(c % (len(data) + 1) for c in cuts)
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def decode_chunks(framing: Framing, chunks: list[bytes]) -> list[bytes]:
    decoder = framing.decoder()
    out: list[bytes] = []
    for chunk in chunks:
        out.extend(decoder.feed(chunk))
    decoder.finish()
    return out


@settings(max_examples=300, deadline=None)
@given(payloads=payload_lists, cuts=st.lists(st.integers(min_value=0), max_size=30))
def test_round_trip_under_any_chunking(payloads, cuts):
    data = DEFAULT_FRAMING.encode_many(payloads)
    assert decode_chunks(DEFAULT_FRAMING, chunked(data, cuts)) == payloads


@settings(max_examples=100, deadline=None)
@given(payloads=payload_lists)
def test_byte_at_a_time(payloads):
    data = DEFAULT_FRAMING.encode_many(payloads)
    assert decode_chunks(DEFAULT_FRAMING, [data[i : i + 1] for i in range(len(data))]) == payloads


@pytest.mark.parametrize(("header_length", "length_fmt"), FORMATS)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_round_trip_other_header_formats(header_length, length_fmt, data):
    limit = (1 << (8 * header_length)) - 1 if header_length < 4 else 1 << 16
    framing = Framing(header_length, length_fmt, max_frame_bytes=min(limit, 1 << 16))
    payloads = data.draw(st.lists(st.binary(max_size=min(limit, 600)), max_size=20))
    cuts = data.draw(st.lists(st.integers(min_value=0), max_size=20))
    encoded = framing.encode_many(payloads)
    assert len(encoded) == sum(header_length + len(p) for p in payloads)
    assert decode_chunks(framing, chunked(encoded, cuts)) == payloads


def test_two_byte_header_layout():
    framing = Framing(2, ">H", max_frame_bytes=1000)
    assert framing.encode(b"abc") == b"\x00\x03abc"
    assert framing.split(b"\x00\x03abc\x00\x00\x00\x01z") == [b"abc", b"", b"z"]


def test_header_format_must_match_its_length():
    with pytest.raises(ValueError, match="not 4 bytes"):
        Framing(4, ">H")


def test_zero_length_frames_are_messages():
    data = struct.pack(">I", 0) * 3 + DEFAULT_FRAMING.encode(b"x") + struct.pack(">I", 0)
    assert DEFAULT_FRAMING.split(data) == [b"", b"", b"", b"x", b""]
    decoder = DEFAULT_FRAMING.decoder()
    assert decoder.feed(b"\x00\x00") == []
    assert decoder.feed(b"\x00\x00") == [b""]
    decoder.finish()


@settings(max_examples=200, deadline=None)
@given(payloads=st.lists(st.binary(max_size=100), min_size=1, max_size=20), data=st.data())
def test_truncated_stream_raises_with_the_partial_frame(payloads, data):
    encoded = DEFAULT_FRAMING.encode_many(payloads)
    last = 4 + len(payloads[-1])
    cut = data.draw(st.integers(min_value=1, max_value=last - 1)) if last > 1 else 1
    truncated = encoded[: len(encoded) - last + cut]  # ends `cut` bytes into the last frame
    decoder = DEFAULT_FRAMING.decoder()
    assert decoder.feed(truncated) == payloads[:-1]
    with pytest.raises(TruncatedFrame) as info:
        decoder.finish()
    assert info.value.partial == encoded[len(encoded) - last : len(encoded) - last + cut]
    assert info.value.expected == (len(payloads[-1]) if cut >= 4 else None)
    assert str(info.value) == (f"frame announced {len(payloads[-1])} payload bytes, only {cut - 4} arrived" if cut >= 4
                               else f"frame header incomplete: only {cut} of its 4 bytes arrived")
    with pytest.raises(TruncatedFrame):
        DEFAULT_FRAMING.split(truncated)


@settings(max_examples=300, deadline=None)
@given(garbage=st.binary(max_size=200))
def test_garbage_is_either_valid_framing_or_an_error(garbage):
    framing = Framing(max_frame_bytes=64)
    try:
        frames = framing.split(garbage)
    except TruncatedFrame as e:
        assert e.partial and garbage.endswith(e.partial)
    except FrameTooLarge as e:
        assert e.length > 64 and e.limit == 64
    else:
        assert framing.encode_many(frames) == garbage  # nothing decoded that was not there


def test_over_limit_length_raises_and_poisons_the_decoder():
    framing = Framing(max_frame_bytes=10)
    bad = struct.pack(">I", 11) + b"0123"
    decoder = framing.decoder()
    # Whole frames before the bad header come back first; the error surfaces on the next call.
    assert decoder.feed(framing.encode(b"ok") + framing.encode(b"") + bad) == [b"ok", b""]
    with pytest.raises(FrameTooLarge) as info:
        decoder.feed(b"")
    assert (info.value.length, info.value.limit) == (11, 10)
    assert str(info.value) == "frame header announces 11 payload bytes, over the limit of 10"
    assert decoder.pending() == bad  # everything after the last whole frame
    with pytest.raises(FrameTooLarge):
        decoder.feed(b"more")
    with pytest.raises(FrameTooLarge):
        decoder.finish()


def test_over_limit_length_first_raises_at_once():
    framing = Framing(max_frame_bytes=10)
    decoder = framing.decoder()
    with pytest.raises(FrameTooLarge):
        decoder.feed(struct.pack(">I", 1 << 31))
    with pytest.raises(FrameTooLarge):
        framing.split(framing.encode(b"x") + struct.pack(">I", 11) + b"x" * 11)


def test_encode_refuses_payloads_over_the_limit():
    framing = Framing(max_frame_bytes=3)
    assert framing.encode(b"abc") == b"\x00\x00\x00\x03abc"
    with pytest.raises(FrameTooLarge, match="^payload of 4 bytes, over the limit of 3$"):
        framing.encode(b"abcd")


def test_limit_is_inclusive_when_decoding():
    framing = Framing(max_frame_bytes=5)
    assert framing.split(framing.encode(b"12345")) == [b"12345"]


def test_text_file_messages_keep_their_line_endings(tmp_path):
    path = tmp_path / "mixed.log"
    path.write_bytes(b"first\nsecond\r\n\nlast without newline")
    assert list(iter_file_messages(path)) == [b"first\n", b"second\r\n", b"\n", b"last without newline"]


def test_sample_log_file_is_one_message_per_line():
    messages = list(iter_file_messages(DATA / "log_windowing" / "day_1.log"))
    assert len(messages) == 196
    assert all(m.endswith(b"\n") and m.count(b"\n") == 1 for m in messages)


def test_msg_file_is_split_into_its_frames():
    path = DATA / "market_spread" / "350-symbols_initial-nbbo-fixish.msg"
    messages = list(iter_file_messages(path))
    assert len(messages) == 350
    assert {len(m) for m in messages} == {42}
    assert all(m[0] == 2 for m in messages)
    assert DEFAULT_FRAMING.encode_many(messages) == path.read_bytes()


def test_invalid_msg_file_error_names_the_file(tmp_path):
    path = tmp_path / "broken.msg"
    path.write_bytes(DEFAULT_FRAMING.encode(b"whole") + b"\x00\x00\x00\x09part")
    with pytest.raises(ValueError, match="broken.msg"):
        list(iter_file_messages(path))


@given(st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")), max_size=30),
       st.sampled_from([b"\n", b"\r\n", b"\r"]), st.booleans(), st.integers(1, 60))
@settings(max_examples=300, deadline=None)
def test_line_offsets_and_line_batches_split_as_readlines_does(lines, newline, last_newline, limit):
    """The vectorized split of text files (ingest's fast path) equals the one-line-at-a-time reference
    (io.BytesIO.readlines, as iter_file_messages splits), and its batches equal `_batches` of those lines."""
    import io

    from transforms.ingestion.framing import line_offsets
    from transforms.ingestion.sender import _batches, _line_batches

    data = newline.join(lines) + (newline if last_newline and lines else b"")
    reference = io.BytesIO(data).readlines()
    offsets = line_offsets(data)
    assert [data[a:b] for a, b in zip(offsets[:-1], offsets[1:])] == reference
    got = [batch.to_pylist() for batch in _line_batches(data, offsets, limit, [b"END_OF_DAY"])]
    expected = [list(batch) for batch in _batches(reference, limit)] or [[]]
    expected[-1].append(b"END_OF_DAY")  # the marker rides with the last batch
    assert got == expected
