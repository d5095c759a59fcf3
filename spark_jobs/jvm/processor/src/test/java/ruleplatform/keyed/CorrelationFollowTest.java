package ruleplatform.keyed;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.api.Test;

/**
 * A correlation shadow judged on the context of the version in force (Follower,
 * Correlation.follow) detects what it detects judged alone on a context buffer of its
 * own, batch after batch (random contexts and primaries, out of order, a moving
 * watermark), and keeps no context of its own.
 */
class CorrelationFollowTest {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final String SIG = "{\"context_topic\": \"context.raw\", \"correlation_key\": \"acct\"}";
    private static final long LOOKBACK = 60_000L;

    private static RuleSpec rule(String id, String resolution, String metric, String op, double value, int minPoints) {
        ObjectNode n = JSON.createObjectNode();
        n.put("rule_id", id).put("version", "1").put("rule_type", "correlation").put("signature", SIG)
            .put("uses_event_time", true).put("window_ms", LOOKBACK).put("watermark_delay_ms", 5_000)
            .put("lookback_ms", LOOKBACK).put("context_resolution", resolution).put("min_context_points", minPoints)
            .put("metric", metric).put("emit_context", true).put("cond_op", op).put("cond_kind", "num")
            .put("cond_num", value);
        return new RuleSpec(n);
    }

    private static Ev ev(String role, long ts, long seq, double num) {
        return new Ev(role, true, ts, seq, "t", "{\"n\": " + seq + "}", num, Double.toString(num), null);
    }

    private static String describe(List<Emit> emits) {
        StringBuilder b = new StringBuilder();
        for (Emit e : emits) {
            b.append(e.row.seq).append(':').append(e.metricValue).append(':').append(e.ctxRecord).append(' ');
        }
        return b.toString();
    }

    @Test
    void aFollowerDetectsWhatItDetectsAloneAndHoldsNoContext() {
        RuleSpec inForce = rule("r", "last", "difference", ">", 0.0, 1);
        RuleSpec[] shadows = {
            rule("r@shadow", "last", "difference", ">", -20.0, 1),
            rule("r@shadow", "mean", "difference", ">", 5.0, 2),
            rule("r@shadow", "last", "direct", "<", 50.0, 1),
        };
        Random rnd = new Random(20261202L);
        int compared = 0;
        for (RuleSpec shadow : shadows) {
            for (int run = 0; run < 50; run++) {
                SubState base = new SubState();
                SubState alone = new SubState();
                SubState own = new SubState();
                long watermark = 0L;
                long seq = 0L;
                long now = 1_000_000L;
                for (int batch = 0; batch < 12; batch++) {
                    List<Ev> primaries = new ArrayList<>();
                    List<Ev> contexts = new ArrayList<>();
                    for (int i = rnd.nextInt(6); i > 0; i--) {
                        long ts = now + rnd.nextInt(20_000) - 10_000;
                        Ev e = ev(rnd.nextBoolean() ? "context" : "primary", ts, seq++, rnd.nextInt(120));
                        if (ts >= watermark) {
                            (e.role.equals("context") ? contexts : primaries).add(e);
                        }
                    }
                    List<Emit> expected = Correlation.step(shadow, alone, primaries, contexts, watermark);
                    Correlation.evict(alone, shadow, watermark);

                    Follower f = new Follower(shadow, own);
                    Correlation.step(inForce, base, primaries, contexts, watermark);
                    Correlation.follow(base, List.of(f), primaries, watermark);
                    Correlation.evict(base, inForce, watermark);

                    assertEquals(describe(expected), describe(f.emits), "run " + run + ", batch " + batch);
                    assertTrue(own.context.isEmpty(), "a follower holds no context");
                    assertEquals(alone.pending.size(), own.pending.size(), "held primaries");
                    compared += expected.size();
                    now += rnd.nextInt(30_000);
                    watermark = Math.max(watermark, now - 15_000);
                }
            }
        }
        assertFalse(compared == 0, "no detection was compared");
    }
}
