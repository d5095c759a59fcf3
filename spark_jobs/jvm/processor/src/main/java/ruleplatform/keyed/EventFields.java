package ruleplatform.keyed;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.expressions.UserDefinedFunction;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.types.variant.Variant;
import org.apache.spark.types.variant.VariantUtil;
import org.apache.spark.unsafe.types.VariantVal;

/**
 * The backtest's field reads (spark_jobs/engine/values.py `extract_paths`) from an event's
 * VARIANT in one call per event: for each path the rules name, whether the value is there,
 * its JSON text, its kind, and its string.
 *
 * The same reads as Spark expressions cost more than anything else in a backtest's scan:
 * `try_variant_get(v, path, 'variant')` rebuilds the value as a new variant, `to_json`
 * creates a Jackson generator for every string, and a typed read builds a Literal and a
 * Cast per row, for every field of every event (bench_backtest.py measures the
 * backtest; see docs/benchmarks.md). Here the value is read in place,
 * through Spark's own Variant class (its JSON text is Variant.toJson, the function
 * `to_json` calls), and everything after (numbers, numeric strings, timestamps) stays
 * the Spark expressions of values.py, so a rule reads exactly what it read before.
 */
public final class EventFields {
    private EventFields() {}

    private static final ObjectMapper JSON = new ObjectMapper();

    /** The function's name in plans and the Spark UI. */
    public static final String NAME = "event_fields";

    /**
     * The reads as a struct column over `v`: for the i-th path of `specJson`
     * ({"paths": [["user", "id"], ...], "texts": [2, ...]}), fields `p{i}_present` (the
     * value is there and not JSON null), `p{i}_json` (its JSON text, where "texts" asks:
     * 2 for every value, 1 for numbers, 0 never), `p{i}_is_str` and `p{i}_is_num` (a JSON
     * string; a number: an integer, decimal, double or float), `p{i}_str` (the string,
     * for a string) and `p{i}_float` (a FLOAT variant's value, which its text would not
     * give exactly). All but `present` are NULL where the value is not there.
     */
    public static Column read(Column v, String specJson) {
        JsonNode spec = spec(specJson);
        String[][] paths = paths(spec.get("paths"));
        int[] texts = new int[paths.length];
        for (int i = 0; i < texts.length; i++) {
            texts[i] = spec.get("texts").get(i).asInt();
        }
        List<StructField> fields = new ArrayList<>();
        for (int i = 0; i < paths.length; i++) {
            fields.add(DataTypes.createStructField("p" + i + "_present", DataTypes.BooleanType, false));
            fields.add(DataTypes.createStructField("p" + i + "_json", DataTypes.StringType, true));
            fields.add(DataTypes.createStructField("p" + i + "_is_str", DataTypes.BooleanType, true));
            fields.add(DataTypes.createStructField("p" + i + "_is_num", DataTypes.BooleanType, true));
            fields.add(DataTypes.createStructField("p" + i + "_str", DataTypes.StringType, true));
            fields.add(DataTypes.createStructField("p" + i + "_float", DataTypes.DoubleType, true));
        }
        StructType schema = DataTypes.createStructType(fields);
        UserDefinedFunction udf = functions.udf(new Reads(paths, texts), schema).asNonNullable().withName(NAME);
        return udf.apply(v);
    }

    private static JsonNode spec(String specJson) {
        try {
            return JSON.readTree(specJson);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    private static String[][] paths(JsonNode node) {
        String[][] out = new String[node.size()][];
        for (int i = 0; i < out.length; i++) {
            JsonNode segs = node.get(i);
            out[i] = new String[segs.size()];
            for (int j = 0; j < out[i].length; j++) {
                out[i][j] = segs.get(j).asText();
            }
        }
        return out;
    }

    /** A path's JSON text: not read, read for numbers only, read for every value. */
    static final int TEXT_NONE = 0;
    static final int TEXT_NUMBERS = 1;
    static final int TEXT_ALL = 2;

    static final class Reads implements UDF1<VariantVal, Row> {
        private static final int ABSENT = -1;
        private static final int AMBIGUOUS = -2;
        private static final int MAX_SHAPES = 64;

        private final String[][] paths;
        private final int[] texts;
        // Built lazily on the executor (not serialized); concurrent, should tasks share it.
        private transient Map<ByteBuffer, int[][]> shapes;

        Reads(String[][] paths, int[] texts) {
            this.paths = paths;
            this.texts = texts;
        }

        @Override
        public Row call(VariantVal v) {
            if (shapes == null) {
                shapes = new ConcurrentHashMap<>();
            }
            Object[] out = new Object[paths.length * 6];
            Variant root = v == null ? null : new Variant(v.getValue(), v.getMetadata());
            for (int i = 0; i < paths.length; i++) {
                Variant x = at(root, i);
                int o = i * 6;
                boolean present = x != null && x.getType() != VariantUtil.Type.NULL;
                out[o] = present;
                if (!present) {
                    continue;
                }
                VariantUtil.Type type = x.getType();
                boolean string = type == VariantUtil.Type.STRING;
                boolean number = type == VariantUtil.Type.LONG || type == VariantUtil.Type.DOUBLE
                    || type == VariantUtil.Type.FLOAT || type == VariantUtil.Type.DECIMAL;
                String text = string ? x.getString() : null;
                if (texts[i] == TEXT_ALL || (texts[i] == TEXT_NUMBERS && number)) {
                    out[o + 1] = text != null ? quoted(text, x) : x.toJson(ZoneOffset.UTC);
                }
                out[o + 2] = string;
                out[o + 3] = number;
                out[o + 4] = text;
                out[o + 5] = type == VariantUtil.Type.FLOAT ? (Double) (double) x.getFloat() : null;
            }
            return RowFactory.create(out);
        }

        /**
         * A string's JSON text: Variant.toJson (what Spark's to_json gives), which writes
         * every string through a Jackson generator of its own; that generator escapes only
         * the quote, the backslash and control characters, so a string without them is its
         * text in quotes, and only the others go through toJson.
         */
        private static String quoted(String text, Variant x) {
            for (int k = 0; k < text.length(); k++) {
                char c = text.charAt(k);
                if (c < 0x20 || c == '"' || c == '\\') {
                    return x.toJson(ZoneOffset.UTC);
                }
            }
            return "\"" + text + "\"";
        }

        /** The value at path i (object keys), or null: missing, or under a non-object. */
        private Variant at(Variant root, int i) {
            if (root == null) {
                return null;
            }
            int[] ids = dictionaryIds(root.getMetadata())[i];
            Variant x = root;
            for (int j = 0; j < ids.length; j++) {
                if (x == null || x.getType() != VariantUtil.Type.OBJECT) {
                    return null;
                }
                x = field(x, ids[j], paths[i][j]);
            }
            return x;
        }

        /**
         * The field of object `x` whose key has dictionary id `id` (AMBIGUOUS: by its name
         * `key`). Variant.getFieldByKey decodes the key of every field it passes into a
         * String; comparing ids decodes none.
         */
        private static Variant field(Variant x, int id, String key) {
            if (id == ABSENT) {
                return null;
            }
            if (id == AMBIGUOUS) {
                return x.getFieldByKey(key);
            }
            int n = x.objectSize();
            for (int k = 0; k < n; k++) {
                if (x.getDictionaryIdAtIndex(k) == id) {
                    return x.getFieldAtIndex(k).value;
                }
            }
            return null;
        }

        /**
         * Per path and key, its id in the metadata's dictionary of keys (ABSENT when no key
         * of the record has that name). Records of one shape share their metadata, so the
         * ids are kept per distinct metadata, for the last few shapes seen.
         */
        private int[][] dictionaryIds(byte[] metadata) {
            ByteBuffer key = ByteBuffer.wrap(metadata);
            int[][] ids = shapes.get(key);
            if (ids != null) {
                return ids;
            }
            int offsetSize = ((metadata[0] >> 6) & 0x3) + 1;
            int size = VariantUtil.readUnsigned(metadata, 1, offsetSize);
            Map<String, Integer> byName = new HashMap<>();
            for (int id = 0; id < size; id++) {
                byName.merge(VariantUtil.getMetadataKey(metadata, id), id, (a, b) -> AMBIGUOUS);
            }
            ids = new int[paths.length][];
            for (int i = 0; i < paths.length; i++) {
                ids[i] = new int[paths[i].length];
                for (int j = 0; j < ids[i].length; j++) {
                    ids[i][j] = byName.getOrDefault(paths[i][j], ABSENT);
                }
            }
            if (shapes.size() >= MAX_SHAPES) {
                shapes.clear();
            }
            shapes.put(ByteBuffer.wrap(metadata.clone()), ids);
            return ids;
        }
    }
}
