package io.faultwatch.rocketmq.feed;

import java.io.IOException;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

/**
 * One cluster's avoidance list as published ({@code faultwatch.avoidance/1}), only what a producer
 * needs of it. Parsing applies the same checks as faultwatch's Python feed client
 * ({@code pipeline/producer.py}): the schema id, then each required field's type, naming the first
 * bad one.
 */
public final class AvoidanceList {
    public static final String SCHEMA_ID = "faultwatch.avoidance/1";
    private static final ObjectMapper JSON = new ObjectMapper();

    /** One avoided broker. */
    public static final class Entry {
        public final String brokerName;
        public final long avoidUntilMs;
        public final long expiresMs;
        public final String reason;

        Entry(String brokerName, long avoidUntilMs, long expiresMs, String reason) {
            this.brokerName = brokerName;
            this.avoidUntilMs = avoidUntilMs;
            this.expiresMs = expiresMs;
            this.reason = reason;
        }
    }

    public final String cluster;
    public final String cycleId;
    public final long decidedMs;
    public final long expiresMs;
    public final List<Entry> avoid;

    AvoidanceList(String cluster, String cycleId, long decidedMs, long expiresMs, List<Entry> avoid) {
        this.cluster = cluster;
        this.cycleId = cycleId;
        this.decidedMs = decidedMs;
        this.expiresMs = expiresMs;
        this.avoid = Collections.unmodifiableList(avoid);
    }

    public static AvoidanceList parse(byte[] value) throws InvalidListException {
        JsonNode obj;
        try {
            obj = JSON.readTree(value);
        } catch (IOException e) {
            throw new InvalidListException("an avoidance list must be JSON: " + e.getMessage());
        }
        if (obj == null || !obj.isObject()) {
            throw new InvalidListException("an avoidance list must be a JSON object");
        }
        JsonNode schema = obj.get("schema");
        if (schema == null || !schema.isTextual() || !SCHEMA_ID.equals(schema.asText())) {
            throw new InvalidListException("unknown avoidance list schema " + schema + "; expected '" + SCHEMA_ID + "'");
        }
        JsonNode entries = obj.get("avoid");
        if (entries == null || !entries.isArray()) {
            throw new InvalidListException("avoidance list field 'avoid' must be an array");
        }
        List<Entry> avoid = new ArrayList<>();
        for (JsonNode e : entries) {
            if (!e.isObject()) {
                throw new InvalidListException("avoidance list entries must be JSON objects");
            }
            JsonNode reason = e.get("reason");
            avoid.add(new Entry(text(e, "broker_name"), integer(e, "avoid_until_ms"), integer(e, "expires_ms"),
                    reason == null || reason.isNull() ? "" : reason.asText()));
        }
        JsonNode cycle = obj.get("cycle_id");
        return new AvoidanceList(text(obj, "cluster"), cycle == null || cycle.isNull() ? "" : cycle.asText(),
                integer(obj, "decided_ms"), integer(obj, "expires_ms"), avoid);
    }

    private static long integer(JsonNode obj, String key) throws InvalidListException {
        JsonNode v = obj.get(key);
        if (v == null || !v.isIntegralNumber() || !v.canConvertToLong()) {
            throw new InvalidListException("avoidance list field '" + key + "' must be an integer, got " + v);
        }
        return v.asLong();
    }

    private static String text(JsonNode obj, String key) throws InvalidListException {
        JsonNode v = obj.get(key);
        if (v == null || !v.isTextual() || v.asText().isEmpty()) {
            throw new InvalidListException("avoidance list field '" + key + "' must be a non-empty string, got " + v);
        }
        return v.asText();
    }

    /** Newer by (decided_ms, cycle id: numeric ids by value, others after none). */
    public boolean newerThan(AvoidanceList other) {
        if (decidedMs != other.decidedMs) {
            return decidedMs > other.decidedMs;
        }
        return compareCycle(cycleId, other.cycleId) > 0;
    }

    private static int compareCycle(String a, String b) {
        boolean na = !a.isEmpty() && a.chars().allMatch(Character::isDigit);
        boolean nb = !b.isEmpty() && b.chars().allMatch(Character::isDigit);
        if (na && nb) {
            return new java.math.BigInteger(a).compareTo(new java.math.BigInteger(b));
        }
        if (na != nb) {
            return na ? 1 : -1;
        }
        return a.compareTo(b);
    }

    /** Broker -> avoid-until for the entries in force: now < min(avoid_until, entry and list expiry). */
    public Map<String, Long> avoidedAt(long nowMs) {
        Map<String, Long> out = new HashMap<>();
        if (nowMs >= expiresMs) {
            return out;
        }
        for (Entry e : avoid) {
            long until = Math.min(e.avoidUntilMs, Math.min(e.expiresMs, expiresMs));
            if (nowMs < until) {
                out.merge(e.brokerName, until, Math::max);
            }
        }
        return out;
    }
}
