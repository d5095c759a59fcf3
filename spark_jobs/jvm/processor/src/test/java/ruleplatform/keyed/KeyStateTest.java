package ruleplatform.keyed;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.io.ByteArrayOutputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.api.Test;

/**
 * A key's stored state is its checkpoint format (KeyState's javadoc): format byte 2, the
 * number of parts, then per part the rule id and the sub-state's bytes, each after its
 * int length. The expected bytes are written here field by field with DataOutputStream;
 * KeyState must write exactly them, in the order the parts were first put, and read
 * them back, whole or one part at a time.
 */
class KeyStateTest {
    private static final String[] IDS = {"vel_0", "r\u00e9gle", "\u65e5\u672c", "a", "x y"};

    @Test
    void randomStatesEncodeToTheLayoutAndReadBack() throws IOException {
        Random rnd = new Random(20261202L);
        for (int k = 0; k < 500; k++) {
            KeyState s = new KeyState();
            List<String> ids = new ArrayList<>();
            List<byte[]> values = new ArrayList<>();
            for (int i = rnd.nextInt(6); i > 0; i--) {
                String id = IDS[rnd.nextInt(IDS.length)] + rnd.nextInt(50);
                byte[] v = new byte[rnd.nextInt(3000)];
                rnd.nextBytes(v);
                if (!s.parts.containsKey(id)) {
                    ids.add(id);
                    values.add(v);
                } else {
                    values.set(ids.indexOf(id), v); // a second put keeps the first's place
                }
                s.parts.put(id, v);
            }
            ByteArrayOutputStream bytes = new ByteArrayOutputStream();
            DataOutputStream o = new DataOutputStream(bytes);
            o.writeByte(2);
            o.writeInt(ids.size());
            for (int i = 0; i < ids.size(); i++) {
                byte[] id = ids.get(i).getBytes(StandardCharsets.UTF_8);
                o.writeInt(id.length);
                o.write(id);
                o.writeInt(values.get(i).length);
                o.write(values.get(i));
            }
            o.flush();
            assertArrayEquals(bytes.toByteArray(), s.encode(), "state " + k);
            KeyState read = KeyState.decode(bytes.toByteArray());
            assertEquals(ids, new ArrayList<>(read.parts.keySet()), "state " + k);
            for (int i = 0; i < ids.size(); i++) {
                assertArrayEquals(values.get(i), read.parts.get(ids.get(i)), "state " + k);
                assertArrayEquals(values.get(i), KeyState.part(bytes.toByteArray(), ids.get(i)), "state " + k);
            }
            assertNull(KeyState.part(bytes.toByteArray(), "absent"), "state " + k);
        }
    }

    @Test
    void aSubStateEntryOfTheOlderLayoutIsRefused() {
        // Format 1 is a sub-state's own first byte: an entry per (key, rule), before KeyState.
        assertThrows(IllegalStateException.class, () -> KeyState.decode(new SubState().encode()));
    }
}
