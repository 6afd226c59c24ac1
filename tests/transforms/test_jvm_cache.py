"""The driver JVM's class-data cache: one process records, the others wait for it, the archive is then
used; a recording cut short is never put in place. With the real `java`."""

import os
import subprocess
from pathlib import Path

import pytest

from transforms import jvm_cache, record_jvm_cache

JAVA_HOME = os.environ.get("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64")
JAVA = Path(JAVA_HOME) / "bin" / "java"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "eventide"


def _path(option: str) -> Path:
    return Path(option.split("=", 1)[1])


def test_one_start_records_the_others_wait_then_all_use_the_archive(cache):
    (record,) = jvm_cache.java_options(JAVA_HOME, now=1000.0)
    assert record.startswith("-XX:ArchiveClassesAtExit=")
    assert jvm_cache.java_options(JAVA_HOME, now=1001.0) == []  # claimed: not a second recording

    recording = _path(record)
    subprocess.run([str(JAVA), record, "-version"], check=True, capture_output=True)  # written at exit
    os.utime(recording, (1100.0, 1100.0))
    assert jvm_cache.java_options(JAVA_HOME, now=1110.0) == []  # maybe still being written
    (use,) = jvm_cache.java_options(JAVA_HOME, now=1100.0 + jvm_cache.FINISHED_AFTER_SECONDS)
    assert use.startswith("-XX:SharedArchiveFile=") and _path(use).stat().st_size > 0
    assert not recording.exists() and not any(cache.glob("*.claim"))
    assert jvm_cache.java_options(JAVA_HOME, now=5000.0) == [use]
    # -Xshare:on fails if the archive cannot be mapped: this proves a JVM uses it.
    subprocess.run([str(JAVA), use, "-Xshare:on", "-version"], check=True, capture_output=True)


def test_a_recording_cut_short_is_thrown_away_and_recorded_again(cache):
    (record,) = jvm_cache.java_options(JAVA_HOME, now=1000.0)
    subprocess.run([str(JAVA), record, "-version"], check=True, capture_output=True)
    recording = _path(record)
    data = recording.read_bytes()
    recording.chmod(0o644)
    # As its JVM leaves it if killed while writing: the header, written last, still zeros.
    recording.write_bytes(bytes(4096) + data[4096: len(data) // 2])
    os.utime(recording, (1000.0, 1000.0))
    (again,) = jvm_cache.java_options(JAVA_HOME, now=2000.0)
    assert again == record and not any(cache.glob("*.jsa"))


def test_a_claim_whose_jvm_died_expires(cache):
    jvm_cache.java_options(JAVA_HOME, now=1000.0)
    claim = next(cache.glob("*.claim"))
    os.utime(claim, (1000.0, 1000.0))
    assert jvm_cache.java_options(JAVA_HOME, now=1000.0 + jvm_cache.CLAIM_EXPIRES_SECONDS + 1)[0].startswith(
        "-XX:ArchiveClassesAtExit=")


def test_another_java_or_pyspark_gets_another_archive(tmp_path):
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "a-1.jar").touch()
    one = jvm_cache.archive_key(JAVA_HOME, jars)
    (jars / "a-2.jar").touch()
    assert jvm_cache.archive_key(JAVA_HOME, jars) != one
    assert jvm_cache.archive_key("/usr/lib/jvm/other", jars) != jvm_cache.archive_key(JAVA_HOME, jars)
    other = tmp_path / "other-venv" / "jars"
    other.mkdir(parents=True)
    for jar in jars.iterdir():
        (other / jar.name).touch()
    assert jvm_cache.archive_key(JAVA_HOME, other) != jvm_cache.archive_key(JAVA_HOME, jars)


def test_a_jar_rebuilt_or_copied_again_under_its_name_gets_another_archive(tmp_path):
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "a-1.jar").write_bytes(b"one")
    extra = tmp_path / "eventide-localfs.jar"
    extra.write_bytes(b"classes")
    one = jvm_cache.archive_key(JAVA_HOME, jars, [str(extra)])
    os.utime(jars / "a-1.jar", ns=(10**18, 10**18))  # copied again: same bytes, a new time
    two = jvm_cache.archive_key(JAVA_HOME, jars, [str(extra)])
    extra.write_bytes(b"classes, rebuilt")
    three = jvm_cache.archive_key(JAVA_HOME, jars, [str(extra)])
    assert len({one, two, three}) == 3
    assert jvm_cache.archive_key(JAVA_HOME, jars, [str(extra)]) == three  # nothing changed: the same one


def test_java_refuses_an_archive_once_a_jar_on_its_class_path_changed_time(tmp_path):
    """Why the key carries each jar's time: Java maps no archive whose jars changed since it was recorded.
    Without -Xshare:on it starts without it, silently: the cost the key avoids."""
    import pyspark

    jar = tmp_path / "launcher.jar"
    jar.write_bytes(next((Path(pyspark.__file__).parent / "jars").glob("spark-launcher_*.jar")).read_bytes())
    archive = tmp_path / "a.jsa"
    main = ["-cp", str(jar), "org.apache.spark.launcher.Main"]  # loads a class from the jar, then prints usage
    subprocess.run([str(JAVA), f"-XX:ArchiveClassesAtExit={archive}", *main], capture_output=True)
    same = subprocess.run([str(JAVA), f"-XX:SharedArchiveFile={archive}", "-Xshare:on", *main],
                          capture_output=True, text=True)
    assert "shared archive" not in same.stderr + same.stdout
    os.utime(jar, (1_000_000_000, 1_000_000_000))
    touched = subprocess.run([str(JAVA), f"-XX:SharedArchiveFile={archive}", "-Xshare:on", *main],
                             capture_output=True, text=True)
    assert "A jar file is not the one used while building the shared archive file" in touched.stdout + touched.stderr


def test_archives_no_jvm_started_with_for_two_weeks_go_when_the_next_is_recorded(cache):
    cache.mkdir(parents=True)
    now = 10 * jvm_cache.UNUSED_ARCHIVE_SECONDS
    stale, recent = cache / "jvm-classes-0000000000000000.jsa", cache / "jvm-classes-1111111111111111.jsa"
    for path, age in ((stale, jvm_cache.UNUSED_ARCHIVE_SECONDS + 60), (recent, jvm_cache.UNUSED_ARCHIVE_SECONDS - 60)):
        path.write_bytes(b"x")
        os.utime(path, (now - age, now - age))
    current = jvm_cache.archive_path(JAVA_HOME)
    (record,) = jvm_cache.java_options(JAVA_HOME, now=now)  # none for this key: claimed, the stale one pruned
    assert record.startswith("-XX:ArchiveClassesAtExit=")
    assert not stale.exists() and recent.exists()
    # A JVM starting with an archive marks it used (at most hourly), so one in use is never pruned.
    current.write_bytes(b"x")
    os.utime(current, (now - 7200, now - 7200))
    jvm_cache.java_options(JAVA_HOME, now=now)
    assert current.stat().st_mtime == now


def test_a_jvm_given_a_recording_cut_short_starts_without_it(tmp_path):
    """Why only the header matters: a dump cut short has none, and the JVM then ignores the file."""
    archive = tmp_path / "cut.jsa"
    subprocess.run([str(JAVA), f"-XX:ArchiveClassesAtExit={archive}", "-version"], check=True, capture_output=True)
    data = archive.read_bytes()
    assert data[:4] == jvm_cache.DYNAMIC_ARCHIVE_MAGIC
    archive.chmod(0o644)
    archive.write_bytes(bytes(4096) + data[4096: len(data) // 2])
    done = subprocess.run([str(JAVA), f"-XX:SharedArchiveFile={archive}", "-version"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.spark
def test_the_recorded_archive_holds_sparks_and_deltas_classes_and_is_recorded_once():
    """`python -m transforms.record_jvm_cache`, which `make setup` runs before any JVM of the demo or the
    tests: a short run in a process of its own records the archive in the real cache and puts it in place
    once its JVM is gone. Here it is found in place (recorded now if this test runs without make: a
    minute), and a second call records nothing.
    Recording into an empty cache costs a whole Spark run, so the suite checks make's recording instead of
    making a second one (40-80 s of a worker)."""
    said = []
    archive = record_jvm_cache.record_now(JAVA_HOME, say=said.append)
    assert archive is not None and archive.exists(), said
    assert not any(archive.parent.glob(f"{archive.stem}.*.recording"))
    assert not archive.with_suffix(".claim").exists()
    assert jvm_cache.java_options(JAVA_HOME) == [f"-XX:SharedArchiveFile={archive}"]
    # It holds Spark's and Delta's classes, not only the JDK's (a JVM maps it: the first test above).
    names = archive.read_bytes()
    assert b"org/apache/spark/sql/SparkSession" in names and b"org/apache/spark/sql/delta/DeltaLog" in names
    assert b"org/apache/spark/sql/execution/streaming/state/RocksDBStateStoreProvider" in names
    said.clear()
    assert record_jvm_cache.record_now(JAVA_HOME, say=said.append) == archive and said == []
