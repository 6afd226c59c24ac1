"""The zygote of driver-side Python processes (transforms/python_zygote.py): real processes and Unix sockets.
A forked module runs as a cold one would (the asker's streams, environment, folder; its exit code comes
back); no zygote, no fork; a stopped asker stops its child; the zygote outlives neither its starter nor
its stdin; and a real keyed query's driver-side process is a fork of the session's zygote."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from transforms.python_zygote import Zygote, ask, new_address

PROBE_MODULE = textwrap.dedent("""
    import os, sys, time
    print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("PROBE"), "parent", os.getppid(),
          "line", sys.stdin.readline().strip(), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    if sys.argv[1:] == ["sleep"]:
        time.sleep(120)
    sys.exit(3)
""")

ASKER = "import sys; from transforms.python_zygote import ask; code = ask(sys.argv[1], sys.argv[2:], sys.path); " \
        "print('none' if code is None else f'code {code}', file=sys.stderr); sys.exit(97 if code is None else code)"


def _ready(address: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(address):
        assert time.monotonic() < deadline, f"the zygote at {address} did not start listening"
        time.sleep(0.05)


def _gone(pid: int, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def zygote(tmp_path):
    address = new_address()
    assert address is not None
    started = Zygote(address, str(tmp_path / "zygote.log"))
    _ready(address)
    yield started
    started.stop()


@pytest.fixture
def probe_folder(tmp_path):
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "zygote_probe.py").write_text(PROBE_MODULE)
    return folder


def _ask(zygote_address, probe_folder, *args, **popen):
    return subprocess.Popen([sys.executable, "-c", ASKER, zygote_address, "zygote_probe", *args], cwd=probe_folder,
                            env={**os.environ, "PROBE": "from the asker"}, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def test_a_forked_module_has_the_askers_streams_environment_folder_and_exit_code(zygote, probe_folder):
    asker = _ask(zygote.address, probe_folder, "a1", "b2")
    out, err = asker.communicate("a line on stdin\n", timeout=60)
    assert asker.returncode == 3, err
    parent = out.split("parent ")[1].split()[0]
    assert out == (f"argv ['a1', 'b2'] cwd {probe_folder} env from the asker parent {parent} "
                   "line a line on stdin\n")
    assert int(parent) == zygote.process.pid  # forked, not started
    assert err.splitlines() == ["to stderr", "code 3"]
    assert "runs zygote_probe" in Path(zygote.log_path).read_text()


def test_without_a_zygote_the_asker_is_told_to_run_the_module_itself(tmp_path, probe_folder):
    assert ask(str(tmp_path / "no-zygote-here"), ["zygote_probe"], sys.path) is None
    asker = _ask(str(tmp_path / "no-zygote-here"), probe_folder)
    asker.communicate(timeout=60)
    assert asker.returncode == 97


def test_a_terminated_asker_terminates_its_child(zygote, probe_folder):
    asker = _ask(zygote.address, probe_folder, "sleep")
    asker.stdin.write("go\n")
    asker.stdin.flush()
    line = asker.stdout.readline()
    assert line.startswith("argv ['sleep']")
    children = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(p) == zygote.process.pid]
    assert len(children) == 1
    child = int(children[0].name)
    asker.send_signal(signal.SIGTERM)  # as Spark destroys a worker it is done with
    assert asker.wait(30) == 128 + signal.SIGTERM
    assert _gone(child)


def _ppid(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def _zygote_of_a_child() -> tuple[subprocess.Popen, str, str]:
    """A process (its own session) that has started a zygote and sleeps: it, its zygote's pid and address."""
    starter = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from transforms.python_zygote import Zygote, new_address; "
         "z = Zygote(new_address()); print(z.process.pid, z.address, flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    pid, address = starter.stdout.readline().split()
    _ready(address)
    return starter, pid, address


def test_the_zygote_stops_with_its_starter_and_leaves_no_socket(tmp_path):
    starter, pid, address = _zygote_of_a_child()
    starter.kill()  # kill -9: no atexit, no stop(); the pipe to the zygote's stdin closes with it
    starter.wait(30)
    assert _gone(int(pid))
    assert not os.path.exists(os.path.dirname(address))


@pytest.mark.spark
def test_a_keyed_querys_driver_side_python_is_a_fork_of_the_sessions_zygote(spark, settings):
    import pyarrow as pa

    from tests.conftest import land
    from transforms.api import Application, DeltaSink, decoder, source
    from transforms.engine import run_application
    from transforms.registry import registry_of
    from transforms.settings import Settings
    from transforms.spark import python_zygote
    from transforms.windowing import count_windows
    from windows import counting

    zygote = python_zygote()
    assert zygote is not None, "the tests' embedded session has the lean path, so a zygote"
    _ready(zygote.address)

    @decoder(schema=pa.schema([("sensor", pa.string())]))
    def reading(payload: bytes) -> dict:
        return {"sensor": payload.decode()}

    app = Application("zygote_probe", source("readings", decoder=reading).key_by("sensor")
                      .to(count_windows(2).over(counting()).emit(lambda w: {"sensor": w.key, "n": w.value}))
                      .named("counts").to_sink(DeltaSink("counts", schema=pa.schema([("sensor", pa.string()),
                                                                                        ("n", pa.int64())]))))
    settings = Settings(home=settings.home, app_registry=registry_of([app]))
    forks_before = Path(zygote.log_path).read_text().count("runs pyspark.sql.streaming.transform_with_state")
    land(settings, "readings", [b"a", b"a", b"b"])
    run_application(spark, app, settings)
    forks = Path(zygote.log_path).read_text().count("runs pyspark.sql.streaming.transform_with_state") - forks_before
    assert forks == 1  # one keyed query, one run: its schema step, forked
    rows = spark.read.format("delta").load(str(settings.table_path("counts"))).collect()
    assert [(r.sensor, r.n) for r in rows] == [("a", 2)]


def test_the_folder_of_a_zygote_killed_with_its_starter_is_removed_by_the_next_one(zygote, tmp_path):
    import tempfile

    from transforms.python_zygote import remove_stale_folders

    starter, pid, address = _zygote_of_a_child()
    os.killpg(starter.pid, signal.SIGKILL)  # as the tests' services are stopped: the zygote too, no cleanup
    starter.wait(30)
    assert _gone(int(pid))
    assert os.path.exists(address)  # left behind
    starting = tempfile.mkdtemp(prefix="eventide-zygote-", dir=tmp_path)  # no pid file yet: a zygote starting
    os.makedirs(tmp_path / "eventide-zygote-dead")
    (tmp_path / "eventide-zygote-dead" / "pid").write_text(pid)

    assert remove_stale_folders(str(tmp_path)) == [str(tmp_path / "eventide-zygote-dead")]
    assert os.path.isdir(starting)
    removed = remove_stale_folders(tempfile.gettempdir())
    assert os.path.dirname(address) in removed
    assert os.path.exists(zygote.address)  # a live one is kept
