package eventide.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's raw local file system, with permissions set and symbolic links looked at through java.nio.
 *
 * <p>Without Hadoop's native library (pyspark ships none) {@link RawLocalFileSystem} starts a process for
 * each: {@code chmod} for every file and folder it creates, {@code readlink} for every file a checkpoint or
 * Delta commit renames. That was 266 processes for a two-query run of 29 lines, a few ms each from a JVM of a
 * gigabyte or more. Everything else is Hadoop's own.
 */
public class NioRawLocalFileSystem extends RawLocalFileSystem {
  /** The permission of each mode bit, lowest first (others' execute is 01). */
  private static final PosixFilePermission[] BITS = {
      PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
      PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
      PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ};

  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    short mode = permission.toShort();
    if ((mode & ~0777) != 0) {  // the sticky bit, which java.nio cannot set: as Hadoop does it
      super.setPermission(p, permission);
      return;
    }
    Set<PosixFilePermission> permissions = EnumSet.noneOf(PosixFilePermission.class);
    for (int bit = 0; bit < BITS.length; bit++) {
      if ((mode & (1 << bit)) != 0) {
        permissions.add(BITS[bit]);
      }
    }
    Files.setPosixFilePermissions(pathToFile(p).toPath(), permissions);
  }

  @Override
  public FileStatus getFileLinkStatus(Path f) throws IOException {
    // Hadoop's answer for anything but a symbolic link is the file's own status.
    if (Files.isSymbolicLink(pathToFile(f).toPath())) {
      return super.getFileLinkStatus(f);
    }
    return getFileStatus(f);
  }
}
