"""Gateway landing throughput next to its limit: a plain Python socket reader that discards the bytes.

Both servers read the same byte streams from the same number of concurrent sender processes over
loopback. The gateway number is the time from "go" until every message is landed and its segment is
closed (flushed, fsynced, visible); the baseline is the time until the reader has seen end of stream on
every connection. Senders are processes, not threads, so they do not share the gateway's GIL.

    python -m bench.gateway [--messages-per-sender N] [--senders N] [--payload-size N] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import selectors
import socket
import tempfile
import threading
import time
from pathlib import Path

from transforms.ingestion.framing import DEFAULT_FRAMING
from transforms.ingestion.gateway import GatewayThread
from transforms.ingestion.landing import list_segments, read_landed
from transforms.settings import Settings

HOST = "127.0.0.1"


def _framed_stream(sender: int, messages: int, payload_size: int) -> bytes:
    filler = b"x" * payload_size
    return DEFAULT_FRAMING.encode_many(
        (b"%04d:%09d:" % (sender, i) + filler)[:payload_size] for i in range(messages)
    )


def _sender_process(port: int, sender: int, messages: int, payload_size: int, ready, go) -> None:
    data = _framed_stream(sender, messages, payload_size)
    with socket.create_connection((HOST, port)) as sock:
        ready.release()
        go.wait()
        view = memoryview(data)
        for i in range(0, len(data), 256 * 1024):
            sock.sendall(view[i : i + 256 * 1024])
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(300)
        while sock.recv(4096):  # wait for the server to close: it has read everything
            pass


def _run_senders(port: int, senders: int, messages: int, payload_size: int, until_done) -> float:
    """Start the senders, let them connect and build their streams, then time `until_done()` from go."""
    ctx = mp.get_context("spawn")  # no fork: the gateway thread is running in this process
    ready, go = ctx.Semaphore(0), ctx.Event()
    procs = [
        ctx.Process(target=_sender_process, args=(port, s, messages, payload_size, ready, go), daemon=True)
        for s in range(senders)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        if not ready.acquire(timeout=120):
            raise RuntimeError("a sender process did not connect")
    start = time.perf_counter()
    go.set()
    until_done()
    elapsed = time.perf_counter() - start
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            raise RuntimeError(f"sender process exited with {p.exitcode}")
    return elapsed


class _DiscardServer:
    """The baseline: one thread, a selector, recv into a buffer and drop it. No framing, no landing."""

    def __init__(self, connections: int):
        self.expected = connections
        self.listener = socket.create_server((HOST, 0), backlog=1024)
        self.port = self.listener.getsockname()[1]
        self.bytes_read = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.listener, selectors.EVENT_READ)
        ended = 0
        buf = bytearray(256 * 1024)
        while ended < self.expected:
            for key, _ in sel.select():
                sock = key.fileobj
                if sock is self.listener:
                    conn, _ = self.listener.accept()
                    conn.setblocking(False)
                    sel.register(conn, selectors.EVENT_READ)
                    continue
                n = sock.recv_into(buf)
                if n:
                    self.bytes_read += n
                else:
                    sel.unregister(sock)
                    sock.close()
                    ended += 1
        sel.close()
        self.listener.close()
        self.done.set()


def bench_socket_discard(messages_per_sender: int, senders: int, payload_size: int) -> float:
    server = _DiscardServer(senders)
    elapsed = _run_senders(
        server.port, senders, messages_per_sender, payload_size, lambda: server.done.wait(600)
    )
    expected = senders * messages_per_sender * (DEFAULT_FRAMING.header_length + payload_size)
    if server.bytes_read != expected:
        raise RuntimeError(f"discard server read {server.bytes_read} bytes, expected {expected}")
    return elapsed


def bench_gateway_landing(messages_per_sender: int, senders: int, payload_size: int) -> tuple[float, int]:
    """Seconds until all messages are landed and flushed, and the number of segments written."""
    total = senders * messages_per_sender
    with tempfile.TemporaryDirectory(prefix="eventide-bench-") as home:
        settings = Settings(home=Path(home), ports={"text": 0})
        with GatewayThread(settings) as gw:

            def landed_and_flushed() -> None:
                gw.wait_for_messages(total, timeout=600)
                gw.flush()

            elapsed = _run_senders(
                gw.bound_ports["text"], senders, messages_per_sender, payload_size, landed_and_flushed
            )
        landed = read_landed(settings, "text")
        if landed.num_rows != total or gw.quarantined:
            raise RuntimeError(f"landed {landed.num_rows} of {total} messages ({gw.quarantined} quarantined)")
        return elapsed, len(list_segments(settings, "text"))


def bench_gateway(
    results: dict,
    messages_per_sender: int = 250_000,
    senders: int = 4,
    payload_size: int = 100,
    repeats: int = 3,
) -> dict:
    """Best of `repeats` runs of each (throughput limits are best measured by the least-disturbed run)."""
    total = senders * messages_per_sender
    discard_s = min(bench_socket_discard(messages_per_sender, senders, payload_size) for _ in range(repeats))
    gateway_runs = [bench_gateway_landing(messages_per_sender, senders, payload_size) for _ in range(repeats)]
    gateway_s, segments = min(gateway_runs)
    gateway_rate, discard_rate = total / gateway_s, total / discard_s
    frame_bytes = payload_size + DEFAULT_FRAMING.header_length
    results.update(
        {
            "gateway_messages": total,
            "gateway_senders": senders,
            "gateway_payload_bytes": payload_size,
            "gateway_seconds": round(gateway_s, 3),
            "gateway_msgs_per_s": round(gateway_rate),
            "gateway_mb_per_s": round(total * frame_bytes / gateway_s / 1e6, 1),
            "gateway_segments": segments,
            "socket_discard_seconds": round(discard_s, 3),
            "socket_discard_msgs_per_s": round(discard_rate),
            "socket_discard_mb_per_s": round(total * frame_bytes / discard_s / 1e6, 1),
            "gateway_vs_discard_ratio": round(gateway_rate / discard_rate, 4),
        }
    )
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages-per-sender", type=int, default=250_000)
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--payload-size", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    results: dict = {}
    bench_gateway(results, args.messages_per_sender, args.senders, args.payload_size, args.repeats)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
