package ruleplatform.fs;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.io.IOException;
import java.net.URI;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.Set;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The platform's local file system leaves files and folders with the permissions
 * Hadoop's own gives them (which sets them with `chmod`), for every mode and umask a
 * checkpoint could be written with, checksum files included.
 */
class ForklessLocalFileSystemTest {
    @TempDir
    java.nio.file.Path tmp;

    private static FileSystem fs(FileSystem impl, String umask) throws IOException {
        Configuration conf = new Configuration(false);
        conf.set("fs.permissions.umask-mode", umask);
        impl.initialize(URI.create("file:///"), conf);
        return impl;
    }

    private static Set<PosixFilePermission> perms(java.nio.file.Path p) throws IOException {
        return Files.getPosixFilePermissions(p);
    }

    @Test
    void filesAndFoldersGetTheModesHadoopsOwnGives() throws IOException {
        for (String umask : new String[] {"022", "077", "002", "000"}) {
            FileSystem ours = fs(new ForklessLocalFileSystem(), umask);
            FileSystem hadoops = fs(new LocalFileSystem(), umask);
            for (int mode : new int[] {0644, 0600, 0755, 0777, 0640, 0444, 0700, 0}) {
                String name = umask + "-" + Integer.toOctalString(mode);
                Path a = new Path(tmp.resolve("ours-" + name).toUri());
                Path b = new Path(tmp.resolve("hadoop-" + name).toUri());
                FsPermission perm = new FsPermission((short) mode);
                ours.create(a, perm, true, 4096, (short) 1, 1 << 20, null).close();
                hadoops.create(b, perm, true, 4096, (short) 1, 1 << 20, null).close();
                assertEquals(perms(tmp.resolve("hadoop-" + name)), perms(tmp.resolve("ours-" + name)), name);
                assertEquals(perms(tmp.resolve(".hadoop-" + name + ".crc")), perms(tmp.resolve(".ours-" + name + ".crc")),
                    name + " checksum");
                Path da = new Path(tmp.resolve("dir-ours-" + name).toUri());
                Path db = new Path(tmp.resolve("dir-hadoop-" + name).toUri());
                ours.mkdirs(da, perm);
                hadoops.mkdirs(db, perm);
                assertEquals(perms(tmp.resolve("dir-hadoop-" + name)), perms(tmp.resolve("dir-ours-" + name)),
                    name + " folder");
            }
        }
    }

    @Test
    void eachPermissionBitIsItsOwn() {
        for (int bit = 0; bit < 9; bit++) {
            String rwx = PosixFilePermissions.toString(ForklessLocalFileSystem.Raw.posix(1 << bit));
            assertEquals(new FsPermission((short) (1 << bit)).toString(), rwx, "bit " + bit);
        }
        assertEquals("rwxr-x---", PosixFilePermissions.toString(ForklessLocalFileSystem.Raw.posix(0750)));
    }
}
