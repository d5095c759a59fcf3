package ruleplatform.keyed;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import java.io.ByteArrayOutputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.api.Test;

/**
 * A sub-state's stored bytes are its checkpoint format: a job restarted on a checkpoint an
 * older build wrote reads its windows and buffers from them. The expected bytes are written
 * here from the layout (SubState's javadoc), field by field, with DataOutputStream, the
 * writer the format was first defined by; SubState must write exactly them and read them
 * back, over random states.
 */
class SubStateFormatTest {
    private static final String[] TEXTS = {"", "a", "\u00e9t\u00e9", "\u65e5\u672c", "x\u0000y", "{\"k\": [1, 2]}"};
    private static final double[] NUMS = {0.0, -0.0, 1.5, -3.25, 1e300, Double.MIN_VALUE, Double.NaN,
        Double.POSITIVE_INFINITY, Double.NEGATIVE_INFINITY, 42};

    @Test
    void randomStatesEncodeToTheLayoutAndReadBack() throws IOException {
        Random rnd = new Random(20261128L);
        for (int k = 0; k < 2000; k++) {
            SubState s = randomState(rnd, k % 7 != 0);
            byte[] expected = layout(s, true);
            assertArrayEquals(expected, s.encode(), "state " + k);
            assertSame(s, SubState.decode(expected), "state " + k);
        }
    }

    @Test
    void aStateWrittenBeforeTheSumWasKeptReadsWithoutOne() throws IOException {
        Random rnd = new Random(7L);
        for (int k = 0; k < 200; k++) {
            SubState s = randomState(rnd, false);
            SubState read = SubState.decode(layout(s, false));
            assertNull(read.sum);
            s.sum = null;
            assertSame(s, read, "state " + k);
        }
    }

    @Test
    void theHeaderIsTheNewestTimeAndTheExpiry() throws IOException {
        SubState s = randomState(new Random(3L), true);
        s.maxTs = 1_767_600_000_123L;
        s.expiry = null;
        Long[] header = SubState.header(layout(s, true));
        assertEquals(s.maxTs, header[0]);
        assertNull(header[1]);
    }

    private static SubState randomState(Random rnd, boolean withSum) {
        SubState s = new SubState();
        s.maxTs = rnd.nextBoolean() ? rnd.nextLong() : null;
        s.expiry = rnd.nextBoolean() ? rnd.nextLong() : null;
        s.signature = rnd.nextInt(5) == 0 ? null : pick(rnd, TEXTS) + rnd.nextInt(1000);
        int p = rnd.nextInt(3);
        s.prevAbove = p == 2 ? null : p == 1;
        int n = rnd.nextInt(70);
        s.ts = new long[n];
        long t = rnd.nextLong() >> 8;
        for (int i = 0; i < n; i++) {
            t += rnd.nextInt(2000);
            s.ts[i] = t;
        }
        if (rnd.nextBoolean()) {
            s.num = new double[n];
            for (int i = 0; i < n; i++) {
                s.num[i] = rnd.nextBoolean() ? NUMS[rnd.nextInt(NUMS.length)] : rnd.nextGaussian() * 1e6;
            }
        }
        if (rnd.nextInt(3) == 0) {
            s.jv = new String[n];
            for (int i = 0; i < n; i++) {
                s.jv[i] = rnd.nextInt(6) == 0 ? null : pick(rnd, TEXTS);
            }
        }
        s.context = rows(rnd);
        s.pending = rows(rnd);
        if (withSum && rnd.nextBoolean()) {
            BigDecimal sum = new BigDecimal(new BigInteger(rnd.nextInt(200) + 1, rnd), rnd.nextInt(80) - 20);
            s.sum = new Velocity.Saved(rnd.nextBoolean() ? sum : sum.negate(), rnd.nextInt(100), rnd.nextInt(3),
                rnd.nextInt(3));
            s.sumFrom = rnd.nextInt(n + 1);
        }
        if (withSum && rnd.nextInt(3) == 0) {
            for (int i = rnd.nextInt(5); i > 0; i--) {
                long first = rnd.nextLong() >> 8;
                s.sealed.add(new SubState.Chunk(rnd.nextInt(1000), 1 + rnd.nextInt(600), first, first + rnd.nextInt(9999)));
            }
        }
        return s;
    }

    private static List<Ev> rows(Random rnd) {
        List<Ev> out = new ArrayList<>();
        for (int i = rnd.nextInt(4) == 0 ? rnd.nextInt(60) : 0; i > 0; i--) {
            Double num = rnd.nextInt(4) == 0 ? null : (Double) NUMS[rnd.nextInt(NUMS.length)];
            // What is stored of a buffered row comes back: a missing raw or topic as "".
            out.add(new Ev(null, true, rnd.nextLong(), rnd.nextBoolean() ? rnd.nextLong() : null,
                pick(rnd, TEXTS), pick(rnd, TEXTS), num, rnd.nextBoolean() ? null : pick(rnd, TEXTS), null));
        }
        return out;
    }

    private static String pick(Random rnd, String[] xs) {
        return xs[rnd.nextInt(xs.length)];
    }

    /** The layout, written field by field; `withSum`: with the trailing sum (absent from older states). */
    private static byte[] layout(SubState s, boolean withSum) throws IOException {
        ByteArrayOutputStream bytes = new ByteArrayOutputStream();
        DataOutputStream o = new DataOutputStream(bytes);
        o.writeByte(1); // format
        optLong(o, s.maxTs);
        optLong(o, s.expiry);
        string(o, s.signature);
        o.writeByte(s.prevAbove == null ? 2 : s.prevAbove ? 1 : 0);
        window(o, s.ts, s.num, s.jv);
        for (List<Ev> rows : List.of(s.context, s.pending)) {
            o.writeInt(rows.size());
            for (Ev e : rows) {
                o.writeLong(e.ts);
                optLong(o, e.seq);
                o.writeBoolean(e.num != null);
                if (e.num != null) {
                    o.writeDouble(e.num);
                }
                string(o, e.jv);
                string(o, e.raw);
                string(o, e.topic);
            }
        }
        if (withSum) {
            o.writeBoolean(s.sum != null);
            if (s.sum != null) {
                byte[] unscaled = s.sum.sum.unscaledValue().toByteArray();
                o.writeInt(s.sumFrom);
                o.writeInt(s.sum.sum.scale());
                o.writeInt(unscaled.length);
                o.write(unscaled);
                o.writeInt(s.sum.values);
                o.writeInt(s.sum.posInf);
                o.writeInt(s.sum.negInf);
            }
            if (!s.sealed.isEmpty()) { // chunks came after the sum
                o.writeBoolean(true);
                o.writeInt(s.sealed.size());
                for (SubState.Chunk c : s.sealed) {
                    o.writeInt(c.id);
                    o.writeInt(c.n);
                    o.writeLong(c.firstTs);
                    o.writeLong(c.lastTs);
                }
            }
        }
        o.flush();
        return bytes.toByteArray();
    }

    /** A window's columns: the open part inside a sub-state, and a sealed chunk's whole entry. */
    private static void window(DataOutputStream o, long[] ts, double[] num, String[] jv) throws IOException {
        o.writeInt(ts.length);
        for (long t : ts) {
            o.writeLong(t);
        }
        o.writeBoolean(num != null);
        if (num != null) {
            for (double x : num) {
                o.writeLong(Double.doubleToRawLongBits(x));
            }
        }
        o.writeBoolean(jv != null);
        if (jv != null) {
            for (String x : jv) {
                string(o, x);
            }
        }
    }

    @Test
    void aSealedChunkIsItsColumnsLaidOutAsTheOpenPart() throws IOException {
        Random rnd = new Random(11L);
        for (int k = 0; k < 300; k++) {
            SubState s = randomState(rnd, false);
            SubState.Chunk c = new SubState.Chunk(k, s.ts.length, 0L, 0L);
            c.ts = s.ts;
            c.num = s.num;
            c.jv = s.jv;
            ByteArrayOutputStream bytes = new ByteArrayOutputStream();
            DataOutputStream o = new DataOutputStream(bytes);
            window(o, s.ts, s.num, s.jv);
            o.flush();
            assertArrayEquals(bytes.toByteArray(), c.encode(), "chunk " + k);
        }
    }

    private static void optLong(DataOutputStream o, Long v) throws IOException {
        o.writeBoolean(v != null);
        if (v != null) {
            o.writeLong(v);
        }
    }

    private static void string(DataOutputStream o, String s) throws IOException {
        if (s == null) {
            o.writeInt(-1);
            return;
        }
        byte[] u = s.getBytes(StandardCharsets.UTF_8);
        o.writeInt(u.length);
        o.write(u);
    }

    private static void assertSame(SubState want, SubState got, String what) {
        assertEquals(want.maxTs, got.maxTs, what);
        assertEquals(want.expiry, got.expiry, what);
        assertEquals(want.signature, got.signature, what);
        assertEquals(want.prevAbove, got.prevAbove, what);
        assertArrayEquals(want.ts, got.ts, what);
        if (want.num == null) {
            assertNull(got.num, what);
        } else {
            assertEquals(want.num.length, got.num.length, what);
            for (int i = 0; i < want.num.length; i++) {
                assertEquals(Double.doubleToRawLongBits(want.num[i]), Double.doubleToRawLongBits(got.num[i]), what);
            }
        }
        assertArrayEquals(want.jv, got.jv, what);
        rowsEqual(want.context, got.context, what);
        assertEquals(want.sealed.size(), got.sealed.size(), what);
        for (int i = 0; i < want.sealed.size(); i++) {
            SubState.Chunk a = want.sealed.get(i);
            SubState.Chunk b = got.sealed.get(i);
            assertArrayEquals(new long[] {a.id, a.n, a.firstTs, a.lastTs}, new long[] {b.id, b.n, b.firstTs, b.lastTs}, what);
        }
        rowsEqual(want.pending, got.pending, what);
        if (want.sum == null) {
            assertNull(got.sum, what);
        } else {
            assertEquals(want.sum.sum, got.sum.sum, what);
            assertEquals(want.sum.values, got.sum.values, what);
            assertEquals(want.sum.posInf, got.sum.posInf, what);
            assertEquals(want.sum.negInf, got.sum.negInf, what);
            assertEquals(want.sumFrom, got.sumFrom, what);
        }
    }

    private static void rowsEqual(List<Ev> want, List<Ev> got, String what) {
        assertEquals(want.size(), got.size(), what);
        for (int i = 0; i < want.size(); i++) {
            Ev a = want.get(i);
            Ev b = got.get(i);
            assertEquals(a.ts, b.ts, what);
            assertEquals(a.seq, b.seq, what);
            assertEquals(a.num, b.num, what);
            assertEquals(a.jv, b.jv, what);
            assertEquals(a.raw, b.raw, what);
            assertEquals(a.topic, b.topic, what);
        }
    }
}
