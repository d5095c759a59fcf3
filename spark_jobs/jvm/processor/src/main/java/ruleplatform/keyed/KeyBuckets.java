package ruleplatform.keyed;

import java.util.ArrayDeque;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.api.java.UDF2;
import org.apache.spark.sql.catalyst.expressions.Murmur3HashFunction;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The bucket of a key row: which of its key group's groups of the keyed operator
 * (KeyedOperator, grouped by (gid, bucket)) the row goes to.
 *
 * A stateful operator's input is hash-partitioned on its grouping key: the group (gid,
 * b) runs in shuffle partition pmod(murmur3(gid, b), P) (Spark's HashPartitioning, seed
 * 42). With the bucket numbers 0..N-1 that is wherever the hashes fall: four buckets of
 * the user key over two partitions split 3:1 as often as 2:2, and the task with three
 * ran each micro-batch's first operator alone for its last third (bench_detect.py's
 * event log: 3,485 rows and 482 ms CPU against 6,131 rows and 229 ms, the other task's
 * rows being the global key's cheap ones). Balanced buckets are numbers chosen by where
 * Spark will place them: the j-th bucket of a key group is the least number not
 * taken whose partition is j mod P, so every partition holds N/P buckets of each key
 * group. The numbers depend only on (gid, N, P), all three fixed for a checkpoint
 * (spark_jobs/streaming/job.py `key_bucketing`), so a key stays in its bucket.
 */
public final class KeyBuckets {
    private KeyBuckets() {}

    /** The function's name in plans and the Spark UI. */
    public static final String NAME = "key_bucket";

    /** Spark's seed for Murmur3Hash, as HashPartitioning uses it. */
    private static final int SEED = 42;

    /** int: the balanced bucket of a row of key group `gid` whose key hashes to `keyHash` (long). */
    public static Column balanced(Column gid, Column keyHash, int buckets, int partitions) {
        if (buckets < 1 || partitions < 1) {
            throw new IllegalArgumentException("buckets and partitions must be >= 1, not " + buckets + ", " + partitions);
        }
        return functions.udf(new Balanced(buckets, partitions), DataTypes.IntegerType).withName(NAME).apply(gid, keyHash);
    }

    /** The function: its tables by key group, built at a group's first row. */
    static final class Balanced implements UDF2<String, Long, Integer> {
        private static final long serialVersionUID = 1L;
        private final int buckets;
        private final int partitions;
        private final ConcurrentHashMap<String, int[]> tables = new ConcurrentHashMap<>();

        Balanced(int buckets, int partitions) {
            this.buckets = buckets;
            this.partitions = partitions;
        }

        @Override
        public Integer call(String gid, Long keyHash) {
            if (gid == null || keyHash == null) {
                return null;
            }
            int[] table = tables.computeIfAbsent(gid, g -> table(g, buckets, partitions));
            return table[(int) Math.floorMod(keyHash, (long) buckets)];
        }
    }

    /** The bucket numbers of `gid`, in bucket order: the j-th placed in partition j mod P. */
    static int[] table(String gid, int buckets, int partitions) {
        @SuppressWarnings("unchecked")
        ArrayDeque<Integer>[] waiting = new ArrayDeque[partitions];
        for (int p = 0; p < partitions; p++) {
            waiting[p] = new ArrayDeque<>();
        }
        int[] out = new int[buckets];
        int next = 0;
        for (int j = 0; j < buckets; j++) {
            int want = j % partitions;
            while (waiting[want].isEmpty()) {
                waiting[partition(gid, next, partitions)].add(next);
                next++;
            }
            out[j] = waiting[want].poll();
        }
        return out;
    }

    /** The shuffle partition Spark places the group (gid, bucket) in: Murmur3Hash(gid, bucket) pmod P. */
    static int partition(String gid, int bucket, int partitions) {
        int h = (int) Murmur3HashFunction.hash(UTF8String.fromString(gid), DataTypes.StringType, SEED);
        h = (int) Murmur3HashFunction.hash(bucket, DataTypes.IntegerType, h);
        return Math.floorMod(h, partitions);
    }
}
