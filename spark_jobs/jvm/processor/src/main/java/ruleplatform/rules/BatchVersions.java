package ruleplatform.rules;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.UUID;
import org.apache.spark.TaskContext;

/**
 * Which rule-set version judges a micro-batch of a live query, decided once per batch
 * and recorded in the query's checkpoint, so that the plan never changes with the rules
 * and a batch run again after a crash judges its events with the rules it had.
 *
 * The directory (spark_jobs/streaming/rule_versions.py) holds `specs/HASH.json` (one
 * rule-set spec per version, named by its content), `current` (the hash the driver's
 * registry last published) and `batches/ID` (the hash batch ID uses). The first task of
 * a batch to ask records `current` under its id with an exclusive create (a hard link of
 * a complete file); every other task, and every later run of that batch, reads what was
 * recorded. Outside a streaming query (no batch id) the current version judges.
 */
final class BatchVersions {
    private BatchVersions() {}

    /** The micro-batch id Spark's MicroBatchExecution sets on the tasks of a batch. */
    static final String BATCH_ID_KEY = "streaming.sql.batchId";

    private static final int KEEP = 64;
    private static final Map<String, String> HASH_OF_BATCH = new LinkedHashMap<>(KEEP, 0.75f, true) {
        @Override
        protected boolean removeEldestEntry(Map.Entry<String, String> eldest) {
            return size() > KEEP;
        }
    };

    /** The rule set that judges the running task's events. */
    static RuleSet forTask(String dir) {
        Path root = Paths.get(dir);
        TaskContext task = TaskContext.get();
        String batch = task == null ? null : task.getLocalProperty(BATCH_ID_KEY);
        String hash = batch == null ? read(root.resolve("current")) : hashOf(root, batch);
        return RuleSets.compiled(hash, () -> read(root.resolve("specs").resolve(hash + ".json")));
    }

    private static String hashOf(Path root, String batch) {
        String key = root + "\u0000" + batch;
        synchronized (HASH_OF_BATCH) {
            String known = HASH_OF_BATCH.get(key);
            if (known != null) {
                return known;
            }
        }
        String hash = decide(root.resolve("batches"), batch, root.resolve("current"));
        synchronized (HASH_OF_BATCH) {
            HASH_OF_BATCH.put(key, hash);
        }
        return hash;
    }

    private static String decide(Path batches, String batch, Path current) {
        Path recorded = batches.resolve(batch);
        if (Files.exists(recorded)) {
            return read(recorded);
        }
        try {
            Files.createDirectories(batches);
            Path tmp = batches.resolve("." + batch + "." + UUID.randomUUID());
            Files.writeString(tmp, read(current), StandardCharsets.UTF_8);
            try {
                Files.createLink(recorded, tmp);
            } catch (FileAlreadyExistsException lost) {
                // Another task of the batch recorded it first: its choice holds.
            } finally {
                Files.deleteIfExists(tmp);
            }
        } catch (IOException e) {
            throw new UncheckedIOException("cannot record the rule-set version of batch " + batch + " in " + batches, e);
        }
        return read(recorded);
    }

    private static String read(Path p) {
        try {
            return Files.readString(p, StandardCharsets.UTF_8).strip();
        } catch (IOException e) {
            throw new UncheckedIOException("cannot read rule-set version file " + p, e);
        }
    }
}
