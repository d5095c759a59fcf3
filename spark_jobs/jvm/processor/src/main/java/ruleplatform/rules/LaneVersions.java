package ruleplatform.rules;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import org.apache.spark.TaskContext;

/**
 * Which rule-set version judges each record of the real-time lane, so that a rule change
 * reaches a running real-time batch within LANE_POLL_MS and a batch run again after a
 * crash still judges every record as the first run did.
 *
 * In real-time mode one long task reads each Kafka partition for the whole batch. Before
 * it judges a record it looks at `current` (at most every POLL_MS); when that names a
 * new version it appends "OFFSET HASH" to `batches/BATCH/TOPIC-PARTITION`: from that
 * offset on, that version judges. The file has one writer (the partition's task) and is
 * replaced whole, so a reader never sees part of it. A batch run again finds the file and
 * follows it without switching (it cannot know how far the first run got), so a change
 * published during a crashed batch applies from the next batch.
 */
final class LaneVersions {
    /** How stale a task's view of `current` may be: a change is in force this long after its publish. */
    static final long POLL_MS = 200;

    private final Path root;
    private final String batch;
    private final Map<String, Partition> partitions = new HashMap<>();

    LaneVersions(String dir) {
        this.root = Paths.get(dir);
        TaskContext task = TaskContext.get();
        String id = task == null ? null : task.getLocalProperty(BatchVersions.BATCH_ID_KEY);
        this.batch = id == null ? "none" : id;
    }

    /** The rule set that judges the record at `seq` (partition << 40 | offset) of `topic`. */
    RuleSet forRecord(String topic, long seq) {
        int part = (int) (seq >>> 40);
        long offset = seq & ((1L << 40) - 1);
        String key = topic + "-" + part;
        Partition p = partitions.get(key);
        if (p == null) {
            p = new Partition(root.resolve("batches").resolve(batch).resolve(key));
            partitions.put(key, p);
        }
        String hash = p.hashAt(offset, root.resolve("current"));
        return RuleSets.compiled(hash, () -> read(root.resolve("specs").resolve(hash + ".json")));
    }

    /** One partition's switches in this batch. */
    private static final class Partition {
        private final Path file;
        private final List<long[]> from = new ArrayList<>();  // {offset, index into hashes}
        private final List<String> hashes = new ArrayList<>();
        private final boolean replay;
        private long checkedAt;

        Partition(Path file) {
            this.file = file;
            this.replay = Files.exists(file);
            if (replay) {
                for (String line : read(file).split("\n")) {
                    String[] f = line.strip().split(" ");
                    if (f.length == 2) {
                        from.add(new long[] {Long.parseLong(f[0]), hashes.size()});
                        hashes.add(f[1]);
                    }
                }
            }
        }

        String hashAt(long offset, Path current) {
            if (!replay) {
                long now = System.currentTimeMillis();
                if (hashes.isEmpty() || now - checkedAt >= POLL_MS) {
                    checkedAt = now;
                    String latest = read(current);
                    if (hashes.isEmpty() || !latest.equals(hashes.get(hashes.size() - 1))) {
                        from.add(new long[] {offset, hashes.size()});
                        hashes.add(latest);
                        write();
                    }
                }
            }
            // The last switch at or before `offset` (the first version for records before any).
            String hash = hashes.isEmpty() ? read(current) : hashes.get(0);
            for (long[] f : from) {
                if (f[0] <= offset) {
                    hash = hashes.get((int) f[1]);
                }
            }
            return hash;
        }

        private void write() {
            StringBuilder text = new StringBuilder();
            for (long[] f : from) {
                text.append(f[0]).append(' ').append(hashes.get((int) f[1])).append('\n');
            }
            try {
                Files.createDirectories(file.getParent());
                Path tmp = file.resolveSibling("." + file.getFileName() + "." + UUID.randomUUID());
                Files.writeString(tmp, text, StandardCharsets.UTF_8);
                Files.move(tmp, file, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
            } catch (IOException e) {
                throw new UncheckedIOException("cannot record the rule-set versions of " + file, e);
            }
        }
    }

    private static String read(Path p) {
        try {
            return Files.readString(p, StandardCharsets.UTF_8).strip();
        } catch (IOException e) {
            throw new UncheckedIOException("cannot read rule-set version file " + p, e);
        }
    }
}
