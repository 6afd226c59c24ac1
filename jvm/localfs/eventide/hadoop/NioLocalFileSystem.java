package eventide.hadoop;

import org.apache.hadoop.fs.LocalFileSystem;

/** Hadoop's {@code file:} file system (checksums over the raw one) over {@link NioRawLocalFileSystem}. */
public class NioLocalFileSystem extends LocalFileSystem {
  public NioLocalFileSystem() {
    super(new NioRawLocalFileSystem());
  }
}
