package ruleplatform.keyed;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayDeque;
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
 * The backtest's correlation rules (spark_jobs/engine/correlation.py) with the live job's
 * own resolution and judgement ({@link Correlation#resolve}, {@link Correlation#judge}),
 * in one pass over every rule's primaries and context sorted by (rule, key, time,
 * context first, arrival): one shuffle and one sort for the whole rule set, not one per
 * rule.
 *
 * A backtest is one batch that holds every record: a primary sees all context of its key
 * in [t - lookback, t] whatever the arrival order, which the live job reaches by holding
 * primaries until the watermark passes them. Walking in time order with the context of a
 * timestamp before its primaries gives each primary exactly that context, so nothing is
 * held. Context older than the current primary's lookback can serve no later primary
 * and leaves the deque: state is bounded by one key's context in one lookback.
 */
public final class BatchCorrelation {
    private BatchCorrelation() {}

    /** What correlation.py renders a detection from: the primary and its judgement. */
    public static final StructType OUTPUT_SCHEMA = new StructType(new StructField[] {
        DataTypes.createStructField("_i", DataTypes.IntegerType, false),
        DataTypes.createStructField("topic", DataTypes.StringType, true),
        DataTypes.createStructField("seq", DataTypes.LongType, true),
        DataTypes.createStructField("raw", DataTypes.StringType, true),
        DataTypes.createStructField("ts_ms", DataTypes.LongType, false),
        DataTypes.createStructField("ctx_num", DataTypes.DoubleType, true),
        DataTypes.createStructField("ctx_json", DataTypes.StringType, true),
        DataTypes.createStructField("metric_value", DataTypes.DoubleType, true),
        DataTypes.createStructField("ctx_record", DataTypes.StringType, true),
    });

    /**
     * The primaries of `rows` that fire under their rule of `specJson` ({"rules": [rule or
     * null, ..]}, each rule_set.rule_spec), with the rule's index in `_i`.
     * `rows`: r (the rule's index), k, ts_ms, seq, is_ctx, topic, raw, ev (the primary's
     * value), cnum, cjson, craw (the context's value as a number and as JSON text, and its
     * record); r, k and ts_ms not null.
     */
    public static Dataset<Row> judged(Dataset<Row> rows, String specJson) {
        Dataset<Row> sorted = rows.repartition(rows.col("r"), rows.col("k")).sortWithinPartitions(
                rows.col("r"), rows.col("k"), rows.col("ts_ms"), rows.col("is_ctx").desc(), rows.col("seq"));
        return sorted.mapPartitions(new Pass(specJson, sorted.schema()), Encoders.row(OUTPUT_SCHEMA));
    }

    private static final ObjectMapper JSON = new ObjectMapper();

    static RuleSpec[] rules(String specJson) {
        try {
            JsonNode rules = JSON.readTree(specJson).get("rules");
            RuleSpec[] out = new RuleSpec[rules.size()];
            for (int i = 0; i < out.length; i++) {
                out[i] = rules.get(i).isNull() ? null : new RuleSpec(rules.get(i)); // not a rule's primary row
            }
            return out;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** One partition's pass; holds column indexes and the spec's text. */
    static final class Pass implements MapPartitionsFunction<Row, Row> {
        private final String specJson;
        private final int rule;
        private final int key;
        private final int ts;
        private final int seq;
        private final int isCtx;
        private final int topic;
        private final int raw;
        private final int ev;
        private final int cnum;
        private final int cjson;
        private final int craw;

        Pass(String specJson, StructType schema) {
            this.specJson = specJson;
            rule = schema.fieldIndex("r");
            key = schema.fieldIndex("k");
            ts = schema.fieldIndex("ts_ms");
            seq = schema.fieldIndex("seq");
            isCtx = schema.fieldIndex("is_ctx");
            topic = schema.fieldIndex("topic");
            raw = schema.fieldIndex("raw");
            ev = schema.fieldIndex("ev");
            cnum = schema.fieldIndex("cnum");
            cjson = schema.fieldIndex("cjson");
            craw = schema.fieldIndex("craw");
        }

        private Double num(Row row, int i) {
            return row.isNullAt(i) ? null : row.getDouble(i);
        }

        private Long seqOf(Row row) {
            return row.isNullAt(seq) ? null : row.getLong(seq);
        }

        @Override
        public Iterator<Row> call(Iterator<Row> in) {
            RuleSpec[] rules = rules(specJson);
            ArrayDeque<Ev> context = new ArrayDeque<>();
            return new Iterator<>() {
                private Row next;
                private int currentRule;
                private Object current;
                private boolean started;

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
                    int r = row.getInt(rule);
                    Object k = row.get(key);
                    if (!started || r != currentRule || !Objects.equals(k, current)) {
                        context.clear();
                        currentRule = r;
                        current = k;
                        started = true;
                    }
                    RuleSpec spec = rules[r];
                    long t = row.getLong(ts);
                    if (row.getBoolean(isCtx)) {
                        context.addLast(new Ev("context", true, t, seqOf(row), null, row.getString(craw),
                                num(row, cnum), row.getString(cjson), null));
                        return null;
                    }
                    while (!context.isEmpty() && context.peekFirst().ts < t - spec.lookbackMs) {
                        context.pollFirst();
                    }
                    Ev primary = new Ev("primary", true, t, seqOf(row), row.getString(topic), row.getString(raw),
                            num(row, ev), null, null);
                    Correlation.Resolved resolved = Correlation.resolve(spec, context, t);
                    Emit e = resolved == null ? null : Correlation.judge(spec, primary, resolved);
                    if (e == null) {
                        return null;
                    }
                    return RowFactory.create(r, primary.topic, primary.seq, primary.raw, t, e.ctxNum, e.ctxJson,
                            e.metricValue, e.ctxRecord);
                }
            };
        }
    }
}
