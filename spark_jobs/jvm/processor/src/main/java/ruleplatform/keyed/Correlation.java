package ruleplatform.keyed;

import java.util.ArrayList;
import java.util.Collection;
import java.util.List;

/**
 * A correlation rule's step for one key (docs/rule-language.md, "Correlation"): context
 * first (a primary sees context of its own batch whatever the arrival order), then the
 * held primaries (`last` only) in (ts, seq) order, then the batch's primaries.
 */
final class Correlation {
    private Correlation() {}

    /** The resolved context: last value or mean, its JSON text (last), record, std. */
    static final class Resolved {
        Double num;
        String jv;
        String record;
        Double std;
    }

    static List<Emit> step(RuleSpec rule, SubState st, List<Ev> primaries, List<Ev> contexts, long watermark) {
        st.context.addAll(contexts);
        List<Emit> emits = new ArrayList<>();
        List<Ev> held = new ArrayList<>(st.pending);
        held.sort(Ev::byTsSeq);
        List<Ev> still = new ArrayList<>();
        for (Ev p : held) {
            Resolved r = resolve(rule, st.context, p.ts);
            if (r != null) {
                Emit e = judge(rule, p, r);
                if (e != null) {
                    emits.add(e);
                }
            } else if (p.ts >= watermark) {
                still.add(p); // context may still arrive until the watermark passes it
            }
        }
        st.pending = still;
        for (Ev p : primaries) {
            Resolved r = resolve(rule, st.context, p.ts);
            if (r == null) {
                if (rule.lastResolution) {
                    st.pending.add(p);
                }
                continue;
            }
            Emit e = judge(rule, p, r);
            if (e != null) {
                emits.add(e);
            }
        }
        return emits;
    }

    /**
     * The followers' step, after the version in force's (`st`, whose step entered the
     * batch's context): each judges the same primaries, and its own held ones, against
     * that context with its own resolution, metric and condition. A follower's sub-state
     * holds no context of its own.
     */
    static void follow(SubState st, List<Follower> followers, List<Ev> primaries, long watermark) {
        for (Follower f : followers) {
            f.st.context = st.context;
            f.emits.addAll(step(f.rule, f.st, primaries, List.of(), watermark));
            f.st.context = new ArrayList<>();
            if (watermark > 0) {
                evict(f.st, f.rule, watermark); // its held primaries; it has no context
            }
        }
    }

    /** Context in [t - lookback, t] resolved per the rule; null when none is usable. */
    static Resolved resolve(RuleSpec rule, Collection<Ev> context, long t) {
        long lo = t - rule.lookbackMs;
        if (rule.lastResolution) {
            Ev best = null;
            for (Ev c : context) { // max by (ts, seq): the first of equal ones
                if (c.ts >= lo && c.ts <= t && (best == null || Ev.byTsSeq(c, best) > 0)) {
                    best = c;
                }
            }
            if (best == null) {
                return null;
            }
            Resolved r = new Resolved();
            r.num = best.num;
            r.jv = best.jv;
            r.record = best.raw;
            return r;
        }
        double[] nums = new double[context.size()];
        int n = 0;
        for (Ev c : context) {
            if (c.ts >= lo && c.ts <= t && c.num != null) {
                nums[n++] = c.num;
            }
        }
        if (n == 0 || n < rule.minContextPoints) {
            return null;
        }
        double mean = ExactSum.of(nums, 0, n) / n;
        double[] sq = new double[n];
        for (int i = 0; i < n; i++) {
            sq[i] = squared(nums[i] - mean);
        }
        double std = Math.sqrt(ExactSum.of(sq, 0, n) / n);
        Resolved r = new Resolved();
        r.num = mean;
        r.std = std;
        // The context record of a detection: {"mean": m, "std": s, "count": n}.
        r.record = "{\"mean\": " + JsonNumbers.json(mean) + ", \"std\": " + JsonNumbers.json(std)
                + ", \"count\": " + n + "}";
        return r;
    }

    /** x * x; a finite x whose square is beyond the double range cannot be evaluated. */
    private static double squared(double x) {
        double y = x * x;
        if (Double.isInfinite(y) && Double.isFinite(x)) {
            throw new EvaluationError("squared deviation from the mean exceeds the double range");
        }
        return y;
    }

    private static boolean op(String op, double a, double b) {
        switch (op) {
            case ">": return a > b;
            case "<": return a < b;
            case ">=": return a >= b;
            case "<=": return a <= b;
            case "==": return a == b;
            case "!=": return a != b;
            default: throw new EvaluationError("unknown operator '" + op + "'");
        }
    }

    /** The metric and the condition. */
    static Emit judge(RuleSpec rule, Ev primary, Resolved res) {
        if ("direct".equals(rule.metric) && rule.lastResolution) {
            if (!CompareJson.matches(res.jv, rule)) {
                return null;
            }
            Emit e = new Emit(primary);
            e.ctxJson = res.jv;
            e.metricValue = res.num;
            e.ctxRecord = res.record;
            e.ctxNum = res.num;
            return e;
        }
        Double ev = primary.num;
        Double num = res.num;
        Double metric;
        if ("direct".equals(rule.metric)) {
            metric = num;
        } else if (ev == null || num == null) {
            return null;
        } else if ("ratio_deviation".equals(rule.metric)) {
            metric = num != 0 ? Math.abs(ev / num - 1.0) : null;
        } else if ("difference".equals(rule.metric)) {
            metric = ev - num;
        } else { // z_score: a zero (or missing) std gives no metric
            metric = res.std != null && res.std != 0.0 ? (ev - num) / res.std : null;
        }
        if (metric == null || !op(rule.condOp, metric, rule.condNum)) {
            return null;
        }
        Emit e = new Emit(primary);
        // Under mean/mean_std the context value is the mean, rendered downstream from ctx_num.
        e.ctxJson = rule.lastResolution ? res.jv : null;
        e.metricValue = metric;
        e.ctxRecord = res.record;
        e.ctxNum = num;
        return e;
    }

    /** Context older than (watermark - lookback) can serve no primary still to come. */
    static void evict(SubState st, RuleSpec rule, long watermark) {
        long cutoff = watermark - rule.lookbackMs;
        st.context.removeIf(c -> c.ts < cutoff);
        st.pending.removeIf(p -> p.ts < watermark);
    }
}
