"""The driver JVM's class-data cache (Java's dynamic AppCDS archive).

Starting Spark loads and verifies thousands of classes, and the first streaming query loads
thousands more (state store, codegen, Arrow). A JVM started with `-XX:SharedArchiveFile` maps the
classes a previous run recorded instead (measured: `eventide run` over 10k messages 17.3 -> 14.3 s).

The first JVM of a given Java and pyspark claims the recording (an exclusive file) and records its
classes at exit (`-XX:ArchiveClassesAtExit`): that run takes about 5 s longer, and its JVM writes the
archive for about 10 s after the process. A later start that finds the recording finished renames it
into place once it is complete (see DYNAMIC_ARCHIVE_MAGIC: a recording cut short is thrown away and
recorded again); starts in between run without an archive and do not record.
The archive belongs to one Java binary and one jar set, so its name carries a hash of both.

Left to itself, the first JVM records, and when that JVM lives long (the tests' shared session, a
`serve`) nobody has the archive until it exits or its claim expires (15 min). `python -m
transforms.record_jvm_cache` (run by `make setup`) records it at once instead (record_jvm_cache.py).
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

FINISHED_AFTER_SECONDS = 30.0  # a recording not written to for this long is complete
CLAIM_EXPIRES_SECONDS = 900.0  # a claim this old without a recording: that JVM died; record again
# An archive is about 200 MB, and each change of Java or jars makes a new one: those no JVM has started
# with for this long are deleted when the next is recorded (the cache folder serves every venv here).
UNUSED_ARCHIVE_SECONDS = 14 * 86400.0


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eventide"


def _stamp(path: Path | str) -> str:
    """A file's path, size and modification time: what Java checks of each class-path jar (and of itself)
    before it maps an archive. A jar rebuilt or copied again under the same name (jvm/localfs, `make
    setup` after the jars folder was removed) no longer matches, and the JVM then starts without the
    archive, silently (measured: a session's start 3.5 -> 6.9 s); a new key records a new one."""
    try:
        st = os.stat(path)
    except OSError:
        return f"{path}:missing"
    return f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}"


def archive_key(java_home: str, jars: Path, extra: list[str] = ()) -> str:
    """Names the Java binary and the jar set (pyspark's and the extra class path) an archive is valid for."""
    import pyspark

    found = sorted(jars.glob("*.jar")) if jars.is_dir() else []
    libjvm = Path(java_home) / "lib" / "server" / "libjvm.so"  # a Java updated in place (apt) is another JVM
    # The archive records the jars' paths: another install (venv) of the same pyspark needs its own.
    text = "|".join([os.path.realpath(java_home), _stamp(libjvm), os.path.realpath(jars), pyspark.__version__,
                     *(_stamp(j) for j in found), *(_stamp(j) for j in extra)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _age(path: Path, now: float) -> float | None:
    try:
        return now - path.stat().st_mtime
    except OSError:
        return None


# A dynamic archive's first bytes (CDS_DYNAMIC_ARCHIVE_MAGIC 0xf00baba8, little-endian). The JVM
# writes the header last (measured: zeros until the last moment of the dump), so a dump cut short has
# none, and a JVM given such a file starts without it; a file cut after its header was written would
# crash the JVM that maps it (SIGBUS, measured), which is why only a finished recording is put in place.
DYNAMIC_ARCHIVE_MAGIC = bytes.fromhex("a8ab0bf0")


def is_complete(recording: Path) -> bool:
    try:
        with open(recording, "rb") as f:
            return f.read(4) == DYNAMIC_ARCHIVE_MAGIC
    except OSError:
        return False


def archive_path(java_home: str) -> Path:
    """Where this Java's and jar set's archive lives (it may not exist yet)."""
    import pyspark

    from transforms.lake.session import jar_paths

    key = archive_key(java_home, Path(pyspark.__file__).parent / "jars", jar_paths())
    return cache_dir() / f"jvm-classes-{key}.jsa"


def tidy(archive: Path, now: float) -> None:
    """Put a finished recording in place; throw away one cut short (and its claim: record again) and
    any left once the archive is there."""
    claim = archive.with_suffix(".claim")
    # Each recorder writes its own file (a claim can expire while a long-lived JVM still records).
    for recording in sorted(archive.parent.glob(f"{archive.stem}.*.recording")):
        age = _age(recording, now)
        if age is None or age < FINISHED_AFTER_SECONDS:
            continue  # maybe still being written
        if not archive.exists() and is_complete(recording):
            try:
                os.replace(recording, archive)
                continue
            except OSError:
                pass  # another start moved it
        if not archive.exists():
            claim.unlink(missing_ok=True)  # cut short (its JVM killed while writing): record again
        recording.unlink(missing_ok=True)


def _mark_used(archive: Path, now: float) -> None:
    """An archive's modification time says when a JVM last started with it (at most an hour off)."""
    age = _age(archive, now)
    if age is not None and age > 3600:
        try:
            os.utime(archive, (now, now))
        except OSError:
            pass  # another user's cache: it is kept


def prune_unused(folder: Path, now: float) -> list[Path]:
    """Delete the archives no JVM has started with for UNUSED_ARCHIVE_SECONDS; returns them."""
    gone = []
    for old in folder.glob("jvm-classes-*.jsa"):
        age = _age(old, now)
        if age is not None and age > UNUSED_ARCHIVE_SECONDS:
            try:
                old.unlink()
                gone.append(old)
            except OSError:
                pass
    return gone


def java_options(java_home: str | None, now: float | None = None) -> list[str]:
    """The JVM options that use this Java's and pyspark's archive, or record one if nobody is."""
    if not java_home:
        return []
    archive = archive_path(java_home)
    folder = archive.parent
    claim = archive.with_suffix(".claim")
    now = time.time() if now is None else now
    tidy(archive, now)
    if archive.exists():
        claim.unlink(missing_ok=True)
        _mark_used(archive, now)
        return [f"-XX:SharedArchiveFile={archive}"]
    claim_age = _age(claim, now)
    if claim_age is not None and claim_age < CLAIM_EXPIRES_SECONDS:
        return []  # another JVM is recording: start without
    try:
        folder.mkdir(parents=True, exist_ok=True)
        claim.unlink(missing_ok=True)  # expired
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except OSError:
        return []  # another start claimed it first (or the cache folder is not writable)
    prune_unused(folder, now)
    return [f"-XX:ArchiveClassesAtExit={folder / f'{archive.stem}.{os.getpid()}.recording'}"]
