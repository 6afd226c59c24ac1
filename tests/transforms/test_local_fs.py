"""jvm/localfs: the Spark session's local file system sets permissions and reads links through java.nio,
as Hadoop's own does them, and Spark and Delta write checkpoints, state and tables with no `chmod` or
`readlink` process (Hadoop's own starts one for each file). Real Spark, real files, the JVM's own
record of the processes it starts (JDK Flight Recorder's jdk.ProcessStart)."""

import os
import stat
from contextlib import contextmanager

import pytest

from tests.conftest import land
from transforms import lake
from transforms.engine import run_application
from transforms.streams import bronze_application

pytestmark = pytest.mark.spark


def _hadoop(spark):
    jvm = spark.sparkContext._jvm
    return jvm, jvm.org.apache.hadoop, spark.sparkContext._jsc.hadoopConfiguration()


def test_the_sessions_local_file_systems_are_eventides(spark):
    jvm, hadoop, conf = _hadoop(spark)
    uri = jvm.java.net.URI("file:///")
    assert hadoop.fs.FileSystem.get(uri, conf).getClass().getName() == "eventide.hadoop.NioLocalFileSystem"
    context = hadoop.fs.FileContext.getFileContext(uri, conf)
    assert context.getDefaultFileSystem().getClass().getName() == "eventide.hadoop.NioLocalFs"


@pytest.mark.parametrize("mode", [0o644, 0o600, 0o640, 0o755, 0o700, 0o444, 0o1777])
def test_permissions_are_set_as_hadoop_sets_them(spark, tmp_path, mode):
    jvm, hadoop, conf = _hadoop(spark)
    ours = hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), conf).getRawFileSystem()
    target = tmp_path / "d"
    target.mkdir()
    ours.setPermission(hadoop.fs.Path(str(target)), hadoop.fs.permission.FsPermission(mode))
    assert stat.S_IMODE(os.stat(target).st_mode) == mode


def test_link_status_is_hadoops_for_a_file_a_folder_and_a_symbolic_link(spark, tmp_path):
    jvm, hadoop, conf = _hadoop(spark)
    ours = hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), conf).getRawFileSystem()
    hadoops = hadoop.fs.RawLocalFileSystem()
    hadoops.initialize(jvm.java.net.URI("file:///"), conf)
    (tmp_path / "file").write_text("x")
    (tmp_path / "folder").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "file")
    for name in ("file", "folder", "link"):
        for path in (str(tmp_path / name), f"file:{tmp_path / name}"):
            theirs = hadoops.getFileLinkStatus(hadoop.fs.Path(path))
            mine = ours.getFileLinkStatus(hadoop.fs.Path(path))
            assert mine.toString() == theirs.toString(), (name, path)
    with pytest.raises(Exception, match="FileNotFoundException"):
        ours.getFileLinkStatus(hadoop.fs.Path(str(tmp_path / "missing")))


@contextmanager
def _processes_started(spark, tmp_path):
    """The command lines of the processes the session's JVM starts meanwhile (JDK Flight Recorder)."""
    jvm = spark.sparkContext._jvm
    recording = jvm.jdk.jfr.Recording()
    recording.enable("jdk.ProcessStart")
    recording.start()
    started: list[str] = []
    try:
        yield started
    finally:
        recording.stop()
        dump = jvm.java.io.File(str(tmp_path / "processes.jfr")).toPath()
        recording.dump(dump)
        recording.close()
        started += [e.getString("command") for e in jvm.jdk.jfr.consumer.RecordingFile.readAllEvents(dump)]


def test_queries_checkpoints_state_and_delta_commits_start_no_chmod_or_readlink(spark, settings, tmp_path):
    from examples.words import word_count

    for lines in ([b"a b", b"b c"], [b"c d"]):  # two batches: checkpoint files, state, commits
        land(settings, "text", lines)
    with _processes_started(spark, tmp_path) as started:
        for app in (bronze_application(settings.registry.stream("text")), word_count):
            run_application(spark, app, settings)
    totals = {r["word"]: r["count"] for r in lake.read(settings.table_path("word_totals")).to_pylist()}
    assert totals == {"a": 1, "b": 2, "c": 2, "d": 1}
    assert not [c for c in started if c.split()[0] in ("chmod", "readlink")], started
    # and the files written have Hadoop's default modes (0666 and 0777 less its umask, 022)
    table = settings.table_path("word_totals")
    data = next(table.glob("*.parquet"))
    assert stat.S_IMODE(os.stat(data).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(table / "_delta_log").st_mode) == 0o755
    offsets = next(settings.home.glob("checkpoints/word_count/*/offsets/0"))
    assert stat.S_IMODE(os.stat(offsets).st_mode) == 0o644
