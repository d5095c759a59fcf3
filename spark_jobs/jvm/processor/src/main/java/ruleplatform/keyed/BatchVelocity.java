package ruleplatform.keyed;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.Arrays;
import java.util.Iterator;
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
 * The backtest's velocity rules (spark_jobs/engine/velocity.py) in one pass over every
 * rule's entered events, sorted by (rule, key, time, arrival): per key and rule a window
 * that slides forward, the live job's own aggregation ({@link Velocity.Window}: exact
 * sums, monotonic deques for min/max, value counts for distinct_count) and its emit rule.
 * The rows are the live evaluator's (ruleplatform.rules.KeyedRules: one per event and
 * rule it enters, with the rule's time, number and JSON text), so the plan is one
 * shuffle and one sort whatever the number of rules, keys and topics.
 *
 * Spark's window functions need an expression per (rule, frame) and a frame per window
 * size; a ten-rule group was 27 window expressions in three Window operators, each
 * carrying every row's text through: the largest gap of the backtest to a hand-written
 * plan for the same rules (bench_backtest_floor.py, docs/benchmarks.md). Here each
 * entered row is read once and costs O(1) amortized.
 * State is bounded by the rows of one key's largest window (entries leave as the window
 * moves; the columns are compacted, not grown, while half of them are free).
 */
public final class BatchVelocity {
    private BatchVelocity() {}

    /**
     * velocity.py's fired rows: the event's columns, the index of the rule, and its
     * aggregation where it fired, or the reason it could not be evaluated (a dead letter).
     */
    public static final StructType OUTPUT_SCHEMA = new StructType(new StructField[] {
        DataTypes.createStructField("topic", DataTypes.StringType, true),
        DataTypes.createStructField("seq", DataTypes.LongType, true),
        DataTypes.createStructField("raw", DataTypes.StringType, true),
        DataTypes.createStructField("proc_ms", DataTypes.LongType, true),
        DataTypes.createStructField("ts_ms", DataTypes.LongType, false),
        DataTypes.createStructField("_i", DataTypes.IntegerType, false),
        DataTypes.createStructField("agg", DataTypes.DoubleType, true),
        DataTypes.createStructField("reason", DataTypes.StringType, true),
    });

    /**
     * The rows of `entered` (topic, seq, raw, proc_ms, `_i`: the rule's index, k, ts_ms,
     * num, jv: what the rule reads of the event; _i, k and ts_ms not null) at which their
     * rule in `specJson` fires or cannot be evaluated: {"rules": [{"aggregation_type",
     * "window_ms", "threshold", "all_events"} or null, ..]}, by index.
     */
    public static Dataset<Row> fired(Dataset<Row> entered, String specJson) {
        Dataset<Row> sorted = entered.repartition(entered.col("_i"), entered.col("k"))
            .sortWithinPartitions("_i", "k", "ts_ms", "seq");
        return sorted.mapPartitions(new Pass(specJson, sorted.schema()), Encoders.row(OUTPUT_SCHEMA));
    }

    private static final ObjectMapper JSON = new ObjectMapper();

    private static JsonNode rules(String specJson) {
        try {
            return JSON.readTree(specJson).get("rules");
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
        private final int ts;
        private final int rule;
        private final int key;
        private final int num;
        private final int jv;

        Pass(String spec, StructType schema) {
            this.spec = spec;
            topic = schema.fieldIndex("topic");
            seq = schema.fieldIndex("seq");
            raw = schema.fieldIndex("raw");
            proc = schema.fieldIndex("proc_ms");
            ts = schema.fieldIndex("ts_ms");
            rule = schema.fieldIndex("_i");
            key = schema.fieldIndex("k");
            num = schema.fieldIndex("num");
            jv = schema.fieldIndex("jv");
        }

        @Override
        public Iterator<Row> call(Iterator<Row> in) {
            JsonNode rules = rules(spec);
            Slide[] slides = new Slide[rules.size()];
            return new Iterator<>() {
                private Row next;
                private Slide slide;
                private int currentRule = -1;
                private Object currentKey;

                @Override
                public boolean hasNext() {
                    while (next == null && in.hasNext()) {
                        next = take(in.next());
                    }
                    return next != null;
                }

                @Override
                public Row next() {
                    if (!hasNext()) {
                        throw new NoSuchElementException();
                    }
                    Row out = next;
                    next = null;
                    return out;
                }

                private Row take(Row row) {
                    int i = row.getInt(rule);
                    Object k = row.get(key);
                    if (i != currentRule || !Objects.equals(k, currentKey)) {
                        if (slides[i] == null) {
                            slides[i] = new Slide(rules.get(i));
                        }
                        slide = slides[i];
                        slide.reset();
                        currentRule = i;
                        currentKey = k;
                    }
                    long t = row.getLong(ts);
                    double value = slide.num != null && !row.isNullAt(num) ? row.getDouble(num) : Double.NaN;
                    String text = slide.jv != null ? row.getString(jv) : null;
                    try {
                        if (slide.step(t, value, text)) {
                            return RowFactory.create(row.get(topic), row.get(seq), row.get(raw), row.get(proc), t, i,
                                    slide.agg, null);
                        }
                    } catch (EvaluationError e) {
                        // The live job dead-letters what it cannot evaluate (an exact sum
                        // beyond the double range), and keeps the window without it.
                        return RowFactory.create(row.get(topic), row.get(seq), row.get(raw), row.get(proc), t, i,
                                null, EvaluationError.reason(e));
                    }
                    return null;
                }
            };
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
