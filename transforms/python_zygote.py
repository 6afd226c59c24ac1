"""A warm Python that Spark's one-off driver-side Python processes are forked from, instead of started cold.

transformWithStateInPandas starts a fresh Python on the driver at the first batch of every run of every
keyed query (pyspark.sql.streaming.transform_with_state_driver_worker), only to learn the processor's state
variables. Its imports (pyspark's worker modules, pandas, the engine the pickled processor names) were most
of its 0.7-1.1 s life, and that life most of the batch's planning (bench/README.md, issue L's thirty-second
sitting). This process has them imported already: for each such start it forks a child that takes on the
starting process's standard streams (passed over a Unix socket), environment, folder and module path, and
runs the module there.

The client is the launcher Spark runs (transforms/python_launcher.py, `ask`): it sends what the child
needs, forwards a SIGTERM to the child, and exits with the child's exit code. When no zygote answers (not
started, still importing, gone) the launcher runs the module itself, as before. The zygote lives as long
as the process that started it (transforms/spark.py): it stops when its stdin, a pipe from that process,
reads end-of-file, however that process ended.

Wire: the launcher sends one byte with its fds 0, 1, 2 (SCM_RIGHTS), then a length-prefixed JSON header
(argv, env, cwd, path); the zygote's child answers `pid N` when it starts the module and `exit N` when
the module is done.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import sys

ZYGOTE_ENV = "EVENTIDE_PYTHON_ZYGOTE"
# The modules Spark starts as one-off processes that a fork serves as well as a cold start.
FORKED_MODULES = frozenset({"pyspark.sql.streaming.transform_with_state_driver_worker"})
# What those modules import, or what the processors they unpickle import: imported once, here.
PRELOADED = ("pyspark.sql.streaming.transform_with_state_driver_worker", "pandas", "pyarrow",
             "transforms.engine.keyed_state")
_LENGTH = struct.Struct("!I")


# -- the launcher's side ---------------------------------------------------------------------------
def ask(address: str, argv: list[str], path: list[str]) -> int | None:
    """Run `python -m argv[0] argv[1:]` in a child of the zygote at `address`; its exit code, or None
    when no zygote answered (the caller runs the module itself)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(address)
        socket.send_fds(conn, [b"\0"], [0, 1, 2])
        header = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "path": path}).encode()
        conn.sendall(_LENGTH.pack(len(header)) + header)
        lines = conn.makefile("r", encoding="ascii")
        first = lines.readline()
    except OSError:
        conn.close()
        return None
    if not first.startswith("pid "):  # the zygote stopped before its child started the module
        conn.close()
        return None
    child = int(first.split()[1])
    forwarded: list[int] = []

    def forward(signum, _frame):  # Spark stops a worker it is done with by destroying its process: this one
        forwarded.append(signum)
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    last = lines.readline()
    conn.close()
    if last.startswith("exit "):
        return int(last.split()[1])
    return 128 + forwarded[0] if forwarded else 1  # the child died without saying: killed, or crashed


# -- the zygote's side -----------------------------------------------------------------------------
def serve(address: str) -> None:
    """Import what the forked modules need, then fork a child per connection to `address` until stdin
    closes."""
    import importlib

    from transforms.python_daemon import use_lean_path

    use_lean_path(sys.path)
    with open(os.path.join(os.path.dirname(address), "pid"), "w") as f:  # for remove_stale_folders
        f.write(str(os.getpid()))
    for name in PRELOADED:
        importlib.import_module(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children; their codes go by socket
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    partial = f"{address}.{os.getpid()}"
    listener.bind(partial)
    listener.listen(16)
    os.rename(partial, address)  # answer only once listening: a launcher that finds no socket runs cold
    try:
        while True:
            ready, _, _ = select.select([listener, sys.stdin], [], [])
            if sys.stdin in ready and not os.read(sys.stdin.fileno(), 4096):
                return  # the starting process is gone
            if listener in ready:
                conn, _ = listener.accept()
                if os.fork() == 0:
                    listener.close()
                    os._exit(_run_child(conn))
                conn.close()
    finally:
        folder = os.path.dirname(address)
        for remove, name in ((os.unlink, address), (os.unlink, os.path.join(folder, "pid")), (os.rmdir, folder)):
            try:  # the socket, its pid file, and its folder if nothing else is in it
                remove(name)
            except OSError:
                pass


def _run_child(conn: socket.socket) -> int:
    import runpy
    import traceback

    code = 1
    try:
        _, fds, _, _ = socket.recv_fds(conn, 1, 3)
        size = _LENGTH.unpack(_read_exactly(conn, _LENGTH.size))[0]
        header = json.loads(_read_exactly(conn, size))
        # To the zygote's own stderr (the Spark log) while it still is: which fork ran what.
        print(f"eventide python zygote: pid {os.getpid()} runs {header['argv'][0]}", file=sys.stderr, flush=True)
        for target, fd in enumerate(fds):  # the launcher's stdin, stdout and stderr (this fd 0 was the pipe)
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(header["cwd"])
        os.environ.clear()
        os.environ.update(header["env"])
        sys.path[:] = header["path"]
        sys.argv = list(header["argv"])
        conn.sendall(f"pid {os.getpid()}\n".encode())
        try:
            runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            if not isinstance(stop.code, int | None):
                print(stop.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        try:
            conn.sendall(f"exit {code}\n".encode())
        except OSError:
            pass
    return code


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError("the launcher closed the connection mid-header")
        data += chunk
    return bytes(data)


class Zygote:
    """A started zygote, as its starting process holds it."""

    def __init__(self, address: str, log_path: str | None = None):
        import subprocess

        self.address = address
        self.log_path = log_path
        log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 (the child keeps it)
        try:
            self.process = subprocess.Popen([sys.executable, "-m", "transforms.python_zygote", address],
                                            stdin=subprocess.PIPE, stdout=log, stderr=log)
        finally:
            if log_path:
                log.close()

    def stop(self) -> None:
        """Close its stdin (it stops) and wait for it; its folder goes with it."""
        import shutil
        import subprocess

        self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(os.path.dirname(self.address), ignore_errors=True)


FOLDER_PREFIX = "eventide-zygote-"


def new_address() -> str | None:
    """A socket address in a new private folder, or None where the temporary folder's path is too long
    for a Unix socket (108 bytes). Folders of zygotes killed with their starter (kill -9 of a process group
    leaves no one to clean up) go first."""
    import tempfile

    remove_stale_folders(tempfile.gettempdir())
    address = os.path.join(tempfile.mkdtemp(prefix=FOLDER_PREFIX), "socket")
    if len(address.encode()) < 100:
        return address
    os.rmdir(os.path.dirname(address))
    return None


def remove_stale_folders(parent: str, grace_s: float = 300.0) -> list[str]:
    """Remove this user's zygote folders under `parent` whose zygote is gone: its pid file names a process
    that is not a zygote any more, or (no pid file) the folder is older than `grace_s`. Returns them."""
    import shutil
    import time

    removed = []
    for entry in os.scandir(parent):
        if not entry.name.startswith(FOLDER_PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            try:
                with open(os.path.join(entry.path, "pid")) as f:
                    pid = int(f.read())
            except FileNotFoundError:
                if time.time() - entry.stat(follow_symlinks=False).st_mtime < grace_s:
                    continue  # a zygote still starting
            else:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"transforms.python_zygote" in f.read():
                        continue
        except FileNotFoundError:  # no such process: fall through and remove
            pass
        except (OSError, ValueError):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed


if __name__ == "__main__":  # python -m transforms.python_zygote ADDRESS (transforms/spark.py)
    serve(sys.argv[1])
