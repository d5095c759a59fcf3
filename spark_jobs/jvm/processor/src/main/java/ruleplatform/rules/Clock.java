package ruleplatform.rules;

import java.time.Instant;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.api.java.UDF0;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;

/**
 * The time a live detection is decided (its `processed` member), read from the JVM's
 * clock as each row is rendered.
 *
 * A streaming query turns `current_timestamp()` into the micro-batch's time, written
 * into the generated code as a literal, so the output stage's code would be new at every
 * batch. Spark's `reflect` reads the clock per row but has no generated code of its own:
 * the projection holding it falls out of whole-stage code generation, and each task
 * generated the source of the job's widest projection again to find it in the code
 * cache. A Java UDF is generated code that calls this class, the same from batch to
 * batch and task to task.
 */
public final class Clock {
    private Clock() {}

    /** The function's name in plans and the Spark UI. */
    public static final String NAME = "processed_clock";

    /** ISO-8601 UTC with milliseconds, as `date_format(ts, "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'")` in UTC. */
    private static final DateTimeFormatter ISO =
        DateTimeFormatter.ofPattern("uuuu-MM-dd'T'HH:mm:ss.SSS'Z'").withZone(ZoneOffset.UTC);

    /** The last millisecond rendered: rows of the same millisecond share its text. */
    private static volatile Rendered last = new Rendered(Long.MIN_VALUE, "");

    private static final class Rendered {
        final long ms;
        final String text;

        Rendered(long ms, String text) {
            this.ms = ms;
            this.text = text;
        }
    }

    /** string: the clock's time when the row is rendered (nondeterministic: never folded or reused). */
    public static Column processed() {
        return functions.udf((UDF0<String>) Clock::now, DataTypes.StringType).asNondeterministic().asNonNullable()
            .withName(NAME).apply();
    }

    static String now() {
        return render(System.currentTimeMillis());
    }

    static String render(long ms) {
        Rendered r = last;
        if (r.ms != ms) {
            r = new Rendered(ms, ISO.format(Instant.ofEpochMilli(ms)));
            last = r;
        }
        return r.text;
    }
}
