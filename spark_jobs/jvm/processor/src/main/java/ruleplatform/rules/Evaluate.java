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
