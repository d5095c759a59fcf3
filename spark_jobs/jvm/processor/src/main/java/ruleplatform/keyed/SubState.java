package ruleplatform.keyed;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
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
        try {
            ByteArrayOutputStream bytes = new ByteArrayOutputStream(64 + ts.length * 16);
            DataOutputStream o = new DataOutputStream(bytes);
            o.writeByte(FORMAT);
            writeLong(o, maxTs);
            writeLong(o, expiry);
            writeString(o, signature);
            o.writeByte(prevAbove == null ? 2 : prevAbove ? 1 : 0);
            o.writeInt(ts.length);
            // Whole arrays at once (the window is most of a sub-state, and a touched key's
            // whole window is written at every batch); the same big-endian bytes as
            // DataOutputStream's writeLong and writeDouble (a NaN's bits as they are).
            ByteBuffer times = ByteBuffer.allocate(ts.length * 8);
            times.asLongBuffer().put(ts);
            o.write(times.array());
            o.writeBoolean(num != null);
            if (num != null) {
                ByteBuffer values = ByteBuffer.allocate(ts.length * 8);
                values.asDoubleBuffer().put(num, 0, ts.length);
                o.write(values.array());
            }
            o.writeBoolean(jv != null);
            if (jv != null) {
                for (String s : jv) {
                    writeString(o, s);
                }
            }
            writeRows(o, context);
            writeRows(o, pending);
            // Last, so the bytes before it are those of a state written without it.
            o.writeBoolean(sum != null);
            if (sum != null) {
                o.writeInt(sumFrom);
                o.writeInt(sum.sum.scale());
                byte[] unscaled = sum.sum.unscaledValue().toByteArray();
                o.writeInt(unscaled.length);
                o.write(unscaled);
                o.writeInt(sum.values);
                o.writeInt(sum.posInf);
                o.writeInt(sum.negInf);
            }
            o.flush();
            return bytes.toByteArray();
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    static SubState decode(byte[] b) {
        try {
            DataInputStream in = new DataInputStream(new ByteArrayInputStream(b));
            SubState s = new SubState();
            in.readByte();
            s.maxTs = readLong(in);
            s.expiry = readLong(in);
            s.signature = readString(in);
            byte p = in.readByte();
            s.prevAbove = p == 2 ? null : p == 1;
            int n = in.readInt();
            byte[] longs = new byte[n * 8];
            in.readFully(longs);
            s.ts = new long[n];
            ByteBuffer.wrap(longs).asLongBuffer().get(s.ts);
            if (in.readBoolean()) {
                in.readFully(longs);
                s.num = new double[n];
                ByteBuffer.wrap(longs).asDoubleBuffer().get(s.num);
            }
            if (in.readBoolean()) {
                s.jv = new String[n];
                for (int i = 0; i < n; i++) {
                    s.jv[i] = readString(in);
                }
            }
            s.context = readRows(in);
            s.pending = readRows(in);
            // A state written before the sum was kept ends here: its sum is computed afresh.
            if (in.available() > 0 && in.readBoolean()) {
                s.sumFrom = in.readInt();
                int scale = in.readInt();
                byte[] unscaled = new byte[in.readInt()];
                in.readFully(unscaled);
                s.sum = new Velocity.Saved(new java.math.BigDecimal(new java.math.BigInteger(unscaled), scale),
                    in.readInt(), in.readInt(), in.readInt());
            }
            return s;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** Only the newest event time and the expiry (the first fields). */
    static Long[] header(byte[] b) {
        try {
            DataInputStream in = new DataInputStream(new ByteArrayInputStream(b));
            in.readByte();
            return new Long[] {readLong(in), readLong(in)};
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    private static void writeLong(DataOutputStream o, Long v) throws IOException {
        o.writeBoolean(v != null);
        if (v != null) {
            o.writeLong(v);
        }
    }

    private static Long readLong(DataInputStream in) throws IOException {
        return in.readBoolean() ? in.readLong() : null;
    }

    private static void writeString(DataOutputStream o, String s) throws IOException {
        if (s == null) {
            o.writeInt(-1);
            return;
        }
        byte[] u = s.getBytes(java.nio.charset.StandardCharsets.UTF_8);
        o.writeInt(u.length);
        o.write(u);
    }

    private static String readString(DataInputStream in) throws IOException {
        int n = in.readInt();
        if (n < 0) {
            return null;
        }
        byte[] u = new byte[n];
        in.readFully(u);
        return new String(u, java.nio.charset.StandardCharsets.UTF_8);
    }

    /**
     * Buffered correlation rows: a missing raw or topic is
     * stored as "" (so it comes back as ""), num and jv keep their nulls.
     */
    private static void writeRows(DataOutputStream o, List<Ev> rows) throws IOException {
        o.writeInt(rows.size());
        for (Ev e : rows) {
            o.writeLong(e.ts);
            writeLong(o, e.seq);
            o.writeBoolean(e.num != null);
            if (e.num != null) {
                o.writeDouble(e.num);
            }
            writeString(o, e.jv);
            writeString(o, e.raw == null ? "" : e.raw);
            writeString(o, e.topic == null ? "" : e.topic);
        }
    }

    private static List<Ev> readRows(DataInputStream in) throws IOException {
        int n = in.readInt();
        List<Ev> rows = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            long t = in.readLong();
            Long seq = readLong(in);
            Double num = in.readBoolean() ? in.readDouble() : null;
            String jv = readString(in);
            String raw = readString(in);
            String topic = readString(in);
            rows.add(new Ev(null, true, t, seq, topic, raw, num, jv, null));
        }
        return rows;
    }
}
