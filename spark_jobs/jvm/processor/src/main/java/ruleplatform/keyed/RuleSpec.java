package ruleplatform.keyed;

import com.fasterxml.jackson.databind.JsonNode;
import ruleplatform.rules.KeyedRules;

/**
 * One keyed rule as the operator needs it, read once from the spec the job builds
 * (jvm_operator.py `operator_spec`): the model's own derived values (window_ms,
 * lookback_ms, the watermark delay in ms, the state signature), so the JVM never
 * re-derives what spark_jobs/rules/model.py defines.
 */
final class RuleSpec {
    final String ruleId;
    final String version;
    final String ruleType; // velocity | correlation
    final String name;
    /**
     * A digest of the model's state signature (spark_jobs/engine/rule_set.py `signature`):
     * a change resets the window and buffers. Every sub-state of every key stores it, so
     * it is 22 characters, not the signature's few hundred.
     */
    final String signature;
    final boolean velocity;
    final boolean usesEventTime;
    final long windowMs;
    final long watermarkDelayMs; // int(rule.watermark_delay * 1000)
    // velocity
    final String aggregationType;
    final double threshold;
    final boolean allEvents;
    final boolean emitToSink;
    /**
     * The rule's windows are being filled from the archive (spark_jobs/streaming/warmup.py):
     * its rows enter its state but it emits nothing until the warm-up is in. Not part of
     * the signature: the state carries over when the warm-up ends.
     */
    final boolean warming;
    // correlation
    final long lookbackMs;
    /** The velocity rule whose emits are the primaries (velocity_filter_rule_id), or null. */
    final String routedFrom;
    final boolean lastResolution;
    final boolean meanStd;
    final int minContextPoints;
    final String metric;
    final Boolean emitContext;
    final String condOp;
    final String condKind; // num | bool | str (conditions.value_spec)
    final double condNum;
    final boolean condBool;
    final String condStr;

    RuleSpec(JsonNode n) {
        ruleId = n.get("rule_id").asText();
        version = n.get("version").asText();
        ruleType = n.get("rule_type").asText();
        name = text(n, "name");
        signature = digest(n.get("signature").asText());
        velocity = "velocity".equals(ruleType);
        usesEventTime = n.get("uses_event_time").asBoolean();
        windowMs = n.get("window_ms").asLong();
        watermarkDelayMs = n.get("watermark_delay_ms").asLong();
        aggregationType = text(n, "aggregation_type");
        threshold = n.path("threshold").asDouble();
        allEvents = "all_events".equals(text(n, "emit_mode"));
        emitToSink = n.path("emit_to_sink").asBoolean(true);
        warming = n.path("warming").asBoolean(false);
        lookbackMs = n.path("lookback_ms").asLong();
        routedFrom = text(n, "velocity_filter_rule_id");
        lastResolution = "last".equals(text(n, "context_resolution"));
        meanStd = "mean_std".equals(text(n, "context_resolution"));
        minContextPoints = n.path("min_context_points").asInt(1);
        metric = text(n, "metric");
        emitContext = velocity ? null : n.get("emit_context").asBoolean();
        condOp = text(n, "cond_op");
        condKind = text(n, "cond_kind");
        condNum = n.path("cond_num").asDouble();
        condBool = n.path("cond_bool").asBoolean();
        condStr = text(n, "cond_str");
    }

    /**
     * The stored form of a state signature: the first 16 bytes of its UTF-8 text's
     * SHA-256, base64url without padding. A sub-state written before the digest holds
     * the text itself (a JSON object, so it starts with '{'): sameState digests it.
     */
    static String digest(String signature) {
        return KeyedRules.stateDigest(signature);
    }

    /** Whether a stored sub-state's signature (a digest, or older state's text) is this rule's. */
    boolean sameState(String stored) {
        return signature.equals(stored.startsWith("{") ? digest(stored) : stored);
    }

    private static String text(JsonNode n, String field) {
        JsonNode v = n.get(field);
        return v == null || v.isNull() ? null : v.asText();
    }
}
