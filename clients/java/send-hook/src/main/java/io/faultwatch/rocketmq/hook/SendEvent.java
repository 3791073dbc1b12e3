package io.faultwatch.rocketmq.hook;

import java.io.IOException;

import com.fasterxml.jackson.core.JsonGenerator;

/**
 * One send attempt's {@code send_result} v1 event, as the fields the send thread captured.
 *
 * The application's thread only fills these fields (a few references and primitives) and offers the
 * record to the {@link EventSink}; the sink's own thread writes the JSON, so no encoding runs on the
 * send path. Until it is offered, the tap may still complete the record with the client's latency,
 * clock reading and reachability.
 */
final class SendEvent {
    /** What is the same for every event of one hook. */
    static final class Origin {
        final String idPrefix;
        final String cluster;
        final String clientVersion;

        Origin(String idPrefix, String cluster, String clientVersion) {
            this.idPrefix = idPrefix;
            this.cluster = cluster;
            this.clientVersion = clientVersion;
        }
    }

    final Origin origin;
    final long seq;
    long tsMs;
    final String producerGroup;
    final String clientId;
    final String topic;
    final String broker;
    final int queueId;
    /** The send status's name; null for a failed attempt. */
    final String status;
    long latencyMs;
    final String error;
    final long queueOffset;
    final int attempt;
    final Boolean faultEnable;
    /** Set by the tap from a 5.x client's {@code reachable} argument; absent from the JSON when null. */
    Boolean reachable;
    /** A fault item the client removed by itself just before this attempt; absent from the JSON when null. */
    FaultwatchSendHook.Removal removed;

    SendEvent(Origin origin, long seq, long tsMs, String producerGroup, String clientId, String topic,
              String broker, int queueId, String status, long latencyMs, String error, long queueOffset,
              int attempt, Boolean faultEnable) {
        this.origin = origin;
        this.seq = seq;
        this.tsMs = tsMs;
        this.producerGroup = producerGroup;
        this.clientId = clientId;
        this.topic = topic;
        this.broker = broker;
        this.queueId = queueId;
        this.status = status;
        this.latencyMs = latencyMs;
        this.error = error;
        this.queueOffset = queueOffset;
        this.attempt = attempt;
        this.faultEnable = faultEnable;
    }

    /** Writes the event as one JSON object, fields in the contract's order. */
    void writeJson(JsonGenerator g) throws IOException {
        g.writeStartObject();
        g.writeNumberField("schema_version", 1);
        g.writeStringField("event_id", origin.idPrefix + seq);
        g.writeNumberField("ts_ms", tsMs);
        g.writeStringField("cluster", origin.cluster);
        g.writeStringField("producer_group", producerGroup);
        g.writeStringField("client_id", clientId);
        g.writeStringField("client_version", origin.clientVersion);
        g.writeStringField("topic", topic);
        g.writeStringField("broker_name", broker);
        g.writeNumberField("queue_id", queueId);
        boolean ok = status != null;
        g.writeStringField("status", ok ? status : "FAILED");
        g.writeNumberField("latency_ms", latencyMs);
        g.writeStringField("error", error); // null for a successful attempt
        g.writeFieldName("queue_offset");
        if (ok) {
            g.writeNumber(queueOffset);
        } else {
            g.writeNull();
        }
        g.writeNumberField("attempt", attempt);
        g.writeFieldName("send_latency_fault_enable");
        if (faultEnable == null) {
            g.writeNull();
        } else {
            g.writeBoolean(faultEnable);
        }
        if (reachable != null) {
            g.writeBooleanField("reachable", reachable);
        }
        if (removed != null) {
            g.writeStringField("fault_item_removed", removed.broker);
            g.writeNumberField("fault_item_removed_ms", removed.atMs);
        }
        g.writeEndObject();
    }
}
