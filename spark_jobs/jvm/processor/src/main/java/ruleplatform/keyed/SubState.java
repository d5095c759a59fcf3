package ruleplatform.keyed;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * One (key, rule) sub-state: signature, last crossing
 * flag, newest event time, expiry, the velocity window (columns sorted by time; values
 * only where the aggregation reads them) or the correlation buffers (context, held
 * primaries). Stored as the value of a MapState entry keyed by key + NUL + rule id, in a
 * compact binary form of its own (maxTs and expiry first, so the idle sweep and the
 * expiry timer read them without decoding the rest).
 */
final class SubState {
    Long maxTs;
    Long expiry;
    String signature;
    Boolean prevAbove;
    // velocity window, ascending ts (equal times in arrival order)
    long[] ts = new long[0];
    double[] num; // NaN: no value (sum, avg, min, max)
    String[] jv; // distinct_count
    /** A sum or avg window's exact state over [sumFrom, end) of the window (Velocity.Saved); null: none kept. */
    Velocity.Saved sum;
    int sumFrom;
    // correlation
    List<Ev> context = new ArrayList<>();
    List<Ev> pending = new ArrayList<>();

    private static final int FORMAT = 1;

    byte[] encode() {
        Out o = new Out(64 + ts.length * 16);
        o.room(1).put((byte) FORMAT);
        writeLong(o, maxTs);
        writeLong(o, expiry);
        writeString(o, signature);
        o.room(5).put((byte) (prevAbove == null ? 2 : prevAbove ? 1 : 0)).putInt(ts.length);
        // The window is most of a sub-state, and a touched key's whole window is written
        // at every batch: one buffer, no stream calls per byte. The bytes are those
        // DataOutputStream writes (big-endian), but for the window's values, whose bits
        // are written as they are (a NaN's too).
        ByteBuffer b = o.room(ts.length * 8 + 1);
        for (long t : ts) {
            b.putLong(t);
        }
        b.put((byte) (num != null ? 1 : 0));
        if (num != null) {
            b = o.room(ts.length * 8);
            for (int i = 0; i < ts.length; i++) {
                b.putDouble(num[i]);
            }
        }
        o.room(1).put((byte) (jv != null ? 1 : 0));
        if (jv != null) {
            for (String x : jv) {
                writeString(o, x);
            }
        }
        writeRows(o, context);
        writeRows(o, pending);
        // Last, so the bytes before it are those of a state written without it.
        o.room(1).put((byte) (sum != null ? 1 : 0));
        if (sum != null) {
            byte[] unscaled = sum.sum.unscaledValue().toByteArray();
            o.room(24 + unscaled.length).putInt(sumFrom).putInt(sum.sum.scale()).putInt(unscaled.length).put(unscaled)
                .putInt(sum.values).putInt(sum.posInf).putInt(sum.negInf);
        }
        return o.bytes();
    }

    static SubState decode(byte[] bytes) {
        ByteBuffer in = ByteBuffer.wrap(bytes);
        SubState s = new SubState();
        in.get();
        s.maxTs = readLong(in);
        s.expiry = readLong(in);
        s.signature = readString(in);
        byte p = in.get();
        s.prevAbove = p == 2 ? null : p == 1;
        int n = in.getInt();
        s.ts = new long[n];
        for (int i = 0; i < n; i++) {
            s.ts[i] = in.getLong();
        }
        if (in.get() != 0) {
            s.num = new double[n];
            for (int i = 0; i < n; i++) {
                s.num[i] = in.getDouble();
            }
        }
        if (in.get() != 0) {
            s.jv = new String[n];
            for (int i = 0; i < n; i++) {
                s.jv[i] = readString(in);
            }
        }
        s.context = readRows(in);
        s.pending = readRows(in);
        // A state written before the sum was kept ends here: its sum is computed afresh.
        if (in.hasRemaining() && in.get() != 0) {
            s.sumFrom = in.getInt();
            int scale = in.getInt();
            byte[] unscaled = new byte[in.getInt()];
            in.get(unscaled);
            s.sum = new Velocity.Saved(new java.math.BigDecimal(new java.math.BigInteger(unscaled), scale),
                in.getInt(), in.getInt(), in.getInt());
        }
        return s;
    }

    /** Only the newest event time and the expiry (the first fields). */
    static Long[] header(byte[] b) {
        ByteBuffer in = ByteBuffer.wrap(b);
        in.get();
        return new Long[] {readLong(in), readLong(in)};
    }

    /** A growing big-endian buffer: `room(n)` is the buffer with n bytes free at its position. */
    private static final class Out {
        private ByteBuffer b;

        Out(int capacity) {
            b = ByteBuffer.allocate(capacity);
        }

        ByteBuffer room(int n) {
            if (b.remaining() < n) {
                ByteBuffer grown = ByteBuffer.allocate(Math.max(b.capacity() * 2, b.position() + n));
                grown.put(b.array(), 0, b.position());
                b = grown;
            }
            return b;
        }

        byte[] bytes() {
            return Arrays.copyOf(b.array(), b.position());
        }
    }

    private static void writeLong(Out o, Long v) {
        ByteBuffer b = o.room(9).put((byte) (v != null ? 1 : 0));
        if (v != null) {
            b.putLong(v);
        }
    }

    private static Long readLong(ByteBuffer in) {
        return in.get() != 0 ? in.getLong() : null;
    }

    private static void writeString(Out o, String s) {
        if (s == null) {
            o.room(4).putInt(-1);
            return;
        }
        byte[] u = s.getBytes(StandardCharsets.UTF_8);
        o.room(4 + u.length).putInt(u.length).put(u);
    }

    private static String readString(ByteBuffer in) {
        int n = in.getInt();
        if (n < 0) {
            return null;
        }
        String s = new String(in.array(), in.arrayOffset() + in.position(), n, StandardCharsets.UTF_8);
        in.position(in.position() + n);
        return s;
    }

    /**
     * Buffered correlation rows: a missing raw or topic is
     * stored as "" (so it comes back as ""), num and jv keep their nulls.
     */
    private static void writeRows(Out o, List<Ev> rows) {
        o.room(4).putInt(rows.size());
        for (Ev e : rows) {
            o.room(8).putLong(e.ts);
            writeLong(o, e.seq);
            ByteBuffer b = o.room(9).put((byte) (e.num != null ? 1 : 0));
            if (e.num != null) {
                b.putLong(Double.doubleToLongBits(e.num)); // DataOutputStream.writeDouble's bits
            }
            writeString(o, e.jv);
            writeString(o, e.raw == null ? "" : e.raw);
            writeString(o, e.topic == null ? "" : e.topic);
        }
    }

    private static List<Ev> readRows(ByteBuffer in) {
        int n = in.getInt();
        List<Ev> rows = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            long t = in.getLong();
            Long seq = readLong(in);
            Double num = in.get() != 0 ? in.getDouble() : null;
            String jv = readString(in);
            String raw = readString(in);
            String topic = readString(in);
            rows.add(new Ev(null, true, t, seq, topic, raw, num, jv, null));
        }
        return rows;
    }
}
