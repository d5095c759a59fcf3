package ruleplatform.keyed;

import java.math.BigDecimal;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * A velocity rule's step and window eviction for one key: the batch's rows (sorted by
 * (ts, seq)) enter the key's window, each judged over the window's events with time in
 * (ts - window, ts]: the stored events up to and including its time and the batch's rows
 * up to and including itself.
 *
 * Merged into one sorted column (a batch row after stored rows and earlier batch rows of
 * equal time), each row's window is one
 * contiguous range ending at the row itself, and both ends only move forward: the
 * aggregates slide (exact BigDecimal sum, monotonic deques for min/max, value counts for
 * distinct_count) instead of being recomputed per row. A sum or avg window keeps its
 * exact sum with the key's state ({@link SubState#sum}): a batch whose rows all come at
 * or after the stored ones starts from it instead of adding the stored values again
 * (one BigDecimal addition each, at every batch that touches the key). The results are those of
 * the aggregation's definition: count as a double, sum exact and
 * rounded once (ExactSum), avg = that sum / number of values, min/max/sum/avg skip events without
 * a value, distinct_count counts distinct JSON texts (null being one of them).
 */
final class Velocity {
    private Velocity() {}

    /** A window's values by index: the backtest's columns, or the live state's (SubState.Column). */
    interface Values {
        double num(int i);

        String jv(int i);
    }

    static List<Emit> step(RuleSpec rule, SubState st, List<Ev> rows) {
        return step(rule, st, rows, List.of());
    }

    /** As {@link #step(RuleSpec, SubState, List)}, each of `followers` judged on the same aggregates. */
    static List<Emit> step(RuleSpec rule, SubState st, List<Ev> rows, List<Follower> followers) {
        List<Emit> emits = new ArrayList<>();
        int n = rows.size();
        if (n == 0) {
            return emits;
        }
        String kind = rule.aggregationType;
        boolean nums = !"count".equals(kind) && !"distinct_count".equals(kind);
        boolean texts = "distinct_count".equals(kind);
        int m = st.size();
        long newest = m > 0 ? st.newest() : 0L;
        long first = rows.get(0).ts;
        // The rows merge into the open part; sealed chunks with events after the first
        // row are opened again (rows out of order by more than the open part holds).
        st.unseal(first);
        int base = st.sealedSize();
        long[] old = st.ts;
        int mo = old.length;
        long[] ts = new long[mo + n];
        double[] num = nums ? new double[mo + n] : null;
        String[] jv = texts ? new String[mo + n] : null;
        int[] pos = new int[n];
        int o = 0;
        for (int i = 0; i < n; i++) {
            long t = rows.get(i).ts;
            while (o < mo && old[o] <= t) { // bisect_right: after stored rows of equal time
                copyOld(st, o, o + i, ts, num, jv);
                o++;
            }
            int p = o + i;
            pos[i] = base + p;
            Ev r = rows.get(i);
            ts[p] = t;
            if (num != null) {
                num[p] = r.num == null ? Double.NaN : r.num;
            }
            if (jv != null) {
                jv[p] = r.jv;
            }
        }
        for (; o < mo; o++) {
            copyOld(st, o, o + n, ts, num, jv);
        }
        st.ts = ts;
        st.num = num;
        st.jv = jv;

        SubState.Column col = st.column();
        Window w = new Window(kind, col);
        long size = rule.windowMs;
        int lo;
        int hi; // next index to enter
        if (st.sum != null && m > 0 && pos[0] == m) {
            // In order: the stored window [sumFrom, m) is the last one judged; go on from it.
            w.restore(st.sum);
            lo = st.sumFrom;
            hi = m;
        } else {
            // The first row's window: what is before it would enter and leave at once.
            lo = col.firstAfter(first - size);
            hi = lo;
        }
        Crossing crossing = new Crossing(st.prevAbove, m > 0, newest);
        Crossing[] others = new Crossing[followers.size()];
        for (int f = 0; f < others.length; f++) {
            others[f] = new Crossing(followers.get(f).st.prevAbove, m > 0, newest);
        }
        for (int i = 0; i < n; i++) {
            long t = rows.get(i).ts;
            while (hi <= pos[i]) {
                w.enter(hi++);
            }
            while (lo < hi && col.ts(lo) <= t - size) {
                w.leave(lo++);
            }
            double agg = w.value(hi - lo);
            if (crossing.fires(t, size, agg >= rule.threshold, rule.allEvents)) {
                Emit e = new Emit(rows.get(i));
                e.aggValue = agg;
                emits.add(e);
            }
            for (int f = 0; f < others.length; f++) {
                Follower fo = followers.get(f);
                if (others[f].fires(t, size, agg >= fo.rule.threshold, fo.rule.allEvents)) {
                    Emit e = new Emit(rows.get(i));
                    e.aggValue = agg;
                    fo.emits.add(e);
                }
            }
        }
        st.prevAbove = crossing.prev;
        for (int f = 0; f < others.length; f++) {
            followers.get(f).st.prevAbove = others[f].prev;
        }
        // The window of the newest row, kept when it reaches the column's end (no stored row
        // newer than the batch's last).
        boolean sums = "sum".equals(kind) || "avg".equals(kind);
        st.sum = sums && hi == col.size() ? w.saved() : null;
        st.sumFrom = lo;
        st.seal();
        return emits;
    }

    /**
     * The last-event state a key's newest event leaves (whether its window's aggregation
     * was at or above the threshold), from the window as it is: what judging the same
     * events in (ts, seq) order leaves. A warming rule's rows come out of that order (the
     * archive's after live ones), so its state is settled after each step.
     */
    static void settle(RuleSpec rule, SubState st, List<Follower> followers) {
        Double agg = null;
        if (st.size() > 0) {
            SubState.Column col = st.column();
            int n = col.size();
            int lo = col.firstAfter(col.ts(n - 1) - rule.windowMs);
            Window w = new Window(rule.aggregationType, col);
            for (int i = lo; i < n; i++) {
                w.enter(i);
            }
            try {
                agg = w.value(n - lo);
            } catch (EvaluationError e) {
                agg = null; // a min/max window without values: not above
            }
        }
        st.prevAbove = agg == null ? null : agg >= rule.threshold;
        for (Follower f : followers) {
            f.st.prevAbove = agg == null ? null : agg >= f.rule.threshold;
        }
        st.sum = null;
    }

    private static void copyOld(SubState st, int from, int to, long[] ts, double[] num, String[] jv) {
        ts[to] = st.ts[from];
        if (num != null) {
            num[to] = st.num == null ? Double.NaN : st.num[from];
        }
        if (jv != null) {
            jv[to] = st.jv == null ? null : st.jv[from];
        }
    }

    /** Forget entries no future event can see: ts <= horizon - window. */
    static void evict(SubState st, RuleSpec rule, long horizonMs) {
        int i = st.evict(horizonMs - rule.windowMs);
        if (i == 0) {
            return;
        }
        if (st.sum != null) {
            // The kept window starts at or after the cut unless a stored row newer than the
            // batch moved the horizon past it: then it is summed afresh next time.
            if (st.sumFrom >= i) {
                st.sumFrom -= i;
            } else {
                st.sum = null;
            }
        }
    }

    /**
     * The emit decision for one key's rule, an event at a time
     * in (ts, seq) order; also the backtest's ({@link BatchVelocity}). An `all_events`
     * rule fires whenever its aggregation is at or above the threshold; a `last_event`
     * rule when it crosses it: the previous evaluation was below, or is void because the
     * key's newest event is out of this one's window (the window had emptied since).
     */
    static final class Crossing {
        Boolean prev;
        private boolean seen;
        private long newest;

        Crossing(Boolean prev, boolean seen, long newest) {
            this.prev = prev;
            this.seen = seen;
            this.newest = newest;
        }

        boolean fires(long t, long windowMs, boolean above, boolean allEvents) {
            if (!seen || newest <= t - windowMs) {
                prev = null;
            }
            newest = seen ? Math.max(newest, t) : t;
            seen = true;
            boolean fires = above && (allEvents || prev == null || !prev);
            prev = above;
            return fires;
        }
    }

    /** A sum or avg window's exact state: the sum of its finite values, how many values, infinities. */
    static final class Saved {
        final BigDecimal sum;
        final int values;
        final int posInf;
        final int negInf;

        Saved(BigDecimal sum, int values, int posInf, int negInf) {
            this.sum = sum;
            this.values = values;
            this.posInf = posInf;
            this.negInf = negInf;
        }
    }

    /**
     * One aggregation over a range of the merged column that slides forward; also the
     * backtest's ({@link BatchVelocity}, which builds a new one when its columns move).
     */
    static final class Window {
        final String kind;
        final Values at;
        // sum / avg: the exact sum of the finite values, and the non-finite values'
        BigDecimal sum = BigDecimal.ZERO;
        int values; // values present (not NaN)
        int nan;
        int posInf;
        int negInf;
        // min / max: indexes of candidate extremes, earliest first
        final ArrayDeque<Integer> mono = new ArrayDeque<>();
        // distinct_count
        final Map<String, Integer> counts = new HashMap<>();

        /** Over columns in memory (the backtest's). */
        Window(String kind, double[] num, String[] jv) {
            this(kind, new Values() {
                @Override
                public double num(int i) {
                    return num[i];
                }

                @Override
                public String jv(int i) {
                    return jv[i];
                }
            });
        }

        Window(String kind, Values at) {
            this.kind = kind;
            this.at = at;
        }

        void enter(int i) {
            switch (kind) {
                case "count":
                    return;
                case "distinct_count":
                    counts.merge(at.jv(i), 1, Integer::sum);
                    return;
                case "min":
                case "max": {
                    double x = at.num(i);
                    if (x != x) {
                        return;
                    }
                    boolean min = "min".equals(kind);
                    // keep the earliest of equal values at the front, as min()/max() return the first
                    while (!mono.isEmpty() && (min ? at.num(mono.peekLast()) > x : at.num(mono.peekLast()) < x)) {
                        mono.pollLast();
                    }
                    mono.addLast(i);
                    return;
                }
                default:
                    add(at.num(i), 1);
            }
        }

        void leave(int i) {
            switch (kind) {
                case "count":
                    return;
                case "distinct_count": {
                    String k = at.jv(i);
                    int c = counts.get(k) - 1;
                    if (c == 0) {
                        counts.remove(k);
                    } else {
                        counts.put(k, c);
                    }
                    return;
                }
                case "min":
                case "max":
                    if (!mono.isEmpty() && mono.peekFirst() == i) {
                        mono.pollFirst();
                    }
                    return;
                default:
                    add(at.num(i), -1);
            }
        }

        /** The exact sum's state (sum and avg): what {@link #restore} takes back. */
        Saved saved() {
            return new Saved(sum, values, posInf, negInf);
        }

        void restore(Saved s) {
            sum = s.sum;
            values = s.values;
            posInf = s.posInf;
            negInf = s.negInf;
        }

        private void add(double x, int sign) {
            if (x != x) {
                return; // no value: skipped
            }
            values += sign;
            if (Double.isInfinite(x)) {
                if (x > 0) {
                    posInf += sign;
                } else {
                    negInf += sign;
                }
            } else if (x != 0.0) {
                BigDecimal d = new BigDecimal(x);
                sum = sign > 0 ? sum.add(d) : sum.subtract(d);
            }
        }

        double value(int size) {
            switch (kind) {
                case "count":
                    return size;
                case "distinct_count":
                    return counts.size();
                case "min":
                case "max":
                    if (mono.isEmpty()) {
                        throw new EvaluationError(kind + " of a window with no values");
                    }
                    return at.num(mono.peekFirst());
                default: {
                    double special = 0.0;
                    double infSum = 0.0;
                    boolean anySpecial = posInf > 0 || negInf > 0;
                    if (posInf > 0) {
                        special += Double.POSITIVE_INFINITY;
                        infSum += Double.POSITIVE_INFINITY;
                    }
                    if (negInf > 0) {
                        special += Double.NEGATIVE_INFINITY;
                        infSum += Double.NEGATIVE_INFINITY;
                    }
                    double s = ExactSum.finish(sum, anySpecial, special, infSum);
                    if ("sum".equals(kind)) {
                        return s;
                    }
                    if (values == 0) {
                        throw new EvaluationError("average of a window with no values");
                    }
                    return s / values;
                }
            }
        }
    }
}
