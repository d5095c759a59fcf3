package ruleplatform.rules;

import static org.junit.jupiter.api.Assertions.assertEquals;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.time.ZoneOffset;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Random;
import org.apache.spark.types.variant.Variant;
import org.apache.spark.types.variant.VariantBuilder;
import org.junit.jupiter.api.Test;

/**
 * A value's JSON text is Spark's Variant.toJson, which the evaluator writes itself for
 * strings and integers (Value.json). The oracle here is Spark's own method, on values
 * Spark's own parser built from JSON that Jackson's ObjectMapper wrote: strings with
 * quotes, backslashes, every control character, non-ASCII and surrogate pairs; longs
 * from every width; and the types left to Spark (doubles, decimals, booleans).
 */
class ValueJsonTest {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final String[] PATH = {"v"};

    private static void same(Object v) throws IOException {
        Map<String, Object> doc = new LinkedHashMap<>();
        doc.put("v", v);
        String text = JSON.writeValueAsString(doc);
        Variant root = VariantBuilder.parseJson(text, false);
        String want = root.getFieldByKey("v").toJson(ZoneOffset.UTC);
        assertEquals(want, Value.at(root, PATH).json(), text);
    }

    @Test
    void stringsAreWrittenAsSparkWritesThem() throws IOException {
        for (int c = 0; c < 0x80; c++) {
            same("a" + (char) c + "b");
        }
        for (String s : new String[] {"", "\"", "\\", "u4943", "caf\u00e9", "\u65e5\u672c", "\ud83d\ude00", "\u2028\u2029",
            "</script>", "\u007f\u0080\u009f", "line\nnext\ttab"}) {
            same(s);
        }
        Random rnd = new Random(20261202L);
        for (int k = 0; k < 2000; k++) {
            StringBuilder b = new StringBuilder();
            for (int i = rnd.nextInt(20); i > 0; i--) {
                b.appendCodePoint(rnd.nextInt(4) == 0 ? rnd.nextInt(0x80) : rnd.nextInt(0xD000));
            }
            same(b.toString());
        }
    }

    @Test
    void integersAndTheOtherTypesAreWrittenAsSparkWritesThem() throws IOException {
        for (long v : new long[] {0, 1, -1, 127, -128, 32767, -32768, Integer.MAX_VALUE, Integer.MIN_VALUE,
            Long.MAX_VALUE, Long.MIN_VALUE}) {
            same(v);
        }
        Random rnd = new Random(7L);
        for (int k = 0; k < 500; k++) {
            same(rnd.nextLong() >> rnd.nextInt(64));
        }
        for (Object v : new Object[] {true, false, 1.5, -0.0, 1e300, 0.1, new java.math.BigDecimal("12.340"),
            java.util.List.of(1, "a"), Map.of("x", 1)}) {
            same(v);
        }
    }
}
