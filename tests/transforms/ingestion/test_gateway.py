"""The gateway over real loopback TCP, the sender, `ingest_files`, and a crash of `serve_forever`."""

from __future__ import annotations

import os
import random
import signal
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from tests.services import Service
from transforms.ingestion.framing import DEFAULT_FRAMING, LANDED_ACK, Framing
from transforms.ingestion.gateway import GatewayError, GatewayThread
from transforms.ingestion.landing import Lander, LandingBusy, list_segments, read_landed
from transforms.ingestion.sender import GatewayUnavailable, InputFileError, ingest_files, send_files
from transforms.ports import free_port
from transforms.settings import ConfigError, Settings

DATA = Path(__file__).resolve().parents[3] / "data" / "wallaroo"
MARKET = Settings().group_of("orders")  # the landing log market_data and orders share
DAY_1 = DATA / "log_windowing" / "day_1.log"
DAY_2 = DATA / "log_windowing" / "day_2.log"
NBBO = DATA / "market_spread" / "350-symbols_initial-nbbo-fixish.msg"
ANY_FREE_PORT = {"logs": 0, "market_data": 0, "orders": 0, "text": 0}
HOST = "127.0.0.1"


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(home=tmp_path / "home", ports=dict(ANY_FREE_PORT))


@pytest.fixture
def gateway(settings):
    with GatewayThread(settings) as gw:
        yield gw


def landed(settings: Settings, group: str) -> list[dict]:
    return read_landed(settings, group).to_pylist()


def connect(gw: GatewayThread, stream: str) -> socket.socket:
    sock = socket.create_connection((HOST, gw.bound_ports[stream]), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def finish(sock: socket.socket) -> None:
    """Half-close and wait for the gateway's confirmation and close: everything sent is then landed."""
    sock.shutdown(socket.SHUT_WR)
    assert sock.recv(1) == LANDED_ACK
    assert sock.recv(1) == b""
    sock.close()


def test_messages_arrive_exactly(gateway, settings):
    rng = random.Random(7)
    payloads = [rng.randbytes(rng.randrange(0, 3000)) for _ in range(500)]
    data = DEFAULT_FRAMING.encode_many(payloads)
    sock = connect(gateway, "text")
    pos = 0
    while pos < len(data):  # uneven writes: frames straddle reads
        step = rng.randrange(1, 5000)
        sock.sendall(data[pos : pos + step])
        pos += step
    finish(sock)
    assert gateway.messages == 500 and gateway.quarantined == 0
    gateway.stop()
    got = landed(settings, "text")
    assert [r["payload"] for r in got] == payloads
    assert [r["seq"] for r in got] == list(range(1, 501))
    assert {r["stream"] for r in got} == {"text"}
    assert len({r["connection"] for r in got}) == 1
    assert got[0]["connection"].startswith("tcp:127.0.0.1:") and got[0]["connection"].endswith("#1")
    assert all(r["landing_error"] is None for r in got)
    assert list_segments(settings, "text") and not list((settings.landing / "text").glob(".journal-*"))


def test_zero_length_frames_are_landed(gateway, settings):
    sock = connect(gateway, "logs")
    sock.sendall(struct.pack(">I", 0) * 3 + DEFAULT_FRAMING.encode(b"x") + struct.pack(">I", 0))
    finish(sock)
    gateway.stop()
    assert [r["payload"] for r in landed(settings, "logs")] == [b"", b"", b"", b"x", b""]


def test_each_port_lands_into_its_own_stream(gateway, settings):
    for stream in ("market_data", "orders", "logs"):
        sock = connect(gateway, stream)
        sock.sendall(DEFAULT_FRAMING.encode(stream.encode()))
        finish(sock)
    gateway.stop()
    assert [(r["stream"], r["payload"]) for r in landed(settings, MARKET)] == [
        ("market_data", b"market_data"),
        ("orders", b"orders"),
    ]
    assert [r["seq"] for r in landed(settings, MARKET)] == [1, 2]
    assert [r["seq"] for r in landed(settings, "logs")] == [3]


@pytest.mark.parametrize("bad_header_alone", [False, True], ids=["after-whole-frames", "alone"])
def test_oversized_frame_is_quarantined_and_closes_only_its_connection(tmp_path, bad_header_alone):
    settings = Settings(home=tmp_path, ports=dict(ANY_FREE_PORT), max_frame_bytes=100)
    with GatewayThread(settings) as gw:
        good = connect(gw, "text")
        good.sendall(DEFAULT_FRAMING.encode(b"good 1"))
        gw.wait_for_messages(1)

        bad = connect(gw, "text")
        bad_tail = struct.pack(">I", 5000) + (b"" if bad_header_alone else b"start of a huge frame")
        before = [] if bad_header_alone else [b"bad ok 1", b"bad ok 2"]
        bad.sendall(DEFAULT_FRAMING.encode_many(before) + bad_tail)
        bad.settimeout(10)
        try:
            assert bad.recv(1) == b""  # the gateway closed this connection
        except ConnectionResetError:
            pass
        bad.close()

        good.sendall(DEFAULT_FRAMING.encode(b"good 2"))  # the other connection still works
        finish(good)
        assert gw.quarantined == 1
        assert gw.messages == 2 + len(before)
    got = landed(settings, "text")
    quarantined = [r for r in got if r["landing_error"]]
    assert len(quarantined) == 1
    assert quarantined[0]["payload"] == bad_tail
    came = "0 of them" if bad_header_alone else "21 of them"  # payload bytes, never the header's 4
    assert quarantined[0]["landing_error"] == (
        f"frame header announces 5000 payload bytes, over the limit of 100; {came} arrived before the gateway "
        "closed the connection (landed as received, header included); "
        "raise EVENTIDE_MAX_FRAME_BYTES if frames this large are expected")
    bad_conn = quarantined[0]["connection"]
    assert [r["payload"] for r in got if r["connection"] == bad_conn] == [*before, bad_tail]
    assert [r["payload"] for r in got if r["connection"] != bad_conn] == [b"good 1", b"good 2"]


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        (struct.pack(">I", 10) + b"abc", "frame announced 10 payload bytes, only 3 arrived"),
        (b"\x00\x00", "frame header incomplete: only 2 of its 4 bytes arrived"),
    ],
    ids=["inside-payload", "inside-header"],
)
def test_connection_closing_mid_frame_lands_the_partial_frame(gateway, settings, tail, reason):
    sock = connect(gateway, "logs")
    sock.sendall(DEFAULT_FRAMING.encode(b"whole") + tail)
    finish(sock)
    gateway.stop()
    got = landed(settings, "logs")
    assert [r["payload"] for r in got] == [b"whole", tail]
    assert got[0]["landing_error"] is None
    assert got[1]["landing_error"] == f"{reason} (closed by the client)"


def test_stopping_lands_partial_frames_of_open_connections(gateway, settings):
    sock = connect(gateway, "logs")
    sock.sendall(DEFAULT_FRAMING.encode(b"whole") + struct.pack(">I", 9) + b"part")
    gateway.wait_for_messages(1)
    time.sleep(0.05)  # the partial frame has no message to wait for
    gateway.stop()
    sock.close()
    got = landed(settings, "logs")
    assert [r["payload"] for r in got] == [b"whole", struct.pack(">I", 9) + b"part"]
    assert got[1]["landing_error"].endswith("(gateway stopped)")


def test_hundred_concurrent_senders_land_everything_exactly_once(gateway, settings):
    senders, per_sender = 100, 200
    sockets = [connect(gateway, "text") for _ in range(senders)]
    deadline = time.monotonic() + 10
    while gateway.connections < senders:  # all 100 are open at the same time
        assert time.monotonic() < deadline, f"only {gateway.connections} connections accepted"
        time.sleep(0.01)
    start = threading.Barrier(senders)
    errors: list[BaseException] = []

    def send(sender: int, sock: socket.socket) -> None:
        try:
            frames = [DEFAULT_FRAMING.encode(b"%03d:%05d" % (sender, i)) for i in range(per_sender)]
            start.wait()
            for i in range(0, per_sender, 20):  # many small writes, interleaved with the others
                sock.sendall(b"".join(frames[i : i + 20]))
            finish(sock)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=send, args=(i, s)) for i, s in enumerate(sockets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors[:3]
    assert gateway.messages == senders * per_sender
    gateway.stop()
    got = landed(settings, "text")
    assert len(got) == senders * per_sender
    assert len({r["payload"] for r in got}) == senders * per_sender
    assert [r["seq"] for r in got] == sorted(r["seq"] for r in got)
    assert len({r["seq"] for r in got}) == len(got)
    by_connection: dict[str, list[bytes]] = {}
    for r in got:
        by_connection.setdefault(r["connection"], []).append(r["payload"])
    assert len(by_connection) == senders
    for payloads in by_connection.values():
        sender = payloads[0][:3]
        assert payloads == [sender + b":%05d" % i for i in range(per_sender)]  # order kept per connection


def test_send_files_with_end_of_day(gateway, settings):
    sent = send_files("logs", [DAY_1], HOST, gateway.bound_ports["logs"], end_of_day=True)
    assert sent == 197
    sent = send_files("logs", [DAY_1, DAY_2], HOST, gateway.bound_ports["logs"], end_of_day=True)
    assert sent == 196 + 1 + 559 + 1
    gateway.stop()
    got = landed(settings, "logs")
    day_1 = DAY_1.read_bytes().splitlines(keepends=True)
    day_2 = DAY_2.read_bytes().splitlines(keepends=True)
    assert len(day_1) == 196
    expected = [*day_1, b"END_OF_DAY", *day_1, b"END_OF_DAY", *day_2, b"END_OF_DAY"]
    assert [r["payload"] for r in got] == expected
    assert all(p.endswith(b"\n") for p in day_1 + day_2)
    assert len({r["connection"] for r in got[:197]}) == 1 and got[0]["connection"] != got[197]["connection"]


def test_send_without_end_of_day_sends_only_lines(gateway, settings):
    assert send_files("logs", [DAY_1], HOST, gateway.bound_ports["logs"]) == 196
    gateway.stop()
    assert b"END_OF_DAY" not in [r["payload"] for r in landed(settings, "logs")]


def test_send_says_how_far_a_big_send_has_got(gateway, settings, tmp_path, monkeypatch):
    import transforms.ingestion.sender as sender

    monkeypatch.setattr(sender, "PROGRESS_EVERY_SECONDS", 0.0)  # every chunk, instead of every 2 s
    big = tmp_path / "big.txt"
    big.write_bytes(b"".join(b"line %07d of a big file\n" % i for i in range(120_000)))  # about 3 MB
    said = []
    assert send_files("text", [big], HOST, gateway.bound_ports["text"], progress=said.append) == 120_000
    assert len(said) >= 3 and said[-1].startswith("sent ") and "(100%)" in said[-1], said
    percents = [int(line.split("(")[1].split("%")[0]) for line in said]
    assert percents == sorted(percents) and percents[0] < 100


def test_send_msg_file_byte_for_byte(gateway, settings):
    assert send_files("market_data", [NBBO], HOST, gateway.bound_ports["market_data"]) == 350
    gateway.stop()
    payloads = [r["payload"] for r in landed(settings, MARKET)]
    assert len(payloads) == 350 and {len(p) for p in payloads} == {42}
    assert DEFAULT_FRAMING.encode_many(payloads) == NBBO.read_bytes()


def test_ingest_lands_what_sending_lands(tmp_path):
    files = [DAY_1, NBBO]  # a text file and a framed file, into one stream for the comparison
    over_tcp = Settings(home=tmp_path / "tcp", ports=dict(ANY_FREE_PORT))
    with GatewayThread(over_tcp) as gw:
        sent = send_files("text", files, HOST, gw.bound_ports["text"], end_of_day=True)
    direct = Settings(home=tmp_path / "direct")
    assert ingest_files(direct, "text", files, end_of_day=True) == sent == 196 + 1 + 350 + 1
    tcp_rows, direct_rows = landed(over_tcp, "text"), landed(direct, "text")
    assert [r["payload"] for r in direct_rows] == [r["payload"] for r in tcp_rows]
    assert [r["seq"] for r in direct_rows] == list(range(1, sent + 1))
    assert direct_rows[0]["connection"] == "file:day_1.log"
    assert direct_rows[-1]["connection"] == f"file:{NBBO.name}"
    assert not list((direct.landing / "text").glob(".journal-*"))  # flushed: all visible


def test_ingest_uses_a_given_lander_and_continues_its_sequence(settings):
    with Lander(settings) as lander:
        lander.append("logs", b"before")
        assert ingest_files(settings, "logs", [DAY_1], writer=lander) == 196
        assert len(landed(settings, "logs")) == 197  # flushed by ingest_files
        lander.append("logs", b"after")
    assert [r["seq"] for r in landed(settings, "logs")] == list(range(1, 199))


def test_ingest_rejects_bad_files_before_landing_anything(settings, tmp_path):
    broken = tmp_path / "broken.msg"
    broken.write_bytes(DEFAULT_FRAMING.encode(b"whole") + b"\x00\x00\x00\x09part")
    with pytest.raises(InputFileError, match="broken.msg"):
        ingest_files(settings, "market_data", [NBBO, broken])
    with pytest.raises(InputFileError, match="missing.log: cannot read"):
        ingest_files(settings, "logs", [DAY_1, tmp_path / "missing.log"])
    with pytest.raises(ConfigError, match="unknown stream"):
        ingest_files(settings, "nope", [DAY_1])
    assert list_segments(settings) == []


def test_frames_in_a_txt_file_are_refused_unless_framed_is_said(tmp_path, gateway, settings):
    # Before: a binary file named .txt went out as one message per "line", silently wrong.
    payloads = [b"kitchen,21.5", b"garage,4.0", b""]
    frames = tmp_path / "readings.txt"
    frames.write_bytes(DEFAULT_FRAMING.encode_many(payloads))
    with pytest.raises(InputFileError, match=r"readings.txt looks like length-prefixed frames, not text lines "
                                             r"\(3 frames .* tile it exactly\); pass --framed \(or --lines"):
        send_files("text", [frames], HOST, gateway.bound_ports["text"])
    assert gateway.gateway.connections_accepted == 0  # refused before connecting
    assert send_files("text", [frames], HOST, gateway.bound_ports["text"], framed=True) == 3
    gateway.stop()
    assert [r["payload"] for r in landed(settings, "text")] == payloads


def test_binary_file_read_as_lines_needs_lines_said(settings, tmp_path):
    binary = tmp_path / "dump.log"
    binary.write_bytes(b"abc\x00def\nmore\n")
    with pytest.raises(InputFileError, match=r"dump.log looks like .* NUL byte at offset 3\); pass --framed"):
        ingest_files(settings, "logs", [binary])
    assert list_segments(settings) == []
    assert ingest_files(settings, "logs", [binary], framed=False) == 2  # --lines: as text, as asked
    assert [r["payload"] for r in landed(settings, "logs")] == [b"abc\x00def\n", b"more\n"]


def test_text_file_named_msg_is_refused_unless_lines_is_said(settings, tmp_path):
    # Before: refused with a bare frame-length error that did not say what to do.
    text = tmp_path / "day.msg"
    text.write_bytes(DAY_1.read_bytes())
    with pytest.raises(InputFileError, match=r"day.msg does not look framed \(it starts with text b'.*'.*\): "
                                             r"it looks like text lines; pass --lines"):
        ingest_files(settings, "logs", [text])
    short = tmp_path / "short.msg"  # binary, but its first length header runs past the end
    short.write_bytes(struct.pack(">I", 16) + b"\x01\x02\x03")
    with pytest.raises(InputFileError, match=r"short.msg does not look framed \(its first length header says 16 "
                                             r"bytes but the file has 3 after it\)"):
        ingest_files(settings, "logs", [short])
    small = Settings(home=settings.home, max_frame_bytes=100)
    big = tmp_path / "big.msg"
    big.write_bytes(struct.pack(">I", 5000) + bytes(5000))
    with pytest.raises(InputFileError, match=r"big.msg does not look framed \(its first length header says 5000 "
                                             r"bytes, over the frame limit of 100\)"):
        ingest_files(small, "logs", [big])
    assert list_segments(settings) == []
    # Said explicitly: no guessing. --framed on text is a plain framing error; --lines lands the lines.
    with pytest.raises(InputFileError, match=r"day.msg: not a valid framed file: frame header announces \d+ payload bytes, over the limit of 1048576"):
        ingest_files(settings, "logs", [text], framed=True)
    assert ingest_files(settings, "logs", [text], framed=False) == 196
    assert [r["payload"] for r in landed(settings, "logs")] == DAY_1.read_bytes().splitlines(keepends=True)


def test_long_line_is_refused_by_the_sender(tmp_path, gateway, settings):
    small = Framing(max_frame_bytes=10)
    path = tmp_path / "long.log"
    path.write_bytes(b"short\n" + b"x" * 20 + b"\n")
    with pytest.raises(InputFileError, match="long.log: line 2 is 21 bytes"):
        send_files("logs", [path], HOST, gateway.bound_ports["logs"], framing=small)
    assert gateway.gateway.connections_accepted == 0  # checked before connecting


def test_ingest_while_the_gateway_runs_is_busy(gateway, settings):
    with pytest.raises(LandingBusy, match="eventide send"):
        ingest_files(settings, "logs", [DAY_1])


def test_send_to_nothing_says_start_the_gateway():
    with pytest.raises(GatewayUnavailable, match="eventide serve"):
        send_files("logs", [DAY_1], HOST, free_port())


def test_port_in_use_is_a_clear_error_and_releases_the_landing(tmp_path):
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = Settings(home=tmp_path, ports={"logs": 0, "text": port})
        with pytest.raises(GatewayError, match=f"'text' on 127.0.0.1:{port}"):
            GatewayThread(settings).start()
    Lander(settings).close()  # the failed start did not keep the lock


def test_segments_close_by_time_without_flush(tmp_path):
    settings = Settings(home=tmp_path, ports=dict(ANY_FREE_PORT), segment_max_seconds=0.2)
    with GatewayThread(settings) as gw:
        sock = connect(gw, "logs")
        sock.sendall(DEFAULT_FRAMING.encode(b"soon visible"))
        gw.wait_for_messages(1)
        deadline = time.monotonic() + 5
        while not list_segments(settings, "logs"):
            assert time.monotonic() < deadline, "no segment closed by time"
            time.sleep(0.02)
        assert [r["payload"] for r in landed(settings, "logs")] == [b"soon visible"]
        sock.close()


def test_flush_from_another_thread_makes_messages_visible(gateway, settings):
    sock = connect(gateway, "logs")
    sock.sendall(DEFAULT_FRAMING.encode_many([b"a", b"b"]))
    gateway.wait_for_messages(2)
    gateway.flush()
    assert [r["payload"] for r in landed(settings, "logs")] == [b"a", b"b"]
    sock.close()


# -- the service as a process: SIGKILL mid-stream, restart, SIGTERM ------------------------------------

def lines_file(path: Path, prefix: str, n: int) -> list[bytes]:
    lines = [b"%s-%06d\n" % (prefix.encode(), i) for i in range(n)]
    path.write_bytes(b"".join(lines))
    return lines


def test_service_killed_mid_stream_loses_nothing_confirmed(tmp_path):
    home = tmp_path / "home"
    port = free_port()
    env = {
        **os.environ,
        "EVENTIDE_HOME": str(home),
        "EVENTIDE_PORTS": f"logs={port},market_data=0,orders=0,text=0",
        # Nothing closes by time: at the kill, confirmed messages sit in an open journal only.
        "EVENTIDE_SEGMENT_MAX_SECONDS": "600",
    }
    settings = Settings.from_env(env)
    first = lines_file(tmp_path / "first.log", "first", 3000)
    third = lines_file(tmp_path / "third.log", "third", 2000)
    second = [b"second-%07d\n" % i for i in range(300_000)]

    service = Service(env, tmp_path)
    assert service.wait_for_line("listening for logs") == f"listening for logs on 127.0.0.1:{port}"
    assert send_files("logs", [tmp_path / "first.log"], HOST, port) == 3000  # confirmed by the gateway
    journal_dir = home / "landing" / "logs"

    def journal_bytes() -> int:
        total = 0
        for path in journal_dir.glob(".journal-*"):
            try:
                total += path.stat().st_size
            except FileNotFoundError:
                pass  # closed between listing and stat
        return total

    journal_size_after_first = journal_bytes()
    assert journal_size_after_first > 0 and not list_segments(settings, "logs")

    # A sender streaming when the process dies: kill once some of its messages are in the journal.
    streaming = socket.create_connection((HOST, port), timeout=10)

    def stream_until_killed() -> None:
        data = DEFAULT_FRAMING.encode_many(second)
        try:
            for i in range(0, len(data), 8192):
                streaming.sendall(data[i : i + 8192])
        except OSError:
            pass  # the gateway died under us

    sender = threading.Thread(target=stream_until_killed, daemon=True)
    sender.start()
    deadline = time.monotonic() + 20
    while journal_bytes() <= journal_size_after_first:
        assert time.monotonic() < deadline, "the gateway landed nothing of the second stream"
        time.sleep(0.001)
    assert service.stop(signal.SIGKILL) == -signal.SIGKILL
    sender.join(10)
    streaming.close()

    restarted = Service(env, tmp_path)  # Lander recovery turns the journals into segments
    restarted.wait_for_line("listening for logs")
    assert send_files("logs", [tmp_path / "third.log"], HOST, port) == 2000
    restarted.wait_for_line("landed ")  # a progress line
    assert restarted.stop(signal.SIGTERM) == 0
    assert restarted.wait_for_line("gateway stopped").startswith("gateway stopped after")
    assert not list(journal_dir.glob(".journal-*"))

    got = landed(settings, "logs")
    seqs = [r["seq"] for r in got]
    assert seqs == sorted(set(seqs))
    messages = [r["payload"] for r in got if r["landing_error"] is None]
    # A torn journal record is possible when the kill hits a write; it is quarantined, never dropped.
    torn = [r for r in got if r["landing_error"]]
    assert all(r["connection"] == "recovery" and "torn" in r["landing_error"] for r in torn)
    assert len(torn) <= 1
    landed_second = [m for m in messages if m.startswith(b"second-")]
    assert 0 < len(landed_second) < len(second)
    assert landed_second == second[: len(landed_second)]  # a prefix, in order, nothing twice
    assert messages == first + landed_second + third


def test_benchmark_lands_every_message():
    """The benchmark's own checks (every byte read, every message landed) on a small run; no timing asserts."""
    from bench.gateway import bench_gateway

    results = bench_gateway({}, messages_per_sender=2000, senders=2, payload_size=20, repeats=1)
    assert results["gateway_messages"] == 4000
    assert results["gateway_msgs_per_s"] > 0 and results["socket_discard_msgs_per_s"] > 0
    assert results["gateway_vs_discard_ratio"] > 0


def test_serve_forever_reports_a_busy_landing(settings):
    from transforms.ingestion.gateway import serve_forever

    output: list[str] = []
    with Lander(settings), pytest.raises(LandingBusy, match="in use by process"):
        serve_forever(settings, progress=output.append)
    assert output == []
