package ruleplatform.keyed;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * A key's state in one keyed operator: the sub-states ({@link SubState}) of the rules
 * that judged the key, by rule id, as their stored bytes. One MapState entry per key
 * (DetectionProcessor), not one per (key, rule): a batch that touches a key reads and
 * writes it once whatever the number of its rules, and each state call costs more than
 * the bytes it moves (the grouping and user keys encoded, a native call).
 *
 * Layout: a format byte, the number of parts, then per part the rule id (int length and
 * UTF-8 bytes) and the sub-state (int length and its bytes). A part is decoded only by a
 * batch that has rows for its rule; the other parts are written back as they were read.
 */
final class KeyState {
    private static final byte FORMAT = 2;

    /** Sub-state bytes by rule id, in the order they were first written. */
    final Map<String, byte[]> parts = new LinkedHashMap<>();

    static KeyState decode(byte[] bytes) {
        ByteBuffer in = open(bytes);
        KeyState s = new KeyState();
        for (int n = in.getInt(); n > 0; n--) {
            byte[] id = new byte[in.getInt()];
            in.get(id);
            byte[] part = new byte[in.getInt()];
            in.get(part);
            s.parts.put(new String(id, StandardCharsets.UTF_8), part);
        }
        return s;
    }

    /**
     * One rule's part of a key's stored state, or null: what a sweep that looks at one rule
     * reads, without copying the other parts.
     */
    static byte[] part(byte[] bytes, String ruleId) {
        byte[] want = ruleId.getBytes(StandardCharsets.UTF_8);
        ByteBuffer in = open(bytes);
        for (int n = in.getInt(); n > 0; n--) {
            int idLength = in.getInt();
            int idAt = in.position();
            in.position(idAt + idLength);
            int length = in.getInt();
            if (Arrays.equals(bytes, idAt, idAt + idLength, want, 0, want.length)) {
                return Arrays.copyOfRange(bytes, in.position(), in.position() + length);
            }
            in.position(in.position() + length);
        }
        return null;
    }

    private static ByteBuffer open(byte[] bytes) {
        ByteBuffer in = ByteBuffer.wrap(bytes);
        byte format = in.get();
        if (format != FORMAT) {
            throw new IllegalStateException("a key's state of format " + format + ", not " + FORMAT);
        }
        return in;
    }

    byte[] encode() {
        byte[][] ids = new byte[parts.size()][];
        byte[][] values = new byte[parts.size()][];
        int size = 5;
        int i = 0;
        for (Map.Entry<String, byte[]> e : parts.entrySet()) {
            ids[i] = e.getKey().getBytes(StandardCharsets.UTF_8);
            values[i] = e.getValue();
            size += 8 + ids[i].length + values[i].length;
            i++;
        }
        ByteBuffer out = ByteBuffer.allocate(size).put(FORMAT).putInt(ids.length);
        for (int j = 0; j < ids.length; j++) {
            out.putInt(ids[j].length).put(ids[j]).putInt(values[j].length).put(values[j]);
        }
        return out.array();
    }
}
