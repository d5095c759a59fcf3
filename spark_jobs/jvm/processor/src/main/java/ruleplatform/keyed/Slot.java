package ruleplatform.keyed;

/**
 * One keyed rule row of the batch's rule-set version (ruleplatform.rules.KeyedRules.Row),
 * as the operator reads it: the rule, its role and whether it runs on event time. An
 * input row's members name their slot by its index in that version.
 */
final class Slot {
    final RuleSpec rule;
    final String role; // source | context | routed
    final boolean eventTime;

    Slot(RuleSpec rule, String role, boolean eventTime) {
        this.rule = rule;
        this.role = role;
        this.eventTime = eventTime;
    }
}
