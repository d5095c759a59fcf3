package ruleplatform.keyed;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayDeque;
import java.util.Arrays;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.Objects;
import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * The backtest's velocity rules (spark_jobs/engine/velocity.py), every group of them in
 * one pass over the entered events sorted by (group, key, time, arrival): per key and rule
 * a window that slides forward, the live job's own aggregation ({@link Velocity.Window}:
 * exact sums, monotonic deques for min/max, value counts for distinct_count) and its emit
 * rule.
 *
 * A group is the rules that read one topic with one key and one clock. One pass for all
 * of them keeps the plan one shuffle and one sort whatever the number of groups: a pass
 * per group was a stage per group, and a rule set over many topics spent its time
 * scheduling and deserializing those stages, not reading events
 * (bench_backtest_topics.py, docs/benchmarks.md).
 *
 * Spark's window functions need an expression per (rule, frame) and a frame per window
 * size; a ten-rule group was 27 window expressions in three Window operators, each
 * carrying every row's text through: the largest gap of the backtest to a hand-written
 * plan for the same rules (bench_backtest_floor.py, docs/benchmarks.md). Here each event
 * is read once, and each rule it enters costs O(1) amortized.
 * State is bounded by the rows of one key's largest window (entries leave as the window
 * moves; the columns are compacted, not grown, while half of them are free).
 */
public final class BatchVelocity {
    private BatchVelocity() {}

    /**
     * velocity.py `_fired`'s columns: the event's, the index of the rule, and its
     * aggregation where it fired, or the reason it could not be evaluated (a dead letter;
     * ts_ms is NULL where the reason is that the event has no usable time).
     */
    public static final StructType OUTPUT_SCHEMA = new StructType(new StructField[] {
        DataTypes.createStructField("topic", DataTypes.StringType, true),
        DataTypes.createStructField("seq", DataTypes.LongType, true),
        DataTypes.createStructField("raw", DataTypes.StringType, true),
        DataTypes.createStructField("proc_ms", DataTypes.LongType, true),
        DataTypes.createStructField("ts_ms", DataTypes.LongType, true),
        DataTypes.createStructField("_i", DataTypes.IntegerType, false),
        DataTypes.createStructField("agg", DataTypes.DoubleType, true),
        DataTypes.createStructField("reason", DataTypes.StringType, true),
    });

    /**
     * The rows of `entered` (velocity.py `_entered`: topic, seq, raw, proc_ms, and per
     * group it enters: g, k, ts_ms (NULL without a usable time), q (array: which of the
     * group's entry tests it passes), xn and xj (arrays: the numbers and JSON texts its
     * rules aggregate)) at which a rule of `specJson` fires or cannot be evaluated:
     * {"groups": [{"untimed": reason, "rules": [{"q", "x", "aggregation_type",
     * "window_ms", "threshold", "all_events"}]}]}, `q` and `x` indexes into the arrays, a
     * rule's index in the groups' rules taken in order its `_i`.
     */
    public static Dataset<Row> fired(Dataset<Row> entered, String specJson) {
        Dataset<Row> sorted = entered.repartition(entered.col("g"), entered.col("k"))
                .sortWithinPartitions("g", "k", "ts_ms", "seq");
        return sorted.mapPartitions(new Pass(specJson, sorted.schema()), Encoders.row(OUTPUT_SCHEMA));
    }

    private static final ObjectMapper JSON = new ObjectMapper();

    private static JsonNode groups(String specJson) {
        try {
            return JSON.readTree(specJson).get("groups");
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** One partition's pass; holds column indexes and the spec, not the parsed rules. */
    static final class Pass implements MapPartitionsFunction<Row, Row> {
        private final String spec;
        private final int topic;
        private final int seq;
        private final int raw;
        private final int proc;
        private final int group;
        private final int ts;
        private final int key;
        private final int q;
        private final int xn;
        private final int xj;

        Pass(String spec, StructType schema) {
            this.spec = spec;
            topic = schema.fieldIndex("topic");
            seq = schema.fieldIndex("seq");
            raw = schema.fieldIndex("raw");
            proc = schema.fieldIndex("proc_ms");
            group = schema.fieldIndex("g");
            ts = schema.fieldIndex("ts_ms");
            key = schema.fieldIndex("k");
            q = schema.fieldIndex("q");
            xn = schema.fieldIndex("xn");
            xj = schema.fieldIndex("xj");
        }

        @Override
        public Iterator<Row> call(Iterator<Row> in) {
            JsonNode spec = groups(this.spec);
            Group[] groups = new Group[spec.size()];
            int first = 0;
            for (int g = 0; g < groups.length; g++) {
                groups[g] = new Group(spec.get(g), first);
                first += groups[g].slides.length;
            }
            return new Iterator<>() {
                private final ArrayDeque<Row> out = new ArrayDeque<>();
                private int currentGroup = -1;
                private Object currentKey;

                @Override
                public boolean hasNext() {
                    while (out.isEmpty() && in.hasNext()) {
                        take(in.next());
                    }
                    return !out.isEmpty();
                }

                @Override
                public Row next() {
                    if (!hasNext()) {
                        throw new NoSuchElementException();
                    }
                    return out.poll();
                }

                private void take(Row row) {
                    int g = row.getInt(group);
                    Object k = row.get(key);
                    Group grp = groups[g];
                    if (g != currentGroup || !Objects.equals(k, currentKey)) {
                        for (Slide s : grp.slides) {
                            s.reset();
                        }
                        currentGroup = g;
                        currentKey = k;
                    }
                    List<Boolean> entries = row.getList(q);
                    if (row.isNullAt(ts)) {
                        // Relevant to the rule, but it cannot be placed in time: a dead
                        // letter, and no window changes.
                        for (int i = 0; i < grp.slides.length; i++) {
                            if (Boolean.TRUE.equals(entries.get(grp.q[i]))) {
                                out.add(RowFactory.create(row.get(topic), row.get(seq), row.get(raw), row.get(proc),
                                        null, grp.first + i, null, grp.untimed));
                            }
                        }
                        return;
                    }
                    long t = row.getLong(ts);
                    List<Double> nums = row.getList(xn);
                    List<String> texts = row.getList(xj);
                    for (int i = 0; i < grp.slides.length; i++) {
                        if (!Boolean.TRUE.equals(entries.get(grp.q[i]))) {
                            continue;
                        }
                        Slide s = grp.slides[i];
                        Double value = s.num != null ? nums.get(grp.x[i]) : null;
                        double num = value != null ? value : Double.NaN;
                        String jv = s.jv != null ? texts.get(grp.x[i]) : null;
                        try {
                            if (s.step(t, num, jv)) {
                                out.add(RowFactory.create(row.get(topic), row.get(seq), row.get(raw), row.get(proc), t,
                                        grp.first + i, s.agg, null));
                            }
                        } catch (EvaluationError e) {
                            // The live job dead-letters what it cannot evaluate (an exact sum
                            // beyond the double range), and keeps the window without it.
                            out.add(RowFactory.create(row.get(topic), row.get(seq), row.get(raw), row.get(proc), t,
                                    grp.first + i, null, EvaluationError.reason(e)));
                        }
                    }
                }
            };
        }
    }

    /** One group's rules: where each reads its entry test and value, and its window. */
    static final class Group {
        final int first;
        final String untimed;
        final int[] q;
        final int[] x;
        final Slide[] slides;

        Group(JsonNode spec, int first) {
            this.first = first;
            untimed = spec.get("untimed").asText();
            JsonNode rules = spec.get("rules");
            q = new int[rules.size()];
            x = new int[rules.size()];
            slides = new Slide[rules.size()];
            for (int i = 0; i < slides.length; i++) {
                q[i] = rules.get(i).get("q").asInt();
                x[i] = rules.get(i).get("x").asInt();
                slides[i] = new Slide(rules.get(i));
            }
        }
    }

    /**
     * One rule's window over one key's events (Velocity.step's loop, an event at a time):
     * entries [lo, hi) of the columns are in the window.
     */
    static final class Slide {
        private static final int INITIAL = 64;
        final String kind;
        final long size;
        final double threshold;
        final boolean allEvents;
        long[] ts = new long[INITIAL];
        double[] num;
        String[] jv;
        int lo;
        int hi;
        Velocity.Window window;
        Velocity.Crossing crossing;
        double agg;

        Slide(JsonNode rule) {
            kind = rule.get("aggregation_type").asText();
            size = rule.get("window_ms").asLong();
            threshold = rule.get("threshold").asDouble();
            allEvents = rule.get("all_events").asBoolean();
            boolean texts = "distinct_count".equals(kind);
            num = !texts && !"count".equals(kind) ? new double[INITIAL] : null;
            jv = texts ? new String[INITIAL] : null;
            reset();
        }

        /** A new key: an empty window and no previous evaluation. */
        void reset() {
            if (jv != null) {
                Arrays.fill(jv, 0, hi, null);
            }
            lo = 0;
            hi = 0;
            window = new Velocity.Window(kind, num, jv);
            crossing = new Velocity.Crossing(null, false, 0L);
        }

        /**
         * The event at time t (after every earlier one of the key) enters; true when the
         * rule fires there ({@link Velocity.Crossing}), with the window's aggregation in
         * `agg`.
         * Throws EvaluationError where the live job's evaluation raises (an exact sum beyond the
         * double range), the event then not taken.
         */
        boolean step(long t, double value, String text) {
            if (hi == ts.length) {
                makeRoom();
            }
            ts[hi] = t;
            if (num != null) {
                num[hi] = value;
            }
            if (jv != null) {
                jv[hi] = text;
            }
            window.enter(hi++);
            while (lo < hi && ts[lo] <= t - size) {
                window.leave(lo++);
            }
            try {
                agg = window.value(hi - lo);
            } catch (EvaluationError e) {
                // Not taken: the window as it was (the entries that left stay gone, as
                // they would for any later event).
                hi--;
                if (jv != null) {
                    jv[hi] = null;
                }
                rebuild();
                throw e;
            }
            return crossing.fires(t, size, agg >= threshold, allEvents);
        }

        /**
         * The entries in the window moved to the columns' start (grown when they fill more
         * than half), and the window's aggregate rebuilt over them: it holds indexes into
         * the columns. Each entry is moved at most once per half a column of new entries.
         * Called with the columns full (hi == length), so each copy takes exactly the
         * window's entries and pads the rest.
         */
        private void makeRoom() {
            int live = hi - lo;
            int capacity = live * 2 > ts.length ? ts.length * 2 : ts.length;
            ts = Arrays.copyOfRange(ts, lo, lo + capacity);
            if (num != null) {
                num = Arrays.copyOfRange(num, lo, lo + capacity);
            }
            if (jv != null) {
                jv = Arrays.copyOfRange(jv, lo, lo + capacity);
            }
            lo = 0;
            hi = live;
            rebuild();
        }

        private void rebuild() {
            window = new Velocity.Window(kind, num, jv);
            for (int i = lo; i < hi; i++) {
                window.enter(i);
            }
        }
    }
}
