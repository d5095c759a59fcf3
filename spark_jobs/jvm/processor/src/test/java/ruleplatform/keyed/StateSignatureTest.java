package ruleplatform.keyed;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.junit.jupiter.api.Test;

/**
 * A sub-state stores its rule's state signature as a digest (RuleSpec.digest): the first
 * 16 bytes of the signature text's SHA-256, base64url without padding. The expected
 * digest is the published SHA-256 test vector of "abc" (FIPS 180-2, ba7816bf 8f01cfea
 * 414140de 5dae2223 ...), base64url-encoded by hand. A state written before the digest
 * holds the signature's JSON text and must still count as the same rule's.
 */
class StateSignatureTest {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final String SIG = "{\"conditions\": [], \"group_by\": \"user_id\", \"source_topic\": \"events.raw\"}";

    private static RuleSpec rule(String signature) {
        ObjectNode n = JSON.createObjectNode();
        n.put("rule_id", "r").put("version", "1").put("rule_type", "velocity").put("signature", signature)
            .put("uses_event_time", true).put("window_ms", 1000).put("watermark_delay_ms", 0)
            .put("aggregation_type", "count").put("threshold", 2.0);
        return new RuleSpec(n);
    }

    @Test
    void theDigestIsTheFirstSixteenBytesOfSha256InBase64Url() {
        assertEquals("ungWv48Bz-pBQUDeXa4iIw", RuleSpec.digest("abc"));
        assertEquals(22, rule(SIG).signature.length());
    }

    @Test
    void aDigestOrTheTextWrittenBeforeItIsTheSameState() {
        RuleSpec r = rule(SIG);
        assertTrue(r.sameState(r.signature), "a state written with the digest");
        assertTrue(r.sameState(SIG), "a state written before the digest, with the signature's text");
        assertFalse(r.sameState(SIG.replace("user_id", "merchant")), "another signature's text");
        assertFalse(r.sameState(rule(SIG.replace("user_id", "merchant")).signature), "another signature's digest");
    }
}
