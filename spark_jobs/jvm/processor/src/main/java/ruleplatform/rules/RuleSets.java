package ruleplatform.rules;

import java.util.LinkedHashMap;
import java.util.Map;
import java.util.function.Supplier;

/**
 * Compiled rule sets of this JVM by their spec's text (or its hash): the tasks of an executor share one
 * compiled version. A few versions are kept (a batch may still run the previous one
 * while the next is compiled); the oldest goes first.
 */
final class RuleSets {
    private RuleSets() {}

    private static final int KEEP = 4;
    private static final Map<String, RuleSet> BY_SPEC = new LinkedHashMap<>(KEEP, 0.75f, true) {
        @Override
        protected boolean removeEldestEntry(Map.Entry<String, RuleSet> eldest) {
            return size() > KEEP;
        }
    };

    static synchronized RuleSet compiled(String spec) {
        return BY_SPEC.computeIfAbsent(spec, RuleSet::compile);
    }

    /** The rule set named `key` (a hash of its spec), compiled from `spec` the first time. */
    static synchronized RuleSet compiled(String key, Supplier<String> spec) {
        return BY_SPEC.computeIfAbsent("#" + key, k -> RuleSet.compile(spec.get()));
    }
}
