"""A TCP listener for tests of TCP sinks: real sockets on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
import time

from transforms.ingestion.framing import DEFAULT_FRAMING
from transforms.ports import bound_socket


class Receiver:
    """Listens on 127.0.0.1; collects every byte of every connection (with its arrival time)."""

    def __init__(self, port: int | None = None):
        # Below the kernel's ephemeral range (transforms/ports.py): no client of a server gone from a port-0
        # port (a stopped driver's executor, say) can reach this receiver by that port being handed out again.
        self.server = bound_socket() if port is None else socket.create_server(("127.0.0.1", port))
        self.server.listen()
        self.port = self.server.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.chunks: list[bytes] = []
        self.arrivals: list[tuple[float, bytes]] = []  # (time.time() at receipt, chunk)
        self.by_connection: list[list[bytes]] = []  # every connection's chunks, in order
        self.connections = 0
        self.open = 0
        self.cond = threading.Condition()
        self.reading = threading.Event()  # clear it to stop reading: the sender's socket buffers fill up
        self.reading.set()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with self.cond:
                self.connections += 1
                self.open += 1
                mine: list[bytes] = []
                self.by_connection.append(mine)
            threading.Thread(target=self._read, args=(conn, mine), daemon=True).start()

    def _read(self, conn, mine: list[bytes]):
        with conn:
            while self.reading.wait() and (data := conn.recv(65536)):
                with self.cond:
                    mine.append(data)
                    self.chunks.append(data)
                    self.arrivals.append((time.time(), data))
                    self.cond.notify_all()
        with self.cond:
            self.open -= 1
            self.cond.notify_all()

    def received(self) -> bytes:
        """Every byte received so far, in arrival order (one sender at a time)."""
        with self.cond:
            return b"".join(self.chunks)

    def all_bytes(self, connections: int = 1, timeout: float = 30.0) -> bytes:
        """Every byte once at least `connections` were accepted and all are closed (a run's TCP sink closes
        when the run ends), connection after connection in the order they were accepted: a closed
        connection whose bytes are still being read does not interleave with the next one."""
        with self.cond:
            assert self.cond.wait_for(lambda: self.connections >= connections and self.open == 0, timeout), (
                f"{self.connections} connection(s) accepted, {self.open} open; expected {connections}, all closed")
            return b"".join(b"".join(chunks) for chunks in self.by_connection)

    def payloads(self, timeout: float = 10.0) -> list[bytes]:
        """The frames received so far, connection after connection, once every connection is closed (the
        engine closes after a run): two connections' chunks in arrival order could cut each other's frames."""
        with self.cond:
            assert self.cond.wait_for(lambda: self.open == 0, timeout), "the TCP sink left its connection open"
            return DEFAULT_FRAMING.split(b"".join(b"".join(chunks) for chunks in self.by_connection))

    def wait_for_frames(self, n: int, timeout: float) -> list[tuple[float, bytes]]:
        """Wait until `n` frames arrived (connections may stay open); (arrival time, frame) of each."""
        def frames():  # one sink connection at a time: its chunks in order make whole frames
            dec, out = DEFAULT_FRAMING.decoder(), []
            for t, chunk in self.arrivals:
                out.extend((t, f) for f in dec.feed(chunk))
            return out

        with self.cond:
            self.cond.wait_for(lambda: len(frames()) >= n, timeout)
            return frames()

    def whole_frames(self) -> list[bytes]:
        """Every whole frame of every connection; a frame cut short by a dying sender is not one."""
        with self.cond:
            out = []
            for chunks in self.by_connection:
                out.extend(DEFAULT_FRAMING.decoder().feed(b"".join(chunks)))
            return out

    def whole_lines(self) -> list[bytes]:
        """Every newline-terminated line of every connection (a cut-off last line is not one)."""
        with self.cond:
            return [line for chunks in self.by_connection for line in b"".join(chunks).split(b"\n")[:-1]]

    def close(self):
        self.server.close()

