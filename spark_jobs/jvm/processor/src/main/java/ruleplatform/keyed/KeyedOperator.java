package ruleplatform.keyed;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * The entry point the job calls through py4j (jvm_operator.py): the keyed operator of
 * the live plan, {@code groupBy("gid","bucket").transformWithState(DetectionProcessor)}.
 */
public final class KeyedOperator {
    private KeyedOperator() {}

    /** keyed_rows.py OUTPUT_SCHEMA, field for field. */
    public static final StructType OUTPUT_SCHEMA = new StructType(new StructField[] {
        field("kind", DataTypes.StringType),
        field("rule_id", DataTypes.StringType),
        field("rule_version", DataTypes.StringType),
        field("rule_type", DataTypes.StringType),
        field("rule_name", DataTypes.StringType),
        field("topic", DataTypes.StringType),
        field("seq", DataTypes.LongType),
        field("ts_ms", DataTypes.LongType),
        field("raw", DataTypes.StringType),
        field("agg_type", DataTypes.StringType),
        field("agg_value", DataTypes.DoubleType),
        field("metric", DataTypes.StringType),
        field("emit_context", DataTypes.BooleanType),
        field("ctx_num", DataTypes.DoubleType),
        field("ctx_json", DataTypes.StringType),
        field("metric_value", DataTypes.DoubleType),
        field("ctx_record", DataTypes.StringType),
        field("reason", DataTypes.StringType),
    });

    /** keyed_rows.py CHAINED_SCHEMA: OUTPUT_SCHEMA and the event time Spark chains on. */
    public static final StructType CHAINED_SCHEMA = OUTPUT_SCHEMA.add(field("et", DataTypes.TimestampType));

    private static StructField field(String name, org.apache.spark.sql.types.DataType type) {
        return DataTypes.createStructField(name, type, true);
    }

    /**
     * The operator over `in` (keyed_input.py's key rows plus `bucket`, with the job's
     * watermark): grouped by (gid, bucket), evaluated by {@link DetectionProcessor} with
     * the rules of each micro-batch's rule-set version in `versionsDir`
     * (rule_versions.py), in event-time mode and Append output.
     */
    public static Dataset<Row> apply(Dataset<Row> in, String versionsDir) {
        return grouped(in).transformWithState(new DetectionProcessor(versionsDir, in.schema().fieldNames()),
                TimeMode.EventTime(), OutputMode.Append(), Encoders.row(OUTPUT_SCHEMA));
    }

    /**
     * The first operator of the live plan's chain: as {@link #apply}, its output
     * CHAINED_SCHEMA with `et` as the event-time column, so a second stateful operator
     * can follow it; its PASS_GID groups (the events' threshold matches, dead letters and
     * context records, OUTPUT_SCHEMA's columns among `in`'s) are handed on, stamped.
     */
    public static Dataset<Row> first(Dataset<Row> in, String versionsDir) {
        boolean java8 = Boolean.parseBoolean(in.sparkSession().conf().get("spark.sql.datetime.java8API.enabled", "false"));
        return grouped(in).transformWithState(
                new DetectionProcessor(versionsDir, in.schema().fieldNames(), true, true, java8), "et",
                OutputMode.Append(), Encoders.row(CHAINED_SCHEMA));
    }

    /**
     * The second operator of the chain: the batch's rules on the key rows of `in`,
     * whose PASS_GID groups (the first operator's other output, OUTPUT_SCHEMA's columns
     * among `in`'s) are handed on as they came.
     */
    public static Dataset<Row> second(Dataset<Row> in, String versionsDir) {
        return grouped(in).transformWithState(
                new DetectionProcessor(versionsDir, in.schema().fieldNames(), false, true, false),
                TimeMode.EventTime(), OutputMode.Append(), Encoders.row(OUTPUT_SCHEMA));
    }

    private static org.apache.spark.sql.KeyValueGroupedDataset<Row, Row> grouped(Dataset<Row> in) {
        StructType schema = in.schema();
        StructType keySchema = new StructType(new StructField[] {
            schema.apply("gid"), schema.apply("bucket"),
        });
        return in.groupBy("gid", "bucket").as(Encoders.row(keySchema), Encoders.row(schema));
    }
}
