package ruleplatform.rules;

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
            json = x.toJson(ZoneOffset.UTC);
        }
        return json;
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

    /** A string to double as Spark's cast does it (Java's parse); null when it is none. */
    private static Double parseDouble(String s) {
        try {
            return Double.parseDouble(s.trim());
        } catch (NumberFormatException e) {
            return null;
        }
    }
}
