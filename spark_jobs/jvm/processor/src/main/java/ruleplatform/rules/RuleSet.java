package ruleplatform.rules;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.types.variant.Variant;
import org.apache.spark.types.variant.VariantBuilder;
import org.apache.spark.unsafe.types.VariantVal;

/**
 * One version of the rule set, compiled once into an index the plan calls per event: an
 * event meets only its topic's rules, and of those only the ones whose equality tests on
 * a string its fields could pass (a discrimination index, as rules engines keep), so the
 * cost follows the events and their matches, not the number of rules in force.
 *
 * Built from the rule set's spec (spark_jobs/engine/rule_set.py): the rule model
 * decides what each rule value is; here it is only tested.
 */
public final class RuleSet {
    private static final ObjectMapper JSON = new ObjectMapper();

    /** A compiled threshold rule: its index in the spec and its conditions (ANDed). */
    static final class Rule {
        final int index;
        final String id;
        final Condition[] conditions;

        Rule(int index, String id, Condition[] conditions) {
            this.index = index;
            this.id = id;
            this.conditions = conditions;
        }
    }

    /** The rules of one topic: indexed under one string equality each, or always tested. */
    static final class Topic {
        final List<String[]> indexedPaths = new ArrayList<>();
        final List<Map<String, List<Rule>>> byValue = new ArrayList<>();
        final List<Rule> always = new ArrayList<>();

        /** One source's rules, indexed; `rules` in the spec's order. */
        Topic(List<Rule> rules) {
            Map<String, Integer> shared = new HashMap<>(); // rules per (path, value) equality
            for (Rule r : rules) {
                for (Condition c : r.conditions) {
                    if (isIndexable(c)) {
                        shared.merge(indexKey(c), 1, Integer::sum);
                    }
                }
            }
            for (Rule r : rules) {
                add(r, shared);
            }
        }

        /**
         * Index `r` under the string equality that the fewest of the topic's rules share
         * (`shared`: rules per path and value), the first of equals: a rule that asks for
         * one user and one event type waits under its user, not with every rule of that
         * type. Which equality indexes a rule only decides which rules an event meets; each
         * is still tested whole.
         */
        private void add(Rule r, Map<String, Integer> shared) {
            Condition eq = null;
            int fewest = Integer.MAX_VALUE;
            for (Condition c : r.conditions) {
                int rules = isIndexable(c) ? shared.get(indexKey(c)) : Integer.MAX_VALUE;
                if (rules < fewest) {
                    eq = c;
                    fewest = rules;
                }
            }
            if (eq == null) {
                always.add(r);
                return;
            }
            int slot = slotOf(eq.path);
            byValue.get(slot).computeIfAbsent(eq.str, k -> new ArrayList<>()).add(r);
        }

        /**
         * The rules `e` could pass, in the spec's order (so what an event is judged by, and
         * the order of its results, do not depend on which equality indexes a rule): the
         * always-tested ones and those its indexed values select.
         */
        List<Rule> candidates(Event e) {
            List<Rule> tested = new ArrayList<>(always);
            boolean merged = false;
            for (int i = 0; i < indexedPaths.size(); i++) {
                String s = e.value(indexedPaths.get(i)).string();
                List<Rule> hits = s == null ? null : byValue.get(i).get(s);
                if (hits != null) {
                    merged |= !tested.isEmpty();
                    tested.addAll(hits);
                }
            }
            if (merged) {
                tested.sort((a, b) -> Integer.compare(a.index, b.index));
            }
            return tested;
        }

        private static boolean isIndexable(Condition c) {
            return c.kind == Condition.Kind.STR && "==".equals(c.op);
        }

        /** Path and value of an indexable equality, as one map key. */
        private static String indexKey(Condition c) {
            return String.join("\u0000", c.path) + "\u0001" + c.str;
        }

        private int slotOf(String[] path) {
            for (int i = 0; i < indexedPaths.size(); i++) {
                if (java.util.Arrays.equals(indexedPaths.get(i), path)) {
                    return i;
                }
            }
            indexedPaths.add(path);
            byValue.add(new HashMap<>());
            return indexedPaths.size() - 1;
        }
    }

    private final Map<String, Topic> topics;
    /** Per rule, in the spec's order: its id, version and name (NULL when it has none). */
    private final String[][] identities;

    private final KeyedRules keyed;

    private RuleSet(Map<String, Topic> topics, String[][] identities, KeyedRules keyed) {
        this.topics = topics;
        this.identities = identities;
        this.keyed = keyed;
    }

    /** The version's keyed rules (velocity and correlation). */
    public KeyedRules keyed() {
        return keyed;
    }

    /** The rule set that judges the running task's events (BatchVersions): the keyed operators' way to it. */
    public static RuleSet forTask(String versionsDir) {
        return BatchVersions.forTask(versionsDir);
    }

    /** Rule `index`'s {id, version, name}: what a live detection names it by. */
    public String[] identity(int index) {
        return identities[index];
    }

    /**
     * `{"threshold": [{"id", "version", "name", "topic", "conditions": [cond spec, ..]}, ..],
     * "keyed": [keyed row, ..]}` (spark_jobs/engine/rule_set.py; KeyedRules).
     */
    public static RuleSet compile(String specJson) {
        JsonNode spec;
        try {
            spec = JSON.readTree(specJson);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        JsonNode rules = spec.path("threshold");
        String[][] identities = new String[rules.size()][];
        Map<String, List<Rule>> byTopic = new LinkedHashMap<>();
        for (int i = 0; i < rules.size(); i++) {
            JsonNode r = rules.get(i);
            JsonNode name = r.path("name");
            identities[i] = new String[] {r.get("id").asText(), r.path("version").asText(null),
                name.isTextual() ? name.asText() : null};
            byTopic.computeIfAbsent(r.get("topic").asText(), t -> new ArrayList<>())
                .add(new Rule(i, r.get("id").asText(), Condition.all(r.get("conditions"))));
        }
        Map<String, Topic> topics = indexed(byTopic);
        return new RuleSet(topics, identities, new KeyedRules(spec.path("keyed")));
    }

    /**
     * How many of `topic`'s rules the index has an event (JSON text) meet: what an event
     * costs, which follows the rules that could match it and not the rule set's size
     * (tests/integration/test_rule_set_evaluator.py).
     */
    public int tried(String topic, String json) throws IOException {
        Topic t = topics.get(topic);
        return t == null ? 0 : t.candidates(new Event(VariantBuilder.parseJson(json, false))).size();
    }

    /** Each source's rules, indexed (Topic). */
    static <K> Map<K, Topic> indexed(Map<K, List<Rule>> rules) {
        Map<K, Topic> out = new HashMap<>();
        rules.forEach((k, rs) -> out.put(k, new Topic(rs)));
        return out;
    }

    /** What the threshold rules made of one event. */
    public static final class Judged {
        /** The indexes (in the spec's order) of the rules it passes. */
        public final int[] matches;
        /** `rule id` US `reason` per rule that only a value it cannot read kept it from passing. */
        public final String[] unreadable;

        Judged(int[] matches, String[] unreadable) {
            this.matches = matches;
            this.unreadable = unreadable;
        }
    }

    private static final Judged NONE = new Judged(new int[0], new String[0]);
    /** Separates a rule id from its reason in an unreadable entry (the job's status adds them up). */
    public static final String UNREAD_SEP = "\u001f";

    /**
     * The threshold rules of `topic` judged on event `v`: the ones it passes, and the ones
     * it failed only for a value they cannot read (a present value that is no number where
     * a condition orders numbers), with the first such path in the reason.
     */
    public Judged thresholds(String topic, VariantVal v) {
        Topic t = topics.get(topic);
        if (t == null || v == null) {
            return NONE;
        }
        Event e = new Event(new Variant(v.getValue(), v.getMetadata()));
        List<Rule> hits = new ArrayList<>();
        List<String> unread = null;
        for (Rule r : t.candidates(e)) {
            if (e.passes(r)) {
                hits.add(r);
                continue;
            }
            String blocked = e.blockedBy(r.conditions);
            if (blocked != null) {
                if (unread == null) {
                    unread = new ArrayList<>();
                }
                unread.add(r.id + UNREAD_SEP + "value at " + blocked + " is not a number");
            }
        }
        int[] out = new int[hits.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = hits.get(i).index;
        }
        return new Judged(out, unread == null ? NONE.unreadable : unread.toArray(new String[0]));
    }

    /** One event's values, each path read once whatever number of rules test it. */
    static final class Event {
        private final Variant root;
        // By the path array's identity: Value.path gives one array per distinct path.
        private final Map<String[], Value> values = new java.util.IdentityHashMap<>();

        Event(Variant root) {
            this.root = root;
        }

        Value value(String[] path) {
            Value x = values.get(path);
            if (x == null) {
                x = Value.at(root, path);
                values.put(path, x);
            }
            return x;
        }

        boolean passes(Rule r) {
            return passes(r.conditions);
        }

        /**
         * The path of the first condition whose value is unreadable, when every condition
         * either passes or is unreadable (an event that fails the rule anyway was not
         * kept from it by the unreadable value); else null.
         */
        String blockedBy(Condition[] conditions) {
            String first = null;
            for (Condition c : conditions) {
                Value x = value(c.path);
                if (c.test(x)) {
                    continue;
                }
                if (!c.unreadable(x)) {
                    return null;
                }
                if (first == null) {
                    first = c.text;
                }
            }
            return first;
        }

        boolean passes(Condition[] conditions) {
            for (Condition c : conditions) {
                if (!c.test(value(c.path))) {
                    return false;
                }
            }
            return true;
        }
    }
}
