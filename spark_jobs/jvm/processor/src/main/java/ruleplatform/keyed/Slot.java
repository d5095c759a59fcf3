package ruleplatform.keyed;

import com.fasterxml.jackson.databind.JsonNode;

/**
 * keyed_rows.py Slot: one keyed rule row of the plan, named by its index in a row's `m`,
 * with the input columns (indexes into the operator's input schema, -1: not there, read
 * as NULL) of its time and value.
 */
final class Slot {
    final RuleSpec rule;
    final String role; // source | context | routed
    final boolean eventTime;
    final int tsCol;
    final int farCol;
    final int numCol;
    final int jvCol;

    Slot(JsonNode n, RuleSpec rule, java.util.List<String> columns) {
        this.rule = rule;
        role = n.get("role").asText();
        eventTime = n.get("event_time").asBoolean();
        tsCol = index(n, "ts_col", columns);
        farCol = index(n, "far_col", columns);
        numCol = index(n, "num_col", columns);
        jvCol = index(n, "jv_col", columns);
    }

    private static int index(JsonNode n, String field, java.util.List<String> columns) {
        JsonNode v = n.get(field);
        return v == null || v.isNull() ? -1 : columns.indexOf(v.asText());
    }
}
