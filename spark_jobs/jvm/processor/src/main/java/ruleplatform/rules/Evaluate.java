package ruleplatform.rules;

import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF2;
import org.apache.spark.sql.expressions.UserDefinedFunction;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.unsafe.types.VariantVal;

/**
 * The rule set as a column function of the plan: the plan stays the same whatever the
 * rules (one call per event), and the rule set is compiled once per executor JVM and
 * version, not once per micro-batch or task.
 */
public final class Evaluate {
    private Evaluate() {}

    /** The function's name in plans and the Spark UI. */
    public static final String NAME = "rule_set_thresholds";

    /** The threshold rules' verdict on one event: struct<m: array<int>, u: array<string>>. */
    static final DataType JUDGED = DataTypes.createStructType(new org.apache.spark.sql.types.StructField[] {
        DataTypes.createStructField("m", DataTypes.createArrayType(DataTypes.IntegerType, false), false),
        DataTypes.createStructField("u", DataTypes.createArrayType(DataTypes.StringType, false), false),
    });

    /**
     * struct(`m`: the indexes of the spec's threshold rules the event (`topic`, `v`)
     * passes, `u`: RuleSet.Judged's unreadable entries): one call judges every rule.
     */
    public static Column thresholds(Column topic, Column v, String specJson) {
        UserDefinedFunction udf = functions.udf(new Thresholds(specJson), JUDGED).asNonNullable().withName(NAME);
        return udf.apply(topic, v);
    }

    /** array<int>: the `m` of `thresholds`. */
    public static Column thresholdMatches(Column topic, Column v, String specJson) {
        return thresholds(topic, v, specJson).getField("m");
    }

    /**
     * The threshold pass of a backtest: `in` (columns `topic` and `v`) with `_tm`, the
     * threshold matches of each row. A Dataset pass, so a Spark Connect client reaches
     * it too (keyed.ConnectPasses), with the same code as a classic session.
     */
    public static Dataset<Row> thresholdPass(Dataset<Row> in, String specJson) {
        return in.withColumn("_tm", thresholdMatches(in.col("topic"), in.col("v"), specJson));
    }

    /** A live match: the rule's id, version and name, read from the batch's rule set. */
    static final DataType MATCHED = DataTypes.createStructType(new org.apache.spark.sql.types.StructField[] {
        DataTypes.createStructField("rule_id", DataTypes.StringType, false),
        DataTypes.createStructField("rule_version", DataTypes.StringType, true),
        DataTypes.createStructField("rule_name", DataTypes.StringType, true),
    });

    static final DataType LIVE_JUDGED = DataTypes.createStructType(new org.apache.spark.sql.types.StructField[] {
        DataTypes.createStructField("m", DataTypes.createArrayType(MATCHED, false), false),
        DataTypes.createStructField("u", DataTypes.createArrayType(DataTypes.StringType, false), false),
    });

    /**
     * The live query's threshold verdict: struct(`m`: the rules the event passes, each
     * by its id, version and name, `u`: as in `thresholds`), judged by the rule-set
     * version of the running micro-batch (BatchVersions, in `versionsDir`). The plan
     * holds the directory, not the rules: a rule change is a new spec there, not a new
     * plan.
     */
    public static Column liveThresholds(Column topic, Column v, String versionsDir) {
        UserDefinedFunction udf = functions.udf(new LiveThresholds(versionsDir), LIVE_JUDGED).asNonNullable()
            .withName(NAME);
        return udf.apply(topic, v);
    }

    static final class LiveThresholds implements UDF2<String, VariantVal, Row> {
        private final String dir;
        private transient RuleSet rules;

        LiveThresholds(String dir) {
            this.dir = dir;
        }

        @Override
        public Row call(String topic, VariantVal v) {
            if (rules == null) {
                // Once per task: each task deserializes its own copy of this function.
                rules = BatchVersions.forTask(dir);
            }
            RuleSet.Judged j = rules.thresholds(topic, v);
            Row[] matched = new Row[j.matches.length];
            for (int i = 0; i < matched.length; i++) {
                String[] id = rules.identity(j.matches[i]);
                matched[i] = RowFactory.create(id[0], id[1], id[2]);
            }
            return RowFactory.create(matched, j.unreadable);
        }
    }

    /** One entered keyed rule row: its index in the version and what it reads of the event. */
    static final DataType MEMBER = DataTypes.createStructType(new org.apache.spark.sql.types.StructField[] {
        DataTypes.createStructField("i", DataTypes.IntegerType, false),
        DataTypes.createStructField("ts", DataTypes.LongType, true),
        DataTypes.createStructField("issue", DataTypes.StringType, true),
        DataTypes.createStructField("num", DataTypes.DoubleType, true),
        DataTypes.createStructField("jv", DataTypes.StringType, true),
        DataTypes.createStructField("w", DataTypes.BooleanType, false),
    });

    static final DataType GROUP = DataTypes.createStructType(new org.apache.spark.sql.types.StructField[] {
        DataTypes.createStructField("gid", DataTypes.StringType, false),
        // Nullable, as the plan's own groups of carried rows (keyed_input.py) have none.
        DataTypes.createStructField("k", DataTypes.StringType, true),
        DataTypes.createStructField("wm", DataTypes.LongType, true),
        DataTypes.createStructField("mem", DataTypes.createArrayType(MEMBER, false), true),
    });

    static final DataType KEYED = DataTypes.createStructType(new org.apache.spark.sql.types.StructField[] {
        DataTypes.createStructField("g", DataTypes.createArrayType(GROUP, true), false),
        DataTypes.createStructField("u", DataTypes.createArrayType(DataTypes.StringType, false), false),
        DataTypes.createStructField("ctx", DataTypes.BooleanType, false),
    });

    /** The keyed function's name in plans and the Spark UI. */
    public static final String KEYED_NAME = "rule_set_keyed";

    /**
     * The live query's keyed rows of one event: struct(`g`: per key group it enters, its
     * id, key, newest usable event time and entered rule rows (KeyedRules.Member), `u`:
     * unreadable entries, `ctx`: context for the second operator), by the keyed rules of
     * `stage` in the rule-set version of the running micro-batch (as `liveThresholds`).
     */
    public static Column liveKeyed(Column topic, Column routeFrom, Column v, Column procMs, String versionsDir,
                                   String stage, long maxAheadMs) {
        UserDefinedFunction udf = functions.udf(new LiveKeyed(versionsDir, stage, maxAheadMs), KEYED).asNonNullable()
            .withName(KEYED_NAME);
        return udf.apply(topic, routeFrom, v, procMs);
    }

    static final class LiveKeyed implements org.apache.spark.sql.api.java.UDF4<String, String, VariantVal, Long, Row> {
        private final String dir;
        private final String stage;
        private final long maxAheadMs;
        private transient RuleSet rules;

        LiveKeyed(String dir, String stage, long maxAheadMs) {
            this.dir = dir;
            this.stage = stage;
            this.maxAheadMs = maxAheadMs;
        }

        @Override
        public Row call(String topic, String routeFrom, VariantVal v, Long procMs) {
            if (rules == null) {
                rules = BatchVersions.forTask(dir);
            }
            return keyedRow(rules.keyed().judge(stage, topic, routeFrom, v, procMs, maxAheadMs));
        }
    }

    static Row keyedRow(KeyedRules.Judged j) {
        Row[] groups = new Row[j.groups.size()];
        for (int i = 0; i < groups.length; i++) {
            KeyedRules.Group g = j.groups.get(i);
            Row[] members = new Row[g.members.size()];
            for (int k = 0; k < members.length; k++) {
                KeyedRules.Member m = g.members.get(k);
                members[k] = RowFactory.create(m.index, m.ts, m.issue, m.num, m.json, m.warm);
            }
            groups[i] = RowFactory.create(g.gid, g.key, g.wm, members);
        }
        return RowFactory.create(groups, j.unreadable.toArray(new String[0]), j.context);
    }

    /**
     * The keyed pass of a backtest: `in` (columns `topic`, `v`, `proc_ms`, and where
     * routed events are judged `in_topic` and `route_from`) with `_k1` and `_k2`, the
     * keyed rows (as `liveKeyed`'s) of the spec's first and second operator's rules, by
     * the live job's evaluator. No event time is too far ahead: the backtest holds every
     * recorded event (the live job's limit guards its watermark).
     */
    public static Dataset<Row> keyedPass(Dataset<Row> in, String specJson) {
        java.util.List<String> cols = java.util.Arrays.asList(in.columns());
        Column topic = cols.contains("in_topic") ? in.col("in_topic") : in.col("topic");
        Column route = cols.contains("route_from") ? in.col("route_from") : functions.lit(null).cast("string");
        Column[] args = {topic, route, in.col("v"), in.col("proc_ms")};
        return in.withColumn("_k1", keyed(specJson, KeyedRules.FIRST).apply(args))
            .withColumn("_k2", keyed(specJson, KeyedRules.SECOND).apply(args));
    }

    private static UserDefinedFunction keyed(String spec, String stage) {
        return functions.udf(new Keyed(spec, stage), KEYED).asNonNullable().withName(KEYED_NAME);
    }

    static final class Keyed implements org.apache.spark.sql.api.java.UDF4<String, String, VariantVal, Long, Row> {
        private final String spec;
        private final String stage;
        private transient KeyedRules rules;

        Keyed(String spec, String stage) {
            this.spec = spec;
            this.stage = stage;
        }

        @Override
        public Row call(String topic, String routeFrom, VariantVal v, Long procMs) {
            if (rules == null) {
                rules = RuleSets.compiled(spec).keyed();
            }
            return keyedRow(rules.judge(stage, topic, routeFrom, v, procMs, -1));
        }
    }

    static final class Thresholds implements UDF2<String, VariantVal, Row> {
        private final String spec;
        private transient RuleSet rules;

        Thresholds(String spec) {
            this.spec = spec;
        }

        @Override
        public Row call(String topic, VariantVal v) {
            if (rules == null) {
                rules = RuleSets.compiled(spec);
            }
            RuleSet.Judged j = rules.thresholds(topic, v);
            return RowFactory.create(j.matches, j.unreadable);
        }
    }
}
