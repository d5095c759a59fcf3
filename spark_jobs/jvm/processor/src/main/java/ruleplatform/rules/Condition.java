package ruleplatform.rules;

import com.fasterxml.jackson.databind.JsonNode;

/**
 * `field operator value` (docs/rule-language.md, "Values, paths and comparisons"): a
 * missing field (or JSON null) never matches; when the rule's value is a number or a
 * numeric string, the event's number (a number or numeric string) is compared for every
 * operator, and `!=` also holds for a value that is there but no number; otherwise only
 * `==` and `!=` apply, comparing a boolean rule value with a JSON boolean and any other
 * rule value, as a string, with a JSON string.
 */
public final class Condition {
    /** The rule value's kind decides the comparison. */
    enum Kind { NUM, STR, BOOL }

    final String[] path;
    /** The path as a reason names it (`$['value']`). */
    final String text;
    final String op;
    final Kind kind;
    final double num;
    final String str;
    final boolean bool;

    private Condition(String[] path, String text, String op, Kind kind, double num, String str, boolean bool) {
        this.path = path;
        this.text = text;
        this.op = op;
        this.kind = kind;
        this.num = num;
        this.str = str;
        this.bool = bool;
    }

    /**
     * From a condition's spec: `{"path": [...], "op": "==", "kind": "num"|"str"|"bool",
     * "num": .., "str": .., "bool": ..}`. The rule model decides what a rule value is
     * (spark_jobs/engine/conditions.py value_spec), so that is decided once, in Python.
     */
    static Condition of(JsonNode spec) {
        String[] path = Value.path(spec.get("path"));
        Kind kind = Kind.valueOf(spec.get("kind").asText().toUpperCase(java.util.Locale.ROOT));
        return new Condition(path, spec.path("text").asText(""), spec.get("op").asText(), kind,
            kind == Kind.NUM ? spec.get("num").asDouble() : 0,
            kind == Kind.STR ? spec.get("str").asText() : null,
            kind == Kind.BOOL && spec.get("bool").asBoolean());
    }

    /** A rule's conditions from their specs (a JSON array of `of`'s specs), in order. */
    static Condition[] all(JsonNode specs) {
        Condition[] out = new Condition[specs.size()];
        for (int k = 0; k < out.length; k++) {
            out[k] = of(specs.get(k));
        }
        return out;
    }

    /**
     * The value is there but is no number, and this condition orders numbers: the event
     * was kept from passing by a value the rule cannot read (counted, not dead-lettered).
     */
    boolean unreadable(Value x) {
        return kind == Kind.NUM && !"==".equals(op) && !"!=".equals(op) && x.present() && x.number() == null;
    }

    /**
     * `a op num` for a rule value that is a number: `a` null (no number) fails every
     * operator but `!=`. Also the keyed operators' comparison of a correlation's context
     * value (keyed.CompareJson), so the two cannot drift apart.
     */
    public static boolean compareNumbers(String op, Double a, double num) {
        if ("!=".equals(op)) {
            return a == null || a != num;
        }
        if (a == null) {
            return false;
        }
        switch (op) {
            case "==": return a == num;
            case ">": return a > num;
            case "<": return a < num;
            case ">=": return a >= num;
            case "<=": return a <= num;
            default: return false;
        }
    }

    boolean test(Value x) {
        if (!x.present()) {
            return false;
        }
        if (kind == Kind.NUM) {
            return compareNumbers(op, x.number(), num);
        }
        boolean same = kind == Kind.BOOL ? (bool ? "true" : "false").equals(x.json()) : str.equals(x.string());
        switch (op) {
            case "==": return same;
            case "!=": return !same;
            default: return false;
        }
    }
}
