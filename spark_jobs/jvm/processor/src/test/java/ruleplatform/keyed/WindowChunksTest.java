package ruleplatform.keyed;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import org.junit.jupiter.api.Test;

/**
 * A window kept in sealed chunks judges every row as the same window kept whole: the
 * operator's path for a long window against its path for a short one, batch after batch,
 * each state stored and read back between batches as the job does, with rows in order,
 * a little out of order, far out of order and after gaps that empty the window. And the
 * point of the chunks: an in-order batch of a count window reads only the chunks its
 * window's start passes, and stored chunks are exactly those the state lists.
 */
class WindowChunksTest {
    private static final String[] KINDS = {"count", "sum", "avg", "min", "max", "distinct_count"};
    private static final ObjectMapper JSON = new ObjectMapper();

    /** A sub-state stored as the operator stores it: its own bytes and its chunks by id. */
    private static final class Stored {
        int chunkSize;
        byte[] bytes;
        final Map<Integer, byte[]> chunks = new HashMap<>();
        int reads;

        Stored(int chunkSize) {
            this.chunkSize = chunkSize;
        }

        SubState read() {
            SubState st = bytes == null ? new SubState() : SubState.decode(bytes);
            st.chunkSize = chunkSize;
            st.store = id -> {
                reads++;
                return chunks.get(id);
            };
            return st;
        }

        void write(SubState st) {
            for (int id : st.dropped) {
                chunks.remove(id);
            }
            for (SubState.Chunk c : st.written.values()) {
                chunks.put(c.id, c.encode());
            }
            bytes = st.encode();
            List<Integer> listed = new ArrayList<>();
            for (SubState.Chunk c : st.sealed) {
                listed.add(c.id);
            }
            assertEquals(new java.util.TreeSet<>(listed), new java.util.TreeSet<>(chunks.keySet()),
                "the stored chunks are the ones the state lists");
        }
    }

    private static RuleSpec rule(String kind, long windowMs, double threshold, boolean allEvents) {
        ObjectNode n = JSON.createObjectNode();
        n.put("rule_id", "r").put("version", "1").put("rule_type", "velocity").put("signature", "s")
            .put("uses_event_time", true).put("window_ms", windowMs).put("watermark_delay_ms", 0)
            .put("aggregation_type", kind).put("threshold", threshold)
            .put("emit_mode", allEvents ? "all_events" : "last_event");
        return new RuleSpec(n);
    }

    private static long[] ts(SubState st) {
        SubState.Column col = st.column();
        long[] out = new long[col.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = col.ts(i);
        }
        return out;
    }

    @Test
    void aChunkedWindowJudgesAsAWholeOne() {
        Random rnd = new Random(20261128L);
        for (int run = 0; run < 300; run++) {
            String kind = KINDS[rnd.nextInt(KINDS.length)];
            long window = 50 + rnd.nextInt(400);
            double threshold = "distinct_count".equals(kind) ? 2 + rnd.nextInt(4)
                : "count".equals(kind) ? 3 + rnd.nextInt(30) : rnd.nextInt(300);
            RuleSpec rule = rule(kind, window, threshold, rnd.nextBoolean());
            Stored whole = new Stored(Integer.MAX_VALUE / 4);
            Stored chunked = new Stored(1 + rnd.nextInt(6));
            boolean varying = rnd.nextBoolean(); // chunks of several sizes in one window
            long clock = 1_000_000L;
            long seq = 0;
            for (int batch = 0; batch < 40; batch++) {
                int mode = rnd.nextInt(10);
                clock += mode == 0 ? window * 3 : rnd.nextInt(40); // 0: a gap that empties the window
                List<Ev> rows = new ArrayList<>();
                for (int i = rnd.nextInt(25); i > 0; i--) {
                    long spread = mode == 1 ? window * 2 : mode < 4 ? 30 : 0; // far / a little out of order
                    long t = clock + rnd.nextInt(20) - (spread == 0 ? 0 : rnd.nextInt((int) spread));
                    Double num = rnd.nextInt(8) == 0 ? null : (double) (rnd.nextInt(200) - 20);
                    String jv = rnd.nextInt(6) == 0 ? null : "m" + rnd.nextInt(5);
                    rows.add(new Ev("primary", true, t, seq++, "t", "{}", num, jv, null));
                }
                rows.sort(Ev::byTsSeq);
                long horizon = clock - rnd.nextInt(60);
                String what = "run " + run + " batch " + batch + " " + kind;
                if (varying) {
                    chunked.chunkSize = 1 + rnd.nextInt(8);
                }
                SubState a = whole.read();
                SubState b = chunked.read();
                List<Emit> ea;
                try {
                    ea = Velocity.step(rule, a, rows);
                } catch (EvaluationError e) {
                    // min/max/avg of a window without values: both must fail alike
                    SubState b2 = b;
                    EvaluationError eb = org.junit.jupiter.api.Assertions.assertThrows(EvaluationError.class,
                        () -> Velocity.step(rule, b2, rows), what);
                    assertEquals(e.getMessage(), eb.getMessage(), what);
                    continue;
                }
                List<Emit> eb = Velocity.step(rule, b, rows);
                assertEquals(ea.size(), eb.size(), what);
                for (int i = 0; i < ea.size(); i++) {
                    assertTrue(ea.get(i).row == eb.get(i).row, what);
                    assertEquals(Double.doubleToLongBits(ea.get(i).aggValue),
                        Double.doubleToLongBits(eb.get(i).aggValue), what);
                }
                Velocity.evict(a, rule, horizon);
                Velocity.evict(b, rule, horizon);
                assertArrayEquals(ts(a), ts(b), what);
                SubState.Column ca = a.column();
                SubState.Column cb = b.column();
                for (int i = 0; i < ca.size(); i++) {
                    assertEquals(Double.doubleToLongBits(ca.num(i)), Double.doubleToLongBits(cb.num(i)), what);
                    assertEquals(ca.jv(i), cb.jv(i), what);
                }
                assertEquals(a.prevAbove, b.prevAbove, what);
                whole.write(a);
                chunked.write(b);
                assertTrue(whole.chunks.isEmpty(), what);
            }
        }
    }

    @Test
    void anInOrderBatchReadsOnlyTheChunksTheWindowsStartPasses() {
        RuleSpec rule = rule("count", 10_000, 1e9, false);
        Stored stored = new Stored(64);
        long seq = 0;
        int batches = 200;
        for (int batch = 0; batch < batches; batch++) {
            List<Ev> rows = new ArrayList<>();
            for (int i = 0; i < 100; i++) { // 100 events a batch, one every 10 ms
                long t = 1_000_000L + (batch * 100L + i) * 10;
                rows.add(new Ev("primary", true, t, seq++, "t", "{}", null, null, null));
            }
            SubState st = stored.read();
            stored.reads = 0;
            Velocity.step(rule, st, rows);
            // Eviction lags by half a window, as behind an event-time watermark.
            Velocity.evict(st, rule, rows.get(rows.size() - 1).ts - 5_000);
            stored.write(st);
            // 1,500 events kept (23 chunks of 64), 1,000 in the newest row's window; 100
            // leave a batch (up to 3 chunks, the first found by its times) and 100 are
            // evicted (whole chunks unread, one trimmed): at most 4 chunks read.
            assertTrue(stored.reads <= 4, "batch " + batch + " read " + stored.reads + " chunks");
            if (batch > 30) {
                assertEquals(1500, st.size(), "batch " + batch);
                assertTrue(st.sealed.size() >= 20, "batch " + batch + ": " + st.sealed.size() + " chunks");
            }
        }
    }
}
