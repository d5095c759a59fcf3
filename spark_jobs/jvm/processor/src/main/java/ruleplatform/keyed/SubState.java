package ruleplatform.keyed;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * One (key, rule) sub-state: signature, last crossing
 * flag, newest event time, expiry, the velocity window (columns sorted by time; values
 * only where the aggregation reads them) or the correlation buffers (context, held
 * primaries). Stored as the rule's part of its key's MapState entry (KeyState), in a
 * compact binary form of its own (maxTs and expiry first, so the idle sweep and the
 * expiry timer read them without decoding the rest).
 *
 * A long window is kept in parts: its older events in sealed chunks of {@link #chunkSize}
 * events, each in an entry of its own (DetectionProcessor: key NUL rule NUL chunk id),
 * listed with their first and last times at the end of this entry; the newest events in
 * the open part (ts, num, jv) inside it. A batch whose rows come after the sealed events
 * writes the open part, the chunks it seals and the one the window's start cuts, never
 * the rest: a key whose window holds a minute of a busy topic is not read and rewritten
 * whole at every batch. The sealed events read are those the window's start passes
 * ({@link Column}, loaded when first read through {@link #store}). A window that never
 * reaches two chunks has none, and its bytes are those of a state written before chunks.
 */
final class SubState {
    Long maxTs;
    Long expiry;
    String signature;
    Boolean prevAbove;
    // velocity window: the sealed chunks, then the open part; ascending ts (equal times in arrival order)
    List<Chunk> sealed = new ArrayList<>();
    long[] ts = new long[0];
    double[] num; // NaN: no value (sum, avg, min, max)
    String[] jv; // distinct_count
    /** A sum or avg window's exact state over [sumFrom, end) of the window (Velocity.Saved); null: none kept. */
    Velocity.Saved sum;
    int sumFrom;
    /** Events per sealed chunk; the open part is sealed from its front when it holds twice that. */
    int chunkSize = CHUNK;
    /** Where sealed chunks are read from (null: the state has none stored). */
    ChunkStore store;
    /** Chunks to write (new or changed) and to remove, by id: what this state's batch changed. */
    final Map<Integer, Chunk> written = new LinkedHashMap<>();
    final Set<Integer> dropped = new HashSet<>();

    static final int CHUNK = 512;
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
        o.room(1).put((byte) (prevAbove == null ? 2 : prevAbove ? 1 : 0));
        writeWindow(o, ts, num, jv);
        writeRows(o, context);
        writeRows(o, pending);
        // Last, so the bytes before it are those of a state written without it.
        o.room(1).put((byte) (sum != null ? 1 : 0));
        if (sum != null) {
            byte[] unscaled = sum.sum.unscaledValue().toByteArray();
            o.room(24 + unscaled.length).putInt(sumFrom).putInt(sum.sum.scale()).putInt(unscaled.length).put(unscaled)
                .putInt(sum.values).putInt(sum.posInf).putInt(sum.negInf);
        }
        // After the sum, and only with chunks, so a window that has none is written as before.
        if (!sealed.isEmpty()) {
            o.room(5).put((byte) 1).putInt(sealed.size());
            for (Chunk c : sealed) {
                o.room(24).putInt(c.id).putInt(c.n).putLong(c.firstTs).putLong(c.lastTs);
            }
        }
        return o.bytes();
    }

    /**
     * A window's columns: the open part's layout, and a sealed chunk's whole value. One
     * buffer, no stream calls per byte; the bytes are those DataOutputStream writes
     * (big-endian), but for the values, whose bits are written as they are (a NaN's too).
     */
    private static void writeWindow(Out o, long[] ts, double[] num, String[] jv) {
        ByteBuffer b = o.room(ts.length * 8 + 5).putInt(ts.length);
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
    }

    /** Reads what writeWindow wrote into `into`'s columns. */
    private static void readWindow(ByteBuffer in, Columns into) {
        int n = in.getInt();
        into.ts = new long[n];
        for (int i = 0; i < n; i++) {
            into.ts[i] = in.getLong();
        }
        into.num = null;
        if (in.get() != 0) {
            into.num = new double[n];
            for (int i = 0; i < n; i++) {
                into.num[i] = in.getDouble();
            }
        }
        into.jv = null;
        if (in.get() != 0) {
            into.jv = new String[n];
            for (int i = 0; i < n; i++) {
                into.jv[i] = readString(in);
            }
        }
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
        Columns open = new Columns();
        readWindow(in, open);
        s.ts = open.ts;
        s.num = open.num;
        s.jv = open.jv;
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
        if (in.hasRemaining() && in.get() != 0) {
            for (int i = in.getInt(); i > 0; i--) {
                s.sealed.add(new Chunk(in.getInt(), in.getInt(), in.getLong(), in.getLong()));
            }
        }
        return s;
    }

    /** A window's columns (ts ascending; num and jv only where the aggregation reads them). */
    static class Columns {
        long[] ts;
        double[] num;
        String[] jv;
    }

    /** A sealed chunk: its place in the window, and its columns once read (ts null until then). */
    static final class Chunk extends Columns {
        final int id;
        int n;
        long firstTs;
        long lastTs;

        Chunk(int id, int n, long firstTs, long lastTs) {
            this.id = id;
            this.n = n;
            this.firstTs = firstTs;
            this.lastTs = lastTs;
        }

        byte[] encode() {
            Out o = new Out(16 + n * 16);
            writeWindow(o, ts, num, jv);
            return o.bytes();
        }
    }

    /** Where a state's sealed chunks are read from, by id. */
    interface ChunkStore {
        byte[] get(int id);
    }

    /** Events in the window, sealed and open. */
    int size() {
        return sealedSize() + ts.length;
    }

    int sealedSize() {
        int n = 0;
        for (Chunk c : sealed) {
            n += c.n;
        }
        return n;
    }

    /** The window's newest event time (it holds at least one). */
    long newest() {
        return ts.length > 0 ? ts[ts.length - 1] : sealed.get(sealed.size() - 1).lastTs;
    }

    private Chunk load(Chunk c) {
        if (c.ts == null) {
            byte[] b = store == null ? null : store.get(c.id);
            if (b == null) {
                throw new IllegalStateException("sealed window chunk " + c.id + " is missing from the state");
            }
            readWindow(ByteBuffer.wrap(b), c);
        }
        return c;
    }

    private void drop(Chunk c) {
        written.remove(c.id);
        dropped.add(c.id);
    }

    private void write(Chunk c) {
        dropped.remove(c.id);
        written.put(c.id, c);
    }

    /** The window emptied (the rule's conditions or fields changed): its chunks go too. */
    void clearWindow() {
        for (Chunk c : sealed) {
            drop(c);
        }
        sealed = new ArrayList<>();
        ts = new long[0];
        num = null;
        jv = null;
        sum = null;
    }

    /**
     * The sealed chunks holding events after t moved back into the open part, for rows
     * of time t to merge there (a row goes after stored events of its time).
     */
    void unseal(long t) {
        while (!sealed.isEmpty() && sealed.get(sealed.size() - 1).lastTs > t) {
            Chunk c = load(sealed.remove(sealed.size() - 1));
            drop(c);
            Columns open = new Columns();
            open.ts = ts;
            open.num = num;
            open.jv = jv;
            Columns joined = concat(c, open);
            ts = joined.ts;
            num = joined.num;
            jv = joined.jv;
        }
    }

    private static Columns concat(Columns a, Columns b) {
        Columns out = new Columns();
        int na = a.ts.length;
        int nb = b.ts.length;
        out.ts = Arrays.copyOf(a.ts, na + nb);
        System.arraycopy(b.ts, 0, out.ts, na, nb);
        if (a.num != null || b.num != null) {
            out.num = new double[na + nb];
            Arrays.fill(out.num, Double.NaN);
            if (a.num != null) {
                System.arraycopy(a.num, 0, out.num, 0, na);
            }
            if (b.num != null) {
                System.arraycopy(b.num, 0, out.num, na, nb);
            }
        }
        if (a.jv != null || b.jv != null) {
            out.jv = new String[na + nb];
            if (a.jv != null) {
                System.arraycopy(a.jv, 0, out.jv, 0, na);
            }
            if (b.jv != null) {
                System.arraycopy(b.jv, 0, out.jv, na, nb);
            }
        }
        return out;
    }

    /** While the open part holds two chunks' worth, its oldest chunkSize events are sealed. */
    void seal() {
        int k = ts.length / chunkSize - 1; // leaves chunkSize to 2 * chunkSize - 1 open
        if (k <= 0) {
            return;
        }
        Set<Integer> used = new HashSet<>();
        for (Chunk c : sealed) {
            used.add(c.id);
        }
        int id = 0;
        for (int j = 0; j < k; j++) {
            while (used.contains(id)) {
                id++;
            }
            used.add(id);
            int from = j * chunkSize;
            int to = from + chunkSize;
            Chunk c = new Chunk(id, chunkSize, ts[from], ts[to - 1]);
            c.ts = Arrays.copyOfRange(ts, from, to);
            c.num = num == null ? null : Arrays.copyOfRange(num, from, to);
            c.jv = jv == null ? null : Arrays.copyOfRange(jv, from, to);
            sealed.add(c);
            write(c);
        }
        cutOpen(k * chunkSize);
    }

    private void cutOpen(int i) {
        ts = Arrays.copyOfRange(ts, i, ts.length);
        if (num != null) {
            num = Arrays.copyOfRange(num, i, num.length);
        }
        if (jv != null) {
            jv = Arrays.copyOfRange(jv, i, jv.length);
        }
    }

    /**
     * Forget the events at or before `cut`: whole chunks unread, the first left trimmed
     * (or the open part when no chunk is left). Returns how many went.
     */
    int evict(long cut) {
        int gone = 0;
        while (!sealed.isEmpty() && sealed.get(0).lastTs <= cut) {
            Chunk c = sealed.remove(0);
            gone += c.n;
            drop(c);
        }
        if (!sealed.isEmpty()) {
            Chunk c = sealed.get(0);
            if (c.firstTs <= cut) {
                load(c);
                int i = 0;
                while (c.ts[i] <= cut) {
                    i++;
                }
                c.ts = Arrays.copyOfRange(c.ts, i, c.n);
                c.num = c.num == null ? null : Arrays.copyOfRange(c.num, i, c.n);
                c.jv = c.jv == null ? null : Arrays.copyOfRange(c.jv, i, c.n);
                c.n -= i;
                c.firstTs = c.ts[0];
                write(c);
                gone += i;
            }
            return gone;
        }
        int i = 0;
        while (i < ts.length && ts[i] <= cut) {
            i++;
        }
        if (i > 0) {
            cutOpen(i);
        }
        return gone + i;
    }

    /** The window as one column over sealed and open events, sealed chunks read when first touched. */
    Column column() {
        return new Column();
    }

    /** The window by index: [0, sealedSize) in the chunks, the rest in the open part. */
    final class Column implements Velocity.Values {
        private final int[] starts = new int[sealed.size() + 1];
        private final int base; // sealed events: the open part's first index
        private int cur = -1;

        Column() {
            for (int i = 0; i < sealed.size(); i++) {
                starts[i + 1] = starts[i] + sealed.get(i).n;
            }
            base = starts[sealed.size()];
        }

        int size() {
            return base + ts.length;
        }

        /** The chunk holding index i (i below sealedSize), read if it was not. */
        private Chunk at(int i) {
            if (cur < 0 || i < starts[cur] || i >= starts[cur + 1]) {
                int k = Arrays.binarySearch(starts, i);
                cur = k >= 0 ? k : -k - 2;
                load(sealed.get(cur));
            }
            return sealed.get(cur);
        }

        long ts(int i) {
            return i >= base ? ts[i - base] : at(i).ts[i - starts[cur]];
        }

        @Override
        public double num(int i) {
            if (i >= base) {
                return num == null ? Double.NaN : num[i - base];
            }
            Chunk c = at(i);
            return c.num == null ? Double.NaN : c.num[i - starts[cur]];
        }

        @Override
        public String jv(int i) {
            if (i >= base) {
                return jv == null ? null : jv[i - base];
            }
            Chunk c = at(i);
            return c.jv == null ? null : c.jv[i - starts[cur]];
        }

        /** The first index whose time is after t (the window's size when none), reading at most one chunk. */
        int firstAfter(long t) {
            for (int k = 0; k < sealed.size(); k++) {
                Chunk c = sealed.get(k);
                if (c.lastTs > t) {
                    if (c.firstTs > t) {
                        return starts[k];
                    }
                    load(c);
                    return starts[k] + bisectRight(c.ts, c.n, t);
                }
            }
            return base + bisectRight(ts, ts.length, t);
        }
    }

    /** The first index in a[0, n) whose value is above t (a ascending). */
    private static int bisectRight(long[] a, int n, long t) {
        int lo = 0;
        int hi = n;
        while (lo < hi) {
            int mid = (lo + hi) >>> 1;
            if (a[mid] <= t) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        return lo;
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
