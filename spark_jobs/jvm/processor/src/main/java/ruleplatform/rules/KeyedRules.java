package ruleplatform.rules;

import com.fasterxml.jackson.databind.JsonNode;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.spark.types.variant.Variant;
import org.apache.spark.unsafe.types.VariantVal;

/**
 * The keyed rules of one rule-set version (velocity and correlation, one row per role a
 * rule plays: spark_jobs/engine/rule_set.py `keyed_spec`), and what they make of an
 * event: per key group (the rules grouping by one path) the key and the rule rows the
 * event enters, with each row's time, number and JSON text. The keyed operators
 * (ruleplatform.keyed.DetectionProcessor) read the rows by their index in this version,
 * so neither the plan nor the operators hold a rule: a keyed rule change is a new
 * version, as a threshold rule change is.
 *
 * What "enters" means is docs/rule-language.md's: the row's source (topic, and for a
 * routed row the velocity rule it follows) and conditions pass, the value it aggregates
 * is there (as a number where it needs one) and the key is there. A row enters without a
 * usable time too, with the reason (`issue`: a time too far ahead, or a missing or
 * unparseable one, `noTime`) that the operator and the backtest dead-letter it with.
 */
public final class KeyedRules {
    /** Which operator of the live chain judges a row: the first, or the second (correlation rules fed by a velocity rule). */
    public static final String FIRST = "first";
    public static final String SECOND = "second";
    /**
     * A warm-up record's `routeFrom`: WARM, the live rule id, NUL, the digest of its state
     * signature (stateDigest). Such a record is an archived event replayed into that one
     * rule's state (spark_jobs/streaming/warmup.py): it enters no other rule, and only as
     * state (Member.warm).
     */
    public static final char WARM = '\u0002';

    /** One keyed rule row. */
    public static final class Row {
        public final int index;
        public final String stage;
        public final String role;
        public final boolean eventTime;
        /** The rule as the operator reads it (jvm_operator.py `rule_spec`). */
        public final JsonNode rule;
        final String ruleId;
        final Condition[] conditions;
        final String gid;
        final String[] key; // null: one global key ("")
        final String[] ts; // null: processing time
        final String[] val;
        final String valText;
        final String valNeed; // num | json | none
        final boolean keepJson;
        final String noTime;
        /** The digest of the rule's state signature: what a warm-up record names. */
        final String stateDigest;
        /** A correlation rule's primaries are not warmed: only its context is state. */
        final boolean warmable;

        Row(int index, JsonNode n) {
            this.index = index;
            stage = n.get("stage").asText();
            role = n.get("role").asText();
            eventTime = n.get("event_time").asBoolean();
            rule = n.get("rule");
            ruleId = rule.get("rule_id").asText();
            conditions = Condition.all(n.get("conditions"));
            gid = n.get("gid").asText();
            key = Value.path(n.get("key"));
            ts = Value.path(n.get("ts"));
            val = Value.path(n.get("val"));
            valText = n.path("val_text").asText(null);
            valNeed = n.get("val_need").asText();
            keepJson = n.get("keep_json").asBoolean();
            noTime = noTime(rule.get("rule_type").asText(), rule.get("uses_event_time").asBoolean(),
                rule.path("timestamp_field").asText(null));
            stateDigest = stateDigest(rule.get("signature").asText());
            warmable = "velocity".equals(rule.get("rule_type").asText()) || "context".equals(role);
        }
    }

    /**
     * The dead-letter reason of a row without a usable time: the one definition, which the
     * live operator (DetectionProcessor) and the backtest (engine/keyed.py) both report.
     */
    public static String noTime(String ruleType, boolean usesEventTime, String timestampField) {
        String what = usesEventTime ? "timestamp field '" + timestampField + "'" : "processing time";
        return "missing or unparseable " + what + " needed by " + ruleType + " rule";
    }

    /**
     * The stored form of a state signature (spark_jobs/engine/rule_set.py `signature`):
     * the first 16 bytes of its UTF-8 text's SHA-256, base64url without padding.
     */
    public static String stateDigest(String signature) {
        try {
            byte[] sha = MessageDigest.getInstance("SHA-256").digest(signature.getBytes(StandardCharsets.UTF_8));
            return Base64.getUrlEncoder().withoutPadding().encodeToString(Arrays.copyOf(sha, 16));
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("every Java platform has SHA-256", e);
        }
    }

    /** An entered row: the row's index in the version, and what it reads of the event. */
    public static final class Member {
        public final int index;
        public final Long ts;
        /** Why the row has no usable time (null: `ts` is usable). */
        public final String issue;
        public final Double num;
        public final String json;
        /** A warm-up row: it fills the rule's state and is never judged (no emit, never late). */
        public final boolean warm;

        Member(int index, Long ts, String issue, Double num, String json, boolean warm) {
            this.index = index;
            this.ts = ts;
            this.issue = issue;
            this.num = num;
            this.json = json;
            this.warm = warm;
        }
    }

    /** One key group the event enters: its id (the key's path), the key's JSON text, the newest usable event time of its event-time rows. */
    public static final class Group {
        public final String gid;
        public final String key;
        public final Long wm;
        public final List<Member> members;

        Group(String gid, String key, Long wm, List<Member> members) {
            this.gid = gid;
            this.key = key;
            this.wm = wm;
            this.members = members;
        }
    }

    /** What the keyed rules make of one event. */
    public static final class Judged {
        public final List<Group> groups;
        /** `rule id` US `reason` per row that only a value it cannot read kept the event from (RuleSet.UNREAD_SEP). */
        public final List<String> unreadable;
        /** The event is context for a correlation rule of the second operator: the first hands it on. */
        public final boolean context;

        Judged(List<Group> groups, List<String> unreadable, boolean context) {
            this.groups = groups;
            this.unreadable = unreadable;
            this.context = context;
        }
    }

    private static final Judged NONE = new Judged(List.of(), List.of(), false);

    private final Row[] rows;
    /** Rows by stage NUL topic NUL route_from: indexed as the threshold rules are. */
    private final Map<String, RuleSet.Topic> sources;
    /** The topics whose events the second operator's correlation rules read as context. */
    private final Set<String> contextTopics = new HashSet<>();

    KeyedRules(JsonNode spec) {
        rows = new Row[spec.size()];
        Map<String, List<RuleSet.Rule>> bySource = new HashMap<>();
        for (int i = 0; i < rows.length; i++) {
            Row r = new Row(i, spec.get(i));
            rows[i] = r;
            JsonNode from = spec.get(i).get("route_from");
            String routeFrom = from == null || from.isNull() ? null : from.asText();
            String topic = spec.get(i).get("topic").asText();
            bySource.computeIfAbsent(source(r.stage, topic, routeFrom), x -> new ArrayList<>())
                .add(new RuleSet.Rule(i, r.ruleId, r.conditions));
            if (SECOND.equals(r.stage) && "context".equals(r.role) && routeFrom == null) {
                contextTopics.add(topic);
            }
        }
        sources = RuleSet.indexed(bySource);
    }

    private static String source(String stage, String topic, String routeFrom) {
        return stage + '\u0000' + topic + '\u0000' + (routeFrom == null ? "" : routeFrom);
    }

    public int size() {
        return rows.length;
    }

    public Row row(int index) {
        return rows[index];
    }

    /**
     * The rows of `stage` whose source is (`topic`, `routeFrom`) judged on event `v`
     * (`procMs`: its broker time, or NULL where the record has none: the row enters
     * without a time, as an event-time row without one does; an event time more than
     * `maxAheadMs` after it is unusable, unless `maxAheadMs` is negative: a backtest
     * replays recorded events and holds every one).
     */
    public Judged judge(String stage, String topic, String routeFrom, VariantVal v, Long procMs, long maxAheadMs) {
        if (v == null || topic == null) {
            return NONE;
        }
        // A warm-up record: the archived event, for the one rule (and state) it names.
        String warmRule = null;
        String warmDigest = null;
        if (routeFrom != null && !routeFrom.isEmpty() && routeFrom.charAt(0) == WARM) {
            int sep = routeFrom.indexOf('\u0000');
            if (sep < 0) {
                return NONE;
            }
            warmRule = routeFrom.substring(1, sep);
            warmDigest = routeFrom.substring(sep + 1);
            routeFrom = null;
        }
        boolean warm = warmRule != null;
        boolean context = !warm && FIRST.equals(stage) && contextTopics.contains(topic);
        RuleSet.Topic t = sources.get(source(stage, topic, routeFrom));
        if (t == null) {
            return context ? new Judged(List.of(), List.of(), true) : NONE;
        }
        RuleSet.Event e = new RuleSet.Event(new Variant(v.getValue(), v.getMetadata()));
        List<RuleSet.Rule> tested = t.candidates(e);
        List<String> blockedBy = new ArrayList<>();
        List<String> notNumber = new ArrayList<>();
        Map<String, List<Member>> byGroup = new LinkedHashMap<>();
        Map<String, Long> newest = new HashMap<>();
        for (RuleSet.Rule candidate : tested) {
            Row r = rows[candidate.index];
            if (warm && !(r.warmable && r.ruleId.equals(warmRule) && r.stateDigest.equals(warmDigest))) {
                continue;
            }
            if (!e.passes(r.conditions)) {
                String path = e.blockedBy(r.conditions);
                if (path != null) {
                    blockedBy.add(r.ruleId + RuleSet.UNREAD_SEP + "value at " + path + " is not a number");
                }
                continue;
            }
            Value x = r.val == null ? Value.MISSING : e.value(r.val);
            Double num = r.val == null ? null : x.number();
            if ("num".equals(r.valNeed) && r.val != null && x.present() && num == null) {
                notNumber.add(r.ruleId + RuleSet.UNREAD_SEP + "value at " + r.valText + " is not a number");
            }
            boolean valueThere = "num".equals(r.valNeed) ? r.val == null || num != null
                : !"json".equals(r.valNeed) || r.val == null || x.present();
            Long ts = r.eventTime ? (r.ts == null ? null : e.value(r.ts).timeMs()) : procMs;
            String issue = ts == null ? r.noTime : null;
            if (r.eventTime && ts != null && procMs != null && maxAheadMs >= 0 && ts > procMs + maxAheadMs) {
                issue = "event time more than " + maxAheadMs + " ms ahead of the record's broker timestamp";
            }
            if (!valueThere) {
                continue;
            }
            byGroup.computeIfAbsent(r.gid, g -> new ArrayList<>())
                .add(new Member(r.index, ts, issue, num, r.keepJson && r.val != null ? x.json() : null, warm));
            if (r.eventTime && issue == null && !warm) {
                newest.merge(r.gid, ts, Math::max);
            }
        }
        List<Group> groups = new ArrayList<>(byGroup.size());
        for (Map.Entry<String, List<Member>> g : byGroup.entrySet()) {
            Row first = rows[g.getValue().get(0).index];
            String key = first.key == null ? "" : e.value(first.key).json();
            if (key != null) {
                groups.add(new Group(g.getKey(), key, newest.get(g.getKey()), g.getValue()));
            }
        }
        if (warm) {
            // Counted when the event was judged live; a warm-up only fills state.
            return new Judged(groups, List.of(), false);
        }
        blockedBy.addAll(notNumber);
        return new Judged(groups, blockedBy, context);
    }
}
