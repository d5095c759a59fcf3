package ruleplatform.fs;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.io.nativeio.NativeIO;

/**
 * Hadoop's local file system (`file:`), setting permissions through java.nio instead of
 * a `chmod` process. Without Hadoop's native library (pip's pyspark ships none) every
 * file and folder Hadoop creates with a permission starts `chmod`, a fork of the JVM:
 * a streaming checkpoint on a local disk makes several per micro-batch (offsets,
 * commits, each state store's changelog, each with its checksum file), on the path of
 * the batch. The permissions set are the same; modes java.nio cannot express (setuid,
 * setgid, sticky) and machines with the native library keep Hadoop's own way.
 */
public final class ForklessLocalFileSystem extends LocalFileSystem {
    public ForklessLocalFileSystem() {
        super(new Raw());
    }

    /** The raw local file system under the checksums, with the permission setter replaced. */
    static final class Raw extends RawLocalFileSystem {
        private static final PosixFilePermission[] BITS = {
            PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
            PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
            PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ,
        };

        @Override
        public void setPermission(Path p, FsPermission permission) throws IOException {
            short mode = permission.toShort();
            if ((mode & ~0777) != 0 || NativeIO.isAvailable()) {
                super.setPermission(p, permission);
                return;
            }
            Files.setPosixFilePermissions(pathToFile(p).toPath(), posix(mode));
        }

        static Set<PosixFilePermission> posix(int mode) {
            Set<PosixFilePermission> out = EnumSet.noneOf(PosixFilePermission.class);
            for (int i = 0; i < BITS.length; i++) {
                if ((mode & (1 << i)) != 0) {
                    out.add(BITS[i]);
                }
            }
            return out;
        }
    }
}
