package ruleplatform.keyed;

/**
 * One (event, rule row) of a key. ts is null when the rule cannot use the event's time (its `a<i>` issue is
 * then in tsIssue).
 */
final class Ev {
    final String role;
    final boolean eventTime;
    final Long ts;
    final Long seq;
    final String topic;
    final String raw;
    final Double num;
    final String jv;
    final String tsIssue;
    /** A warm-up row (KeyedRules.Member.warm): state only, never judged. Not stored. */
    final boolean warm;

    Ev(String role, boolean eventTime, Long ts, Long seq, String topic, String raw, Double num, String jv,
       String tsIssue) {
        this(role, eventTime, ts, seq, topic, raw, num, jv, tsIssue, false);
    }

    Ev(String role, boolean eventTime, Long ts, Long seq, String topic, String raw, Double num, String jv,
       String tsIssue, boolean warm) {
        this.role = role;
        this.eventTime = eventTime;
        this.ts = ts;
        this.seq = seq;
        this.topic = topic;
        this.raw = raw;
        this.num = num;
        this.jv = jv;
        this.tsIssue = tsIssue;
        this.warm = warm;
    }

    /** Sort order of a key's rows: (ts, seq), stable for equal pairs. */
    static int byTsSeq(Ev a, Ev b) {
        int c = Long.compare(a.ts, b.ts);
        if (c != 0) {
            return c;
        }
        if (a.seq == null || b.seq == null) {
            return a.seq == null ? (b.seq == null ? 0 : -1) : 1;
        }
        return Long.compare(a.seq, b.seq);
    }
}
