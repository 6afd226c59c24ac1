"""The gateway: one TCP port per stream, Wallaroo framing in, log records out (the landing log or Kafka).

It frames and persists, never decodes. Every whole frame becomes one landed message; input it cannot
frame (an oversized length, a connection ending inside a frame) is landed too, as a quarantine record
with `landing_error` set, so nothing that arrived is ever silently dropped. Bad input on one connection
closes that connection only.

Durability: after each chunk read from a socket the writer syncs (`LogWriter.sync`: the landing
pushes its journal to the OS, so a crash of this process loses nothing it has read, and recovery turns
the journal into a segment on the next start; Kafka's producer serves its delivery reports). A client
that half-closes its socket (`shutdown(SHUT_WR)`) and waits for the gateway to close its side gets one
confirmation byte (`LANDED_ACK`) first, written only once the log holds everything it sent: landed
and synced, or acknowledged by Kafka (acks=all) for every message of the connection (that is what
`send_files` waits for). A close without that byte (the gateway was stopped or killed, or Kafka did
not acknowledge some message: then the gateway logs why) confirms nothing.

One event loop, one thread: a LogWriter is not thread-safe, so every call to it happens on the loop.

`serve_forever` records the ports it bound in `<home>/gateway.json` (with its pid), so `eventide send`
finds a stream's port even when it was a free one; the file is removed on a clean stop.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from transforms.files import write_text_atomic
from transforms.ingestion import open_log
from transforms.ingestion.framing import LANDED_ACK, FrameDecoder, FrameTooLarge, Framing, TruncatedFrame
from transforms.ingestion.log import LogWriteError, LogWriter
from transforms.settings import ConfigError, Settings

log = logging.getLogger(__name__)

ROTATE_INTERVAL_SECONDS = 0.02  # the writer's tick: landing segments close by age or when quiet (Lander.rotate_due)
STATE_FILE = "gateway.json"


class GatewayError(RuntimeError):
    """The gateway cannot run as configured (e.g. a port is taken); the message says what to change."""


def framing_of(settings: Settings) -> Framing:
    return Framing(settings.header_length, settings.length_fmt, settings.max_frame_bytes)


class _Connection(asyncio.Protocol):
    """One client connection feeding one stream. Protocol callbacks (not streams): no per-read task."""

    def __init__(self, gateway: Gateway, stream: str):
        self.gateway = gateway
        self.stream = stream
        self.decoder = FrameDecoder(gateway.framing)
        self.transport: asyncio.Transport | None = None
        self.conn_id = ""
        self.finished = False  # its tail has been handled; later callbacks land nothing more

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        gw = self.gateway
        gw.connections_accepted += 1
        peer = transport.get_extra_info("peername") or ("?", 0)
        self.conn_id = f"tcp:{peer[0]}:{peer[1]}#{gw.connections_accepted}"
        gw._active.add(self)

    def data_received(self, data: bytes) -> None:
        if self.finished:
            return
        gw = self.gateway
        too_large: FrameTooLarge | None = None
        try:
            frames = self.decoder.feed(data)
        except FrameTooLarge as e:
            frames, too_large = [], e
        writer = gw.writer
        landed = writer.messages_landed
        try:
            writer.append_received(self.stream, frames, self.conn_id)
        except LogWriteError as e:
            self._refuse(str(e))
            return
        finally:
            gw.messages += writer.messages_landed - landed  # a refused read counts what it landed first
        if frames and too_large is None:
            # feed() hands back the whole frames before an oversized header and raises only on the
            # next call; ask now rather than waiting for more input that may never come.
            try:
                self.decoder.feed(b"")
            except FrameTooLarge as e:
                too_large = e
        if too_large is not None:
            pending = self.decoder.pending()  # the oversized header and what came after it
            self.finished = True
            gw._quarantine(self, pending, _too_large_reason(too_large, len(pending) - gw.framing.header_length))
            self.transport.close()
        writer.sync()

    def eof_received(self) -> bool:
        confirm = not self.finished
        self._finish("closed by the client")
        gw = self.gateway
        gw.writer.sync()
        if not confirm or self.transport is None:
            return False
        if gw.writer.unconfirmed(self.conn_id) or gw.writer.failure(self.conn_id):
            gw._confirming.add(self)  # the writer's tick confirms it, or closes it unconfirmed
            return True  # keep our side open until then
        self.transport.write(LANDED_ACK)  # all it sent is in the log (a dying process cannot say so)
        gw.writer.forget(self.conn_id)
        return False  # then close our side

    def confirm_if_done(self) -> bool:
        """On the writer's tick, for a half-closed connection waiting for its confirmation: write it and
        close once the log has acknowledged everything; close without it if the log says it never will.
        Returns whether the connection is done."""
        writer = self.gateway.writer
        failure = writer.failure(self.conn_id)
        if failure:
            self._refuse(failure)
            return True
        if writer.unconfirmed(self.conn_id):
            return False
        writer.forget(self.conn_id)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(LANDED_ACK)
            self.transport.close()
        return True

    def _refuse(self, why: str) -> None:
        """Close the connection without confirming: the log did not take some of what it sent."""
        self.finished = True
        self.gateway.writer.forget(self.conn_id)
        self.gateway.refused += 1
        log.error("%s (%s): closed without confirmation, the log did not take everything it sent: %s",
                  self.conn_id, self.stream, why)
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        gw = self.gateway
        if gw._stopping:
            how = "gateway stopped"
        elif exc is not None:
            how = f"connection lost: {exc}"
        else:
            how = "closed by the client"
        self._finish(how)
        gw.writer.sync()
        gw._confirming.discard(self)
        gw.writer.forget(self.conn_id)
        gw._active.discard(self)
        if not gw._active:
            gw._idle.set()

    def _finish(self, how: str) -> None:
        if self.finished:
            return
        self.finished = True
        try:
            self.decoder.finish()
        except TruncatedFrame as e:
            self.gateway._quarantine(self, e.partial, f"{e} ({how})")


def _too_large_reason(e: FrameTooLarge, arrived: int) -> str:
    """`e`, and how many payload bytes came after the header before the connection was closed."""
    if arrived <= e.length:
        came = f"{arrived} of them arrived"
    else:
        came = f"all of them and {arrived - e.length} bytes more arrived"
    return (f"{e}; {came} before the gateway closed the connection (landed as received, header included); "
            "raise EVENTIDE_MAX_FRAME_BYTES if frames this large are expected")


class Gateway:
    """TCP server landing framed messages; one listening port per registered stream (`settings.port_of`).

    Counters: `messages` (whole frames landed), `quarantined` (pieces of bad input landed with an
    error), `connections` (open now), `connections_accepted` (since start), `refused` (connections
    closed unconfirmed because the log did not take what they sent).

    `writer`: the log writer to use (default: `open_log(settings).writer()`, opened at start).
    """

    def __init__(self, settings: Settings, writer: LogWriter | None = None):
        self.settings = settings
        self.framing = framing_of(settings)
        self.writer: LogWriter | None = writer
        self._owns_writer = writer is None
        self._confirming: set[_Connection] = set()  # half-closed, waiting for the log's acknowledgement
        self.refused = 0
        self._servers: dict[str, asyncio.AbstractServer] = {}
        self._ports: dict[str, int] = {}
        self._active: set[_Connection] = set()
        self._idle = asyncio.Event()
        self._rotator: asyncio.Task | None = None
        self._stopping = False
        self.messages = 0
        self.quarantined = 0
        self.connections_accepted = 0

    @property
    def connections(self) -> int:
        return len(self._active)

    @property
    def landed(self) -> int:
        """Everything landed: whole frames plus quarantined pieces."""
        return self.messages + self.quarantined

    @property
    def bound_ports(self) -> dict[str, int]:
        """Stream -> the port actually listened on (port 0 in settings means any free port)."""
        return dict(self._ports)

    def _streams(self) -> list[str]:
        """Every registered stream; a port set for an unknown stream fails here, before any client lands."""
        registry = self.settings.registry
        unknown = sorted(set(self.settings.ports) - set(registry.streams))
        if unknown:  # a typo, or a port for an app that is not registered: say so rather than ignore it
            raise ConfigError(
                f"EVENTIDE_PORTS sets a port for {', '.join(map(repr, unknown))}, which no registered app declares "
                f"(apps: {', '.join(registry.entries) or 'none'}; streams: {', '.join(registry.streams) or 'none'}). "
                "Register the app that reads it (EVENTIDE_APPS or --app), or remove it from EVENTIDE_PORTS."
            )
        return list(registry.streams)

    async def start(self) -> None:
        """Open the log (the landing: LandingBusy if another process holds it) and listen on every port."""
        if self.writer is None:
            self.writer = open_log(self.settings).writer()
        loop = asyncio.get_running_loop()
        host = self.settings.bind_host
        try:
            for stream in self._streams():
                port = self.settings.port_of(stream)
                try:
                    self._servers[stream] = await loop.create_server(
                        lambda stream=stream: _Connection(self, stream), host, port, backlog=1024
                    )
                except OSError as e:
                    raise GatewayError(
                        f"cannot listen for stream {stream!r} on {host}:{port}: {e.strerror or e}. "
                        "Is another `eventide serve` running? Choose ports with EVENTIDE_PORTS."
                    ) from e
        except BaseException:
            for server in self._servers.values():
                server.close()
            self._servers.clear()
            if self._owns_writer:
                self.writer.close()
                self.writer = None
            raise
        self._ports = {stream: server.sockets[0].getsockname()[1] for stream, server in self._servers.items()}
        self._rotator = loop.create_task(self._rotate_periodically())

    async def _rotate_periodically(self) -> None:
        # The landing rotates by size on append; closing by age needs a clock, which is this task. Kafka's
        # delivery reports are served here too, and the connections waiting for them confirmed.
        while True:
            await asyncio.sleep(ROTATE_INTERVAL_SECONDS)
            try:
                self.writer.tick()
            except Exception:
                log.exception("the log's periodic work failed (closing a landing segment?); will retry")
            for conn in list(self._confirming):
                if conn.confirm_if_done():
                    self._confirming.discard(conn)

    def flush(self) -> None:
        """Make everything landed so far visible (close open segments). Call on the loop."""
        self.writer.flush()

    async def stop(self) -> None:
        """Stop listening, close client connections (landing any partial frame), close all segments."""
        if self.writer is None:
            return
        self._stopping = True
        for server in self._servers.values():
            server.close()
        if self._active:
            self._idle.clear()
            for conn in list(self._active):
                conn.transport.close()
            try:
                await asyncio.wait_for(self._idle.wait(), timeout=5.0)
            except asyncio.TimeoutError:
                log.warning("%d connections did not close in time", len(self._active))
        for server in self._servers.values():
            await server.wait_closed()  # after closing the clients: on 3.12+ it waits for them
        if self._rotator is not None:
            self._rotator.cancel()
            try:
                await self._rotator
            except asyncio.CancelledError:
                pass
        if self._owns_writer:
            self.writer.close()
            self.writer = None
        else:
            self.writer.flush()

    def _quarantine(self, conn: _Connection, data: bytes, error: str) -> None:
        try:
            self.writer.append(conn.stream, data, conn.conn_id, error=error)
        except LogWriteError as e:
            log.error("%s (%s): could not write its bad input to the log (%s): %s", conn.conn_id, conn.stream, e, error)
            return
        self.quarantined += 1
        log.warning("%s (%s): %s", conn.conn_id, conn.stream, error)


class GatewayThread:
    """A Gateway on its own event loop in a background thread (demo, tests, benchmarks).

    `with GatewayThread(settings) as gw:` starts it and stops it (flushing segments) on exit.
    """

    def __init__(self, settings: Settings, writer: LogWriter | None = None):
        self.settings = settings
        self.gateway = Gateway(settings, writer)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop_requested: asyncio.Event | None = None
        self._error: BaseException | None = None

    def start(self, timeout: float = 30.0) -> GatewayThread:
        """Start the thread; returns once every port is bound (or raises what start() raised)."""
        self._thread = threading.Thread(
            target=asyncio.run, args=(self._main(),), name="eventide-gateway", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the gateway did not start within {timeout} s")
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        try:
            await self.gateway.start()
        except BaseException as e:
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        await self._stop_requested.wait()
        try:
            await self.gateway.stop()
        except BaseException as e:
            self._error = e

    @property
    def bound_ports(self) -> dict[str, int]:
        return self.gateway.bound_ports

    @property
    def messages(self) -> int:
        return self.gateway.messages

    @property
    def quarantined(self) -> int:
        return self.gateway.quarantined

    @property
    def connections(self) -> int:
        return self.gateway.connections

    def wait_for_messages(self, n: int, timeout: float = 10.0) -> int:
        """Wait until >= n messages (frames plus quarantined pieces) are landed; returns the count."""
        deadline = time.monotonic() + timeout
        while (landed := self.gateway.landed) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the gateway landed {landed} messages within {timeout} s, expected {n}")
            time.sleep(0.005)
        return landed

    def flush(self, timeout: float = 30.0) -> None:
        """Close open segments now, from any thread."""
        self._run_on_loop(self.gateway.flush, timeout)

    def _run_on_loop(self, fn: Callable[[], object], timeout: float) -> object:
        async def call() -> object:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        if self._thread is None or not self._thread.is_alive():
            return
        self._loop.call_soon_threadsafe(self._stop_requested.set)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the gateway did not stop within {timeout} s")
        if self._error is not None:
            raise self._error

    def __enter__(self) -> GatewayThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# -- the running gateway's ports, recorded for `eventide send` --------------------------------------------
def state_path(settings: Settings) -> Path:
    return settings.home / STATE_FILE


def record_ports(settings: Settings, ports: dict[str, int], queries: bool = False) -> Path:
    """Write `<home>/gateway.json` (pid, host, ports, whether the queries run too, started_at)
    atomically: a reader never sees half."""
    path = state_path(settings)
    state = {
        "pid": os.getpid(),
        "host": settings.bind_host,
        "ports": ports,
        "queries": queries,
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    write_text_atomic(path, json.dumps(state, indent=2) + "\n")
    return path


def forget_ports(settings: Settings) -> None:
    """Remove the record if it is this process's (a newer gateway's record is left alone)."""
    path = state_path(settings)
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


def running_gateway(settings: Settings) -> dict | None:
    """The record of the gateway serving this home, or None if there is none or its process is gone."""
    try:
        state = json.loads(state_path(settings).read_text())
        pid = int(state["pid"])
        ports = {str(k): int(v) for k, v in state["ports"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # missing or unreadable: as if no gateway recorded anything
    if not _alive(pid):
        return None  # killed without a clean stop: the record is stale
    return {**state, "pid": pid, "ports": ports}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _say(line: str) -> None:
    print(line, flush=True)  # flushed: `eventide serve` output often goes to a pipe or a log file


def serve_forever(
    settings: Settings, progress: Callable[[str], None] = _say, progress_interval: float = 5.0, service=None
) -> dict[str, int]:
    """Run the gateway (and `service`: the queries, orchestration/service.py) until SIGINT or SIGTERM.
    Stopping: the gateway stops accepting and closes every segment, then the service stops (its
    batches in flight commit first). Main thread only.

    Raises LandingBusy if another process holds the landing area, GatewayError if a port is taken.
    Returns the final counters.
    """
    return asyncio.run(_serve(settings, progress, progress_interval, service))


async def _serve(settings: Settings, progress: Callable[[str], None], progress_interval: float, service) -> dict:
    gateway = Gateway(settings)
    await gateway.start()
    record = record_ports(settings, gateway.bound_ports, queries=service is not None)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    # Installed explicitly: a process started in the background by a shell inherits SIGINT ignored,
    # and add_signal_handler replaces an ignored disposition with ours.
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    host = settings.bind_host
    progress(f"eventide gateway writing to {open_log(settings).describe()}")
    for stream, port in gateway.bound_ports.items():
        progress(f"listening for {stream} on {host}:{port}")
    progress(f"ports recorded in {record} (`eventide send STREAM FILE` finds them)")
    if service is not None:
        service.start()
    started = last_time = time.monotonic()
    last_count = 0
    last_connections = 0
    try:
        while not stop.is_set():
            if service is not None and service.error is not None:
                break  # the queries cannot run: stop rather than land what nothing will process
            try:
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                pass
            now, landed, conns = time.monotonic(), gateway.landed, gateway.connections
            if now - last_time < progress_interval:
                continue
            if landed != last_count or conns != last_connections:  # quiet while idle
                rate = (landed - last_count) / max(now - last_time, 1e-9)
                progress(
                    f"landed {landed} messages ({gateway.quarantined} quarantined), {rate:,.0f} msgs/s, "
                    f"{conns} connections"
                )
            last_time, last_count, last_connections = now, landed, conns
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        try:
            await gateway.stop()
        finally:
            try:
                if service is not None:
                    progress("gateway closed; stopping the queries (batches in flight commit first) ...")
                    await asyncio.get_running_loop().run_in_executor(None, service.stop)
            finally:
                forget_ports(settings)
    totals = {
        "messages": gateway.messages,
        "quarantined": gateway.quarantined,
        "connections": gateway.connections_accepted,
    }
    progress(
        f"gateway stopped after {time.monotonic() - started:.1f} s: {gateway.messages} messages, "
        f"{gateway.quarantined} quarantined, {gateway.connections_accepted} connections; all segments closed"
    )
    return totals
