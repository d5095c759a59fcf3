package ruleplatform.keyed;

import java.util.ArrayList;
import java.util.List;

/**
 * A shadow version judged on the state of the version in force (DetectionProcessor
 * `sharing`): the same state signature means the same events enter both, so with the
 * same window (velocity) or lookback (correlation) one window or one context buffer
 * serves both. The shadow keeps only what depends on its own condition: a velocity
 * shadow its last-event state (judged on the aggregates of the shared window with its
 * own threshold and emit mode: Velocity.step), a correlation shadow its held primaries
 * (resolved against the shared context: Correlation.follow).
 */
final class Follower {
    final RuleSpec rule;
    final SubState st;
    final List<Emit> emits = new ArrayList<>();

    Follower(RuleSpec rule, SubState st) {
        this.rule = rule;
        this.st = st;
    }
}
