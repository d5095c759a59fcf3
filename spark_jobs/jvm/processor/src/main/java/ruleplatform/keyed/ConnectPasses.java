package ruleplatform.keyed;

import java.io.IOException;
import java.util.Optional;
import org.apache.spark.connect.proto.Expression;
import org.apache.spark.connect.proto.Project;
import org.apache.spark.connect.proto.Relation;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.connect.planner.SparkConnectPlanner;
import org.apache.spark.sql.connect.plugin.RelationPlugin;
import org.sparkproject.connect.protobuf.Any;
import org.sparkproject.connect.protobuf.CodedInputStream;

/**
 * The backtest's JVM passes ({@link BatchVelocity#fired}, {@link BatchCorrelation#judged},
 * the rule-set evaluator's threshold and keyed passes)
 * for Spark Connect clients, which have no Py4J gateway to call them: a Spark Connect
 * relation plugin (`spark.connect.extensions.relation.classes`, set by `rulectl
 * connect`). So a backtest on a Connect server runs the same code as one on a classic
 * session and as the live job, not a second implementation in window functions.
 *
 * The client (spark_jobs/engine/jvm_pass.py) sends an extension relation holding a
 * `Project` over the pass's input whose two expressions are string literals: the pass's
 * name and its spec (JSON). Any other extension is not ours: Optional.empty().
 */
public final class ConnectPasses implements RelationPlugin {
    static final String VELOCITY = "ruleplatform.keyed.BatchVelocity.fired";
    static final String CORRELATION = "ruleplatform.keyed.BatchCorrelation.judged";
    static final String THRESHOLDS = "ruleplatform.rules.Evaluate.thresholdPass";
    static final String KEYED = "ruleplatform.rules.Evaluate.keyedPass";
    private static final int RECURSION_LIMIT = 10_000;

    @Override
    public Optional<LogicalPlan> transform(byte[] relation, SparkConnectPlanner planner) {
        Project project;
        try {
            Any any = Any.parseFrom(relation);
            if (!any.getTypeUrl().endsWith("/spark.connect.Relation")) {
                return Optional.empty();
            }
            // A rule set's plan nests deeper than protobuf's default limit of 100 levels
            // (the server reads its own plans with a higher one, too).
            CodedInputStream in = any.getValue().newCodedInput();
            in.setRecursionLimit(RECURSION_LIMIT);
            Relation rel = Relation.parseFrom(in);
            if (!rel.hasProject()) {
                return Optional.empty();
            }
            project = rel.getProject();
        } catch (IOException e) { // InvalidProtocolBufferException included
            throw new IllegalArgumentException("an extension relation that is no readable spark.connect.Relation", e);
        }
        if (project.getExpressionsCount() != 2) {
            return Optional.empty();
        }
        String pass = literal(project.getExpressions(0));
        String spec = literal(project.getExpressions(1));
        if (pass == null || spec == null
                || !(VELOCITY.equals(pass) || CORRELATION.equals(pass) || THRESHOLDS.equals(pass)
                    || KEYED.equals(pass))) {
            return Optional.empty();
        }
        Dataset<Row> in = org.apache.spark.sql.classic.Dataset.ofRows(planner.session(),
                planner.transformRelation(project.getInput()));
        Dataset<Row> out = VELOCITY.equals(pass) ? BatchVelocity.fired(in, spec)
                : CORRELATION.equals(pass) ? BatchCorrelation.judged(in, spec)
                : KEYED.equals(pass) ? ruleplatform.rules.Evaluate.keyedPass(in, spec)
                : ruleplatform.rules.Evaluate.thresholdPass(in, spec);
        return Optional.of(((org.apache.spark.sql.classic.Dataset<Row>) out).logicalPlan());
    }

    private static String literal(Expression e) {
        return e.hasLiteral() && e.getLiteral().hasString() ? e.getLiteral().getString() : null;
    }
}
