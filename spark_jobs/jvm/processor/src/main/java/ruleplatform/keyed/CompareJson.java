package ruleplatform.keyed;

import com.fasterxml.jackson.core.json.JsonReadFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.json.JsonMapper;
import java.util.regex.Pattern;
import ruleplatform.rules.Condition;

/**
 * The rule language's comparison (spark_jobs/engine/conditions.py compare_spec) for a correlation's `last` context value
 * (JSON text) against the rule's condition under metric `direct`. A missing value or JSON
 * null never matches; a number or numeric string compares as a number for every
 * operator (booleans are no numbers); otherwise only == and != apply, comparing a
 * boolean rule value with a JSON boolean and any other with a JSON string.
 */
final class CompareJson {
    private CompareJson() {}

    private static final ObjectMapper JSON = JsonMapper.builder()
            .enable(JsonReadFeature.ALLOW_NON_NUMERIC_NUMBERS) // Python's json reads NaN, Infinity
            .build();
    // values.NUMERIC_RE; Python's \d and \s are Unicode-aware.
    private static final Pattern NUMERIC = Pattern.compile(
            "^\\s*[+-]?(\\d+\\.?\\d*|\\.\\d+)([eE][+-]?\\d+)?\\s*$", Pattern.UNICODE_CHARACTER_CLASS);

    static boolean matches(String jsonValue, RuleSpec rule) {
        if (jsonValue == null) {
            return false;
        }
        JsonNode x;
        try {
            x = JSON.readTree(jsonValue);
        } catch (Exception e) {
            throw new EvaluationError("context value is not valid JSON: " + e.getMessage());
        }
        if (x == null || x.isNull() || x.isMissingNode()) {
            return false;
        }
        String op = rule.condOp;
        if ("num".equals(rule.condKind)) {
            return Condition.compareNumbers(op, pyNumber(x), rule.condNum);
        }
        if (!"==".equals(op) && !"!=".equals(op)) {
            return false;
        }
        boolean same = "bool".equals(rule.condKind)
                ? x.isBoolean() && x.booleanValue() == rule.condBool
                : x.isTextual() && x.textValue().equals(rule.condStr);
        return "==".equals(op) ? same : !same;
    }

    /** conditions._py_number: a JSON number or numeric string as a double, else null. */
    private static Double pyNumber(JsonNode x) {
        if (x.isIntegralNumber()) {
            double d = x.bigIntegerValue().doubleValue();
            if (Double.isInfinite(d)) { // float(int) of Python
                throw new EvaluationError("integer beyond the double range");
            }
            return d;
        }
        if (x.isNumber()) {
            return x.doubleValue();
        }
        if (x.isTextual() && NUMERIC.matcher(x.textValue()).matches()) {
            return parseFloat(x.textValue());
        }
        return null;
    }

    /** Python float(str) of a text NUMERIC accepts: whitespace trimmed, Unicode digits. */
    private static double parseFloat(String s) {
        StringBuilder b = new StringBuilder(s.length());
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (Character.isWhitespace(c) || Character.isSpaceChar(c)) {
                continue;
            }
            b.append(Character.isDigit(c) ? (char) ('0' + Character.digit(c, 10)) : c);
        }
        return Double.parseDouble(b.toString());
    }
}
