package ruleplatform.keyed;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.ExpiredTimerInfo;
import org.apache.spark.sql.streaming.MapState;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessor;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.streaming.ValueState;
import ruleplatform.rules.KeyedRules;
import ruleplatform.rules.RuleSet;
import scala.Tuple2;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The live job's keyed operator (spark_jobs/streaming/jvm_operator.py): input rows one
 * per (event, key group), `mem` holding the rule rows the event enters (each named by
 * its index in the micro-batch's rule-set version, with its time, number and JSON
 * text: ruleplatform.rules.KeyedRules), grouped by (gid, bucket); output OUTPUT_SCHEMA
 * rows (detection | routed | dead). The rules are read from the batch's version, not
 * held by the operator: a rule change needs no new plan. The semantics are those
 * of docs/rule-language.md; the backtest (spark_jobs/backtest) must give the same detections.
 *
 * State: one MapState entry per key (`key` -> KeyState: the SubState bytes of each rule
 * that judged the key), so a batch reads and writes a key it touched once, whatever the
 * number of its rules; a long window's sealed chunks in entries of their own (`key NUL
 * rule_id NUL chunk id`: SubState), and one ValueState with the bucket's event-time
 * timer. Expiry is per sub-state (its newest event a full window plus the rule's
 * lateness behind), applied when the bucket's one timer fires at (or before) the
 * earliest expiry.
 *
 * Edge cases: only a final sum beyond the double range fails a key (ExactSum); min/max
 * of a window holding both 0.0 and -0.0 may give either zero; a failure message is cut
 * at 300 UTF-16 units, not code points.
 */
public final class DetectionProcessor extends StatefulProcessor<Row, Row, Row> {
    private static final long serialVersionUID = 1L;
    private static final char SEP = '\u0000'; // JSON key text never holds a raw NUL

    /** keyed_rows.py PASS_GID: the second operator's groups of rows that only pass through. */
    public static final String PASS_GID = "\u0000pass";
    /** The position of ts_ms in KeyedOperator.OUTPUT_SCHEMA (and in a pass row's columns). */
    private static final int TS_MS = KeyedOperator.OUTPUT_SCHEMA.fieldIndex("ts_ms");

    private final String versionsDir;
    private final String[] columns;
    private final boolean chained;
    private final boolean passes;
    private final boolean java8Time;

    private transient RuleSet slotsOf;
    private transient Slot[] slots;
    private transient int kCol;
    private transient int memCol;
    private transient int topicCol;
    private transient int seqCol;
    private transient int rawCol;
    private transient int[] passCols;
    private transient MapState<String, byte[]> subs;
    private transient ValueState<Long> timer;

    /** versionsDir: the job's rule-set versions (rule_versions.py); columns: the input's column names. */
    public DetectionProcessor(String versionsDir, String[] columns) {
        this(versionsDir, columns, false, false, false);
    }

    /**
     * chained: a second operator follows, so every output row carries `et` (keyed_rows.py
     * CHAINED_SCHEMA) as a java.time.Instant when java8Time, else a java.sql.Timestamp
     * (what Spark's row encoder expects under spark.sql.datetime.java8API.enabled);
     * passes: the PASS_GID groups' rows are handed on as they came (stamped when chained).
     */
    public DetectionProcessor(String versionsDir, String[] columns, boolean chained, boolean passes, boolean java8Time) {
        this.versionsDir = versionsDir;
        this.columns = columns.clone();
        this.chained = chained;
        this.passes = passes;
        this.java8Time = java8Time;
    }

    @Override
    public void init(OutputMode outputMode, TimeMode timeMode) {
        List<String> cols = Arrays.asList(columns);
        kCol = cols.indexOf("k");
        memCol = cols.indexOf("mem");
        topicCol = cols.indexOf("topic");
        seqCol = cols.indexOf("seq");
        rawCol = cols.indexOf("raw");
        if (passes) {
            String[] names = KeyedOperator.OUTPUT_SCHEMA.fieldNames();
            passCols = new int[names.length];
            for (int i = 0; i < names.length; i++) {
                passCols[i] = cols.indexOf(names[i]);
                if (passCols[i] < 0) {
                    throw new IllegalArgumentException("operator input with pass rows lacks column " + names[i]);
                }
            }
        }
        subs = getHandle().getMapState("subs", Encoders.STRING(), Encoders.BINARY(), TTLConfig.NONE());
        timer = getHandle().getValueState("timer", Encoders.LONG(), TTLConfig.NONE());
    }

    /**
     * The slots of the running micro-batch's rule-set version (the one its key rows were
     * made with: both read the batch's record, ruleplatform.rules.BatchVersions), built
     * once per version and task.
     */
    private Slot[] slots() {
        RuleSet version = RuleSet.forTask(versionsDir);
        if (version != slotsOf) {
            KeyedRules keyed = version.keyed();
            Slot[] out = new Slot[keyed.size()];
            Map<String, RuleSpec> rules = new HashMap<>();
            for (int i = 0; i < out.length; i++) {
                KeyedRules.Row row = keyed.row(i);
                RuleSpec rule = rules.computeIfAbsent(row.rule.toString(), x -> new RuleSpec(row.rule));
                out[i] = new Slot(rule, row.role, row.eventTime);
            }
            slots = out;
            slotsOf = version;
        }
        return slots;
    }

    /** A rule's rows of the batch by key, in arrival order. */
    private static final class RuleRows {
        final RuleSpec rule;
        final LinkedHashMap<String, List<Ev>> byKey = new LinkedHashMap<>();

        RuleRows(RuleSpec rule) {
            this.rule = rule;
        }
    }

    /** One rule's rows of one key in the batch, and what judging them gave. */
    private static final class Judged {
        final RuleSpec rule;
        final List<Ev> rows;
        final List<Row> out = new ArrayList<>();

        Judged(RuleSpec rule, List<Ev> rows) {
            this.rule = rule;
            this.rows = rows;
        }
    }

    private static Object get(Row r, int i) {
        return i < 0 || r.isNullAt(i) ? null : r.get(i);
    }

    private LinkedHashMap<String, RuleRows> rowsByRule(scala.collection.Iterator<Row> rows) {
        Slot[] slots = slots();
        LinkedHashMap<String, RuleRows> byRule = new LinkedHashMap<>();
        RuleRows[] seen = new RuleRows[slots.length];
        while (rows.hasNext()) {
            Row r = rows.next();
            String k = (String) get(r, kCol);
            Long seq = (Long) get(r, seqCol);
            String topic = (String) get(r, topicCol);
            String raw = (String) get(r, rawCol);
            List<Row> members = r.getList(memCol);
            for (Row m : members) {
                int idx = m.getInt(0);
                Slot slot = slots[idx];
                RuleRows entry = seen[idx];
                if (entry == null) {
                    entry = byRule.computeIfAbsent(slot.rule.ruleId, x -> new RuleRows(slot.rule));
                    seen[idx] = entry;
                }
                String issue = m.isNullAt(2) ? null : m.getString(2);
                Long ts = issue != null || m.isNullAt(1) ? null : m.getLong(1);
                Double num = m.isNullAt(3) ? null : m.getDouble(3);
                String jv = m.isNullAt(4) ? null : m.getString(4);
                boolean warm = m.length() > 5 && !m.isNullAt(5) && m.getBoolean(5);
                Ev ev = new Ev(slot.role, slot.eventTime, ts, seq, topic, raw, num, jv, issue, warm);
                entry.byKey.computeIfAbsent(k, x -> new ArrayList<>()).add(ev);
            }
        }
        return byRule;
    }

    @Override
    public scala.collection.Iterator<Row> handleInputRows(Row key, scala.collection.Iterator<Row> rows,
                                                          TimerValues timerValues) {
        if (passes && PASS_GID.equals(key.getString(0))) {
            // Lazily, row for row: nothing of a pass group is held or looked at. The
            // first operator stamps `et` as on its own rows.
            long watermark = timerValues.getCurrentWatermarkInMs();
            int n = passCols.length + (chained ? 1 : 0);
            return rows.map(r -> {
                Object[] v = new Object[n];
                for (int i = 0; i < passCols.length; i++) {
                    v[i] = r.get(passCols[i]);
                }
                if (chained) {
                    v[passCols.length] = stampOf(v[TS_MS], watermark);
                }
                return RowFactory.create(v);
            });
        }
        LinkedHashMap<String, RuleRows> byRule = rowsByRule(rows);
        List<Row> out = new ArrayList<>();
        if (byRule.isEmpty()) {
            return CollectionConverters.asScala(out.iterator());
        }
        long watermark = timerValues.getCurrentWatermarkInMs();
        Long registered = timer.exists() ? timer.get() : null;
        // Judged key by key (one read and one write of the key's state), output rule by
        // rule as the rows came: each (rule, key) pair's rows go into its own list.
        Map<String, List<Judged>> byKey = new LinkedHashMap<>();
        List<Judged> order = new ArrayList<>();
        for (RuleRows rr : byRule.values()) {
            for (Map.Entry<String, List<Ev>> e : rr.byKey.entrySet()) {
                Judged j = new Judged(rr.rule, e.getValue());
                byKey.computeIfAbsent(e.getKey(), x -> new ArrayList<>()).add(j);
                order.add(j);
            }
        }
        Long earliest = null;
        for (Map.Entry<String, List<Judged>> e : byKey.entrySet()) {
            String k = e.getKey();
            byte[] packed = subs.getValue(k);
            KeyState ks = packed == null ? new KeyState() : KeyState.decode(packed);
            boolean changed = false;
            Map<Judged, List<Judged>> sharing = sharing(e.getValue());
            for (Judged j : e.getValue()) {
                RuleSpec rule = j.rule;
                if (rule.ruleId.endsWith(SHADOW) && isFollower(j, sharing)) {
                    continue; // judged with the version in force it shares a window with
                }
                String prefix = k + SEP + rule.ruleId;
                List<Judged> shadows = sharing.getOrDefault(j, List.of());
                List<Follower> followers = new ArrayList<>(shadows.size());
                for (Judged f : shadows) {
                    followers.add(new Follower(f.rule, followerState(k, f.rule, ks)));
                }
                SubState stored;
                try {
                    byte[] v = ks.parts.get(rule.ruleId);
                    stored = evaluate(rule, j.rows, watermark, j.out, v == null ? null : SubState.decode(v),
                        id -> subs.getValue(chunkKey(prefix, id)), followers);
                } catch (RuntimeException exc) {
                    // One key's failure dead-letters that key's rows and keeps its state;
                    // the batch, every other key and rule go on.
                    String reason = EvaluationError.reason(exc);
                    for (Judged f : prepend(j, shadows)) {
                        f.out.clear();
                        for (Ev r : f.rows) {
                            f.out.add(output("dead", f.rule, r, null, reason));
                        }
                    }
                    continue;
                }
                for (int i = 0; i < shadows.size(); i++) {
                    Judged f = shadows.get(i);
                    Follower fo = followers.get(i);
                    timedRows(f.rule, f.rows, watermark, f.out);
                    String kind = f.rule.emitToSink ? "detection" : "routed";
                    for (Emit em : fo.emits) {
                        f.out.add(output(kind, f.rule, em.row, em, null));
                    }
                    if (stored != null) {
                        fo.st.maxTs = stored.maxTs;
                        fo.st.expiry = stored.expiry;
                        fo.st.signature = f.rule.signature;
                        ks.parts.put(f.rule.ruleId, fo.st.encode());
                        changed = true;
                    }
                }
                if (stored == null) {
                    continue;
                }
                for (int id : stored.dropped) {
                    subs.removeKey(chunkKey(prefix, id));
                }
                for (SubState.Chunk c : stored.written.values()) {
                    subs.updateValue(chunkKey(prefix, c.id), c.encode());
                }
                ks.parts.put(rule.ruleId, stored.encode());
                changed = true;
                if (stored.expiry != null && (earliest == null || stored.expiry < earliest)) {
                    earliest = stored.expiry;
                }
            }
            if (changed) {
                subs.updateValue(k, ks.encode());
            }
        }
        for (Judged j : order) {
            out.addAll(j.out);
        }
        for (RuleRows rr : byRule.values()) {
            if (rr.rule.velocity && !rr.rule.usesEventTime) {
                forgetIdleProcessingTimeKeys(rr.rule, rr.byKey);
            }
        }
        if (chained) {
            stamp(out, watermark);
        }
        // Sub-states not in this batch keep expiries at or after the registered timer; it
        // only moves when one needs an earlier one. Spark refuses a timer at or before the
        // watermark: such an expiry fires at the next watermark move instead.
        if (earliest != null) {
            earliest = Math.max(earliest, watermark + 1);
            if (registered == null || earliest < registered) {
                if (registered != null) {
                    getHandle().deleteTimer(registered);
                }
                getHandle().registerTimer(earliest);
                timer.update(earliest);
            }
        }
        return CollectionConverters.asScala(out.iterator());
    }

    /** A shadow's live id: `<rule_id>@shadow` (spark_jobs/rules/model.py SHADOW_SUFFIX). */
    private static final String SHADOW = "@shadow";

    /**
     * The shadows of one key's rules judged on the state of the version in force, by
     * that version (Follower; spark_jobs/streaming/warmup.py `_shares` says the same).
     */
    private static Map<Judged, List<Judged>> sharing(List<Judged> judged) {
        Map<Judged, List<Judged>> out = new java.util.IdentityHashMap<>();
        if (judged.size() < 2) {
            return out;
        }
        Map<String, Judged> byId = new HashMap<>();
        for (Judged j : judged) {
            byId.put(j.rule.ruleId, j);
        }
        for (Judged j : judged) {
            RuleSpec r = j.rule;
            if (!r.ruleId.endsWith(SHADOW)) {
                continue;
            }
            Judged base = byId.get(r.ruleId.substring(0, r.ruleId.length() - SHADOW.length()));
            if (base != null && shares(r, base.rule)) {
                out.computeIfAbsent(base, x -> new ArrayList<>()).add(j);
            }
        }
        return out;
    }

    /**
     * Whether `shadow` is judged on the state of `inForce`: the same events enter both
     * (the same state signature and, for a correlation rule, primaries routed from the
     * same velocity rule, if any) and both keep them as long (the same window, or lookback).
     */
    static boolean shares(RuleSpec shadow, RuleSpec inForce) {
        if (shadow.velocity != inForce.velocity || !shadow.signature.equals(inForce.signature)) {
            return false;
        }
        return shadow.velocity ? shadow.windowMs == inForce.windowMs
                : shadow.lookbackMs == inForce.lookbackMs && java.util.Objects.equals(shadow.routedFrom, inForce.routedFrom);
    }

    private static boolean isFollower(Judged j, Map<Judged, List<Judged>> sharing) {
        for (List<Judged> shadows : sharing.values()) {
            for (Judged s : shadows) {
                if (s == j) {
                    return true;
                }
            }
        }
        return false;
    }

    private static List<Judged> prepend(Judged first, List<Judged> rest) {
        List<Judged> all = new ArrayList<>(rest.size() + 1);
        all.add(first);
        all.addAll(rest);
        return all;
    }

    /**
     * A sharing shadow's own sub-state: its last-event state, or its held primaries, and
     * no window or context (those of its own from before it shared are dropped, its
     * sealed chunks' entries too).
     */
    private SubState followerState(String key, RuleSpec rule, KeyState ks) {
        byte[] v = ks.parts.get(rule.ruleId);
        SubState own = new SubState();
        if (v == null) {
            return own;
        }
        SubState old = SubState.decode(v);
        if (old.signature == null || rule.sameState(old.signature)) {
            own.prevAbove = old.prevAbove;
            own.pending = old.pending;
        }
        for (SubState.Chunk c : old.sealed) {
            subs.removeKey(chunkKey(key + SEP + rule.ruleId, c.id));
        }
        return own;
    }

    /**
     * Forgetting idle processing-time keys: a processing-time rule's sub-states
     * of keys without rows in the batch whose newest event is a whole window older than
     * the newest broker time of the rule's rows are dropped (nothing later can see them).
     */
    private void forgetIdleProcessingTimeKeys(RuleSpec rule, Map<String, List<Ev>> batch) {
        Long now = null;
        for (List<Ev> rows : batch.values()) {
            for (Ev r : rows) {
                if (r.ts != null && (now == null || r.ts > now)) {
                    now = r.ts;
                }
            }
        }
        if (now == null) {
            return;
        }
        long horizon = now - rule.windowMs;
        Map<String, KeyState> idle = new LinkedHashMap<>();
        scala.collection.Iterator<Tuple2<String, byte[]>> it = subs.iterator();
        while (it.hasNext()) {
            Tuple2<String, byte[]> kv = it.next();
            String k = kv._1();
            if (isChunk(k) || batch.containsKey(k)) {
                continue;
            }
            byte[] part = KeyState.part(kv._2(), rule.ruleId);
            Long maxTs = part == null ? null : SubState.header(part)[0];
            if (maxTs != null && maxTs <= horizon) {
                idle.put(k, KeyState.decode(kv._2()));
            }
        }
        idle.forEach((k, ks) -> {
            removePart(k, rule.ruleId, ks);
            store(k, ks);
        });
    }

    /** A sealed window chunk's entry: its sub-state's key, NUL, the chunk's id. */
    private static String chunkKey(String mapKey, int id) {
        return mapKey + SEP + id;
    }

    /** A key's entry holds no NUL (a key's JSON text never does); a chunk's does. */
    private static boolean isChunk(String mapKey) {
        return mapKey.indexOf(SEP) >= 0;
    }

    /** A rule's sub-state out of a key's state `ks`, with its sealed chunks' entries. */
    private void removePart(String key, String ruleId, KeyState ks) {
        byte[] part = ks.parts.remove(ruleId);
        for (SubState.Chunk c : SubState.decode(part).sealed) {
            subs.removeKey(chunkKey(key + SEP + ruleId, c.id));
        }
    }

    /** A key's state written back, or its entry removed when no sub-state is left. */
    private void store(String key, KeyState ks) {
        if (ks.parts.isEmpty()) {
            subs.removeKey(key);
        } else {
            subs.updateValue(key, ks.encode());
        }
    }

    /**
     * One key's rows of the batch, `v` its stored sub-state: outputs
     * appended to `out`; returns the new sub-state (null: untouched).
     */
    private static SubState evaluate(RuleSpec rule, List<Ev> rows, long watermark, List<Row> out, SubState v,
                                     SubState.ChunkStore store, List<Follower> followers) {
        List<Ev> fresh = timedRows(rule, rows, watermark, out);
        if (fresh == null) {
            return null;
        }
        fresh.sort(Ev::byTsSeq);
        SubState st = v == null ? new SubState() : v;
        st.store = store;
        if (st.signature != null && !rule.sameState(st.signature)) {
            // New conditions, grouping or value fields: old entries no longer qualify.
            st.clearWindow();
            st.context = new ArrayList<>();
            st.pending = new ArrayList<>();
            st.prevAbove = null;
        }
        if (rule.velocity) {
            velocity(rule, fresh, st, watermark, out, followers);
        } else {
            correlation(rule, fresh, st, watermark, out, followers);
        }
        st.signature = rule.signature;
        return st;
    }

    /**
     * The rows of `rows` that may enter state; dead letters for the others (no usable
     * time, late) appended to `out`. Null: no row has a usable time.
     */
    private static List<Ev> timedRows(RuleSpec rule, List<Ev> rows, long watermark, List<Row> out) {
        List<Ev> fresh = new ArrayList<>();
        boolean anyTime = false;
        for (Ev r : rows) {
            if (r.ts == null) {
                // No usable timestamp: the row never touches state; the evaluator gave its reason
                // (KeyedRules.noTime, or too far ahead). A warm-up row's was dead-lettered live.
                if (!r.warm) {
                    out.add(output("dead", rule, r, null, r.tsIssue));
                }
                continue;
            }
            anyTime = true;
            // Routed primaries were judged for lateness when they entered the velocity
            // rule; re-injected a batch later, they must not be late a second time. A
            // warm-up row is history by design: it is older than the watermark.
            if (r.eventTime && !r.warm && !"routed".equals(r.role) && watermark > 0 && r.ts < watermark) {
                out.add(output("dead", rule, r, null,
                        "late event: older than the job watermark (" + watermark + " ms)"));
            } else {
                fresh.add(r);
            }
        }
        return anyTime ? fresh : null;
    }

    /** Each row with `et` appended (stampOf). */
    private void stamp(List<Row> out, long watermark) {
        for (int i = 0; i < out.size(); i++) {
            Row r = out.get(i);
            Object[] v = new Object[r.length() + 1];
            for (int j = 0; j < r.length(); j++) {
                v[j] = r.get(j);
            }
            v[r.length()] = stampOf(r.get(TS_MS), watermark);
            out.set(i, RowFactory.create(v));
        }
    }

    /**
     * A row's `et`: its ts_ms, or the watermark + 1 ms when that is later, so no row the
     * first operator hands on is late for the second; as Spark's row encoder expects it
     * (java8Time: an Instant).
     */
    private Object stampOf(Object tsMs, long watermark) {
        long ms = Math.max(tsMs == null ? 0L : (Long) tsMs, watermark + 1);
        return java8Time ? java.time.Instant.ofEpochMilli(ms) : new java.sql.Timestamp(ms);
    }

    /** An optional time, or y when it is absent or 0. */
    private static long orElse(Long x, long y) {
        return x == null || x == 0L ? y : x;
    }

    private static void velocity(RuleSpec rule, List<Ev> rows, SubState st, long watermark, List<Row> out,
                                 List<Follower> followers) {
        List<Emit> emits = Velocity.step(rule, st, rows, followers);
        if (rule.warming) {
            // Filling the windows (warm-up rows from the archive, live rows since the
            // rule came in), in whatever order they come: no emit, and the last-event
            // state is the one the key's newest event leaves, as if judged in order.
            emits.clear();
            for (Follower f : followers) {
                f.emits.clear();
            }
            Velocity.settle(rule, st, followers);
        } else {
            emits.removeIf(e -> e.row.warm);
            for (Follower f : followers) {
                f.emits.removeIf(e -> e.row.warm);
            }
        }
        if (!rows.isEmpty()) {
            long newest = rows.get(rows.size() - 1).ts; // sorted by time
            st.maxTs = Math.max(orElse(st.maxTs, newest), newest);
        }
        long horizon = orElse(st.maxTs, 0L);
        if (rule.usesEventTime && watermark > 0) {
            horizon = Math.min(horizon, watermark);
        }
        Velocity.evict(st, rule, horizon);
        if (rule.usesEventTime && st.maxTs != null) {
            st.expiry = st.maxTs + rule.windowMs + rule.watermarkDelayMs;
        }
        String kind = rule.emitToSink ? "detection" : "routed";
        for (Emit e : emits) {
            out.add(output(kind, rule, e.row, e, null));
        }
    }

    private static void correlation(RuleSpec rule, List<Ev> rows, SubState st, long watermark, List<Row> out,
                                    List<Follower> followers) {
        List<Ev> primaries = new ArrayList<>();
        List<Ev> contexts = new ArrayList<>();
        for (Ev r : rows) {
            if ("context".equals(r.role)) {
                contexts.add(r);
            } else if (!rule.warming && !r.warm) {
                // A warming rule fills its context and judges no primary yet.
                primaries.add(r);
            }
        }
        List<Emit> emits = Correlation.step(rule, st, primaries, contexts, watermark);
        Correlation.follow(st, followers, primaries, watermark);
        if (!rows.isEmpty()) {
            long first = (primaries.isEmpty() ? contexts : primaries).get(0).ts;
            long newest = Long.MIN_VALUE;
            for (Ev r : rows) {
                newest = Math.max(newest, r.ts);
            }
            st.maxTs = Math.max(orElse(st.maxTs, first), newest);
        }
        if (watermark > 0) {
            Correlation.evict(st, rule, watermark);
        }
        if (st.maxTs != null) {
            st.expiry = st.maxTs + rule.lookbackMs + rule.watermarkDelayMs;
        }
        for (Emit e : emits) {
            out.add(output("detection", rule, e.row, e, null));
        }
    }

    /** One OUTPUT_SCHEMA row. */
    private static Row output(String kind, RuleSpec rule, Ev row, Emit e, String reason) {
        return RowFactory.create(
                kind, rule.ruleId, rule.version, rule.ruleType, rule.name,
                row.topic, row.seq, row.ts, row.raw,
                rule.velocity ? rule.aggregationType : null,
                e == null ? null : e.aggValue,
                rule.velocity ? null : rule.metric,
                rule.emitContext,
                e == null ? null : e.ctxNum,
                e == null ? null : e.ctxJson,
                e == null ? null : e.metricValue,
                e == null ? null : e.ctxRecord,
                reason);
    }

    /**
     * Forget the sub-states whose expiry the watermark has reached (Spark's rule for
     * event-time timers: expiry <= watermark), then re-arm for the earliest left.
     */
    @Override
    public scala.collection.Iterator<Row> handleExpiredTimer(Row key, TimerValues timerValues,
                                                             ExpiredTimerInfo expiredTimerInfo) {
        long watermark = timerValues.getCurrentWatermarkInMs();
        Long earliest = null;
        // Per key with expired parts: its state and the rules whose parts expired.
        Map<String, Tuple2<KeyState, List<String>>> expired = new LinkedHashMap<>();
        scala.collection.Iterator<Tuple2<String, byte[]>> it = subs.iterator();
        while (it.hasNext()) {
            Tuple2<String, byte[]> kv = it.next();
            if (isChunk(kv._1())) {
                continue;
            }
            KeyState ks = KeyState.decode(kv._2());
            List<String> gone = new ArrayList<>();
            for (Map.Entry<String, byte[]> part : ks.parts.entrySet()) {
                Long expiry = SubState.header(part.getValue())[1];
                if (expiry != null && expiry <= watermark) {
                    gone.add(part.getKey());
                } else if (expiry != null && (earliest == null || expiry < earliest)) {
                    earliest = expiry;
                }
            }
            if (!gone.isEmpty()) {
                expired.put(kv._1(), new Tuple2<>(ks, gone));
            }
        }
        expired.forEach((k, e) -> {
            for (String ruleId : e._2()) {
                removePart(k, ruleId, e._1());
            }
            store(k, e._1());
        });
        // Spark deletes the fired timer after this returns; `earliest` > watermark >= it.
        if (earliest != null) {
            getHandle().registerTimer(earliest);
            timer.update(earliest);
        } else {
            timer.clear();
        }
        return CollectionConverters.asScala(new ArrayList<Row>().iterator());
    }
}
