package ruleplatform.rules;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import java.io.CharArrayWriter;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.time.ZoneOffset;
import java.util.regex.Pattern;
import org.apache.spark.types.variant.Variant;
import org.apache.spark.types.variant.VariantUtil;

/**
 * One event value as a rule reads it (docs/rule-language.md, "Values, paths and
 * comparisons"): there or not, its JSON text, its string and its number.
 *
 * The one definition of these reads for the evaluator; each form is computed when first
 * asked for, because most rules ask one form of most paths (a key its text, an amount its
 * number, `type == "click"` its string).
 */
public final class Value {
    /** A numeric string, exactly (no "1_000", "1d", "NaN", "inf"); ASCII digits and spaces. */
    static final Pattern NUMERIC = Pattern.compile("^\\s*[+-]?(\\d+\\.?\\d*|\\.\\d+)([eE][+-]?\\d+)?\\s*$");

    static final Value MISSING = new Value(null);

    private final Variant x;
    private String json;
    private boolean numRead;
    private Double num;

    private Value(Variant x) {
        this.x = x;
    }

    private static final java.util.concurrent.ConcurrentHashMap<java.util.List<String>, String[]> PATHS =
        new java.util.concurrent.ConcurrentHashMap<>();

    /**
     * A path from its spec (`["user", "id"]`; null for none), one array per distinct path
     * in the JVM: an event's values are cached by the array's identity
     * (RuleSet.Event), so every rule reading a path finds the value read once.
     */
    static String[] path(com.fasterxml.jackson.databind.JsonNode segs) {
        if (segs == null || segs.isNull()) {
            return null;
        }
        String[] out = new String[segs.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = segs.get(i).asText();
        }
        return PATHS.computeIfAbsent(java.util.List.of(out), k -> out);
    }

    /** The value at `path` (object keys) under `root`; JSON null and a missing key are missing. */
    static Value at(Variant root, String[] path) {
        Variant x = root;
        for (String key : path) {
            if (x == null || x.getType() != VariantUtil.Type.OBJECT) {
                return MISSING;
            }
            x = x.getFieldByKey(key);
        }
        return x == null || x.getType() == VariantUtil.Type.NULL ? MISSING : new Value(x);
    }

    boolean present() {
        return x != null;
    }

    boolean isString() {
        return x != null && x.getType() == VariantUtil.Type.STRING;
    }

    boolean isNumber() {
        if (x == null) {
            return false;
        }
        VariantUtil.Type t = x.getType();
        return t == VariantUtil.Type.LONG || t == VariantUtil.Type.DOUBLE || t == VariantUtil.Type.FLOAT
            || t == VariantUtil.Type.DECIMAL;
    }

    /** The JSON text (`1`, `"1"`, `true`), as Spark's to_json writes it; null when missing. */
    String json() {
        if (json == null && x != null) {
            VariantUtil.Type t = x.getType();
            json = t == VariantUtil.Type.STRING ? quote(x.getString())
                : t == VariantUtil.Type.LONG ? Long.toString(x.getLong())
                : x.toJson(ZoneOffset.UTC);
        }
        return json;
    }

    // Spark's Variant.toJson makes a new JsonFactory for every string it writes (its
    // escapeJson), and making the factory's symbol tables costs more than the writing;
    // keys and distinct_count values are mostly strings, read for every event a keyed
    // rule enters. The same Jackson call on one shared factory writes the same text, and
    // a long's text is its decimal digits as there (ValueJsonTest holds both equal to
    // Variant.toJson).
    private static final JsonFactory JSON = new JsonFactory();

    /** A string as a JSON string literal, escaped as Variant.toJson escapes it. */
    static String quote(String s) {
        try (CharArrayWriter w = new CharArrayWriter(s.length() + 2); JsonGenerator g = JSON.createGenerator(w)) {
            g.writeString(s);
            g.flush();
            return w.toString();
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** The string, for a JSON string; else null. */
    String string() {
        return isString() ? x.getString() : null;
    }

    /**
     * A JSON number, or a numeric string, as a finite double; null for anything else
     * (booleans too, and numbers beyond the double range, which no rule can use).
     */
    Double number() {
        if (!numRead) {
            numRead = true;
            Double d = null;
            if (isNumber()) {
                d = x.getType() == VariantUtil.Type.FLOAT ? Double.valueOf(x.getFloat()) : parseDouble(json());
            } else if (isString()) {
                String s = x.getString();
                if (NUMERIC.matcher(s).find()) {
                    d = parseDouble(s);
                }
            }
            num = d != null && Math.abs(d) <= Double.MAX_VALUE ? d : null;
        }
        return num;
    }

    /** engine/values.py EPOCH_MS_CUTOFF: epoch numbers above it are milliseconds, else seconds. */
    static final double EPOCH_MS_CUTOFF = 1e11;
    /** engine/values.py MIN_EVENT_MS and MAX_EVENT_MS: years 0001 to 9999. */
    static final long MIN_EVENT_MS = -62_135_596_800_000L;
    static final long MAX_EVENT_MS = 253_402_300_799_999L;

    /**
     * The value as an event time in epoch ms (docs/rule-language.md, "Timestamps"); null
     * when it is none or out of range. Numbers (and numeric strings) are epoch ms above
     * 1e11, else epoch seconds; other strings are ISO-8601 read by Spark's own string to
     * timestamp cast, UTC when they carry no offset. Each step as engine/values.py
     * `timestamp_of` takes it (the range tested on the double; micros to ms through a
     * double), so both give the same time.
     */
    Long timeMs() {
        Double d = number();
        if (d != null) {
            double ms = d > EPOCH_MS_CUTOFF ? d : d * 1000.0;
            return ms >= MIN_EVENT_MS && ms <= MAX_EVENT_MS ? (long) Math.floor(ms) : null;
        }
        String s = string();
        if (s == null) {
            return null;
        }
        scala.Option<Object> micros = org.apache.spark.sql.catalyst.util.DateTimeUtils.stringToTimestamp(
            org.apache.spark.unsafe.types.UTF8String.fromString(s), ZoneOffset.UTC);
        if (micros.isEmpty()) {
            return null;
        }
        long ms = (long) Math.floor((double) (Long) micros.get() / 1000.0);
        return ms >= MIN_EVENT_MS && ms <= MAX_EVENT_MS ? ms : null;
    }

    /** A string to double as Spark's cast does it (Java's parse); null when it is none. */
    private static Double parseDouble(String s) {
        try {
            return Double.parseDouble(s.trim());
        } catch (NumberFormatException e) {
            return null;
        }
    }
}
