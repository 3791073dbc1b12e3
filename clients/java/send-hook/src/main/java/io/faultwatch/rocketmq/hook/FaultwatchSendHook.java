package io.faultwatch.rocketmq.hook;

import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicLong;

import com.fasterxml.jackson.databind.ObjectMapper;

import org.apache.rocketmq.client.hook.SendMessageContext;
import org.apache.rocketmq.client.hook.SendMessageHook;
import org.apache.rocketmq.client.impl.producer.DefaultMQProducerImpl;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.MQVersion;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageConst;

/**
 * faultwatch's send hook: one {@code send_result} v1 event per send attempt, to Kafka.
 *
 * The hook context carries no latency, so the hook times each attempt itself between its before and
 * after calls (the after call runs just before the client's own {@code updateFaultItem} for that
 * attempt). The attempt number comes from the message's unique id, which the client sets once and
 * keeps across retries. Install it with {@code producer.getDefaultMQProducerImpl()
 * .registerSendMessageHook(new FaultwatchSendHook(cluster, bootstrap))}. The same jar runs with
 * RocketMQ's 4.9.x and 5.x clients.
 */
public final class FaultwatchSendHook implements SendMessageHook, AutoCloseable {
    public static final String DEFAULT_TOPIC = "rmq.send-results";
    private static final String START_KEY = "faultwatch.start.nanos";
    private static final ObjectMapper JSON = new ObjectMapper();

    private final String cluster;
    private final EventSink sink;
    private final String clientVersion = clientVersion();
    private final ThreadLocal<String[]> lastMessage = ThreadLocal.withInitial(() -> new String[] {null, "0"});
    // Event ids: one random prefix per hook, then a counter (no SecureRandom on the send path).
    private final String idPrefix = UUID.randomUUID().toString() + "-";
    private final AtomicLong idCounter = new AtomicLong();

    public FaultwatchSendHook(String cluster, String kafkaBootstrap) {
        this(cluster, new EventSink(kafkaBootstrap, DEFAULT_TOPIC, 100_000, 60_000, null));
    }

    public FaultwatchSendHook(String cluster, String kafkaBootstrap, String topic, int capacity, Properties kafka) {
        this(cluster, new EventSink(kafkaBootstrap, topic, capacity, 60_000, kafka));
    }

    public FaultwatchSendHook(String cluster, EventSink sink) {
        if (cluster == null || cluster.isEmpty()) {
            throw new IllegalArgumentException("faultwatch send hook: cluster must be a non-empty name");
        }
        this.cluster = cluster;
        this.sink = sink;
        warmUp();
    }

    /**
     * Loads and initialises what the after-call uses before the first send: the client times each
     * attempt around the hook, so a slow first call (class loading, JSON set-up) would be counted as
     * broker latency and could open an avoidance window that the events cannot show.
     */
    private void warmUp() {
        try {
            Map<String, Object> sample = new LinkedHashMap<>();
            sample.put("event_id", idPrefix + "warm-up");
            sample.put("latency_ms", 0L);
            sample.put("error", null);
            JSON.writeValueAsBytes(sample);
            Long.parseLong(Long.toString(System.nanoTime()));
            attempt(null);
            lastMessage.remove();
        } catch (Exception e) {
            // only a warm-up
        }
    }

    public EventSink sink() {
        return sink;
    }

    @Override
    public String hookName() {
        return "faultwatch-send-result";
    }

    @Override
    public void sendMessageBefore(SendMessageContext ctx) {
        Map<String, String> props = ctx.getProps();
        if (props == null) {
            props = new HashMap<>();
            ctx.setProps(props);
        }
        props.put(START_KEY, Long.toString(System.nanoTime()));
    }

    @Override
    public void sendMessageAfter(SendMessageContext ctx) {
        try {
            long end = System.nanoTime();
            Map<String, String> props = ctx.getProps();
            String start = props == null ? null : props.remove(START_KEY);
            if (start == null || ctx.getMq() == null) {
                return; // an asynchronous send's second after-call, or a context we never saw start
            }
            long latencyMs = Math.max(0, (end - Long.parseLong(start)) / 1_000_000L);
            Map<String, Object> event = event(ctx, latencyMs, attempt(ctx.getMessage()));
            sink.offer(ctx.getMq().getBrokerName().getBytes(StandardCharsets.UTF_8), JSON.writeValueAsBytes(event));
        } catch (Exception | LinkageError e) {
            // Never fail the application's send because of faultwatch.
        }
    }

    private int attempt(Message msg) {
        String id = msg == null ? null : msg.getProperty(MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX);
        String[] last = lastMessage.get();
        int attempt = id != null && id.equals(last[0]) ? Integer.parseInt(last[1]) + 1 : 0;
        last[0] = id;
        last[1] = Integer.toString(attempt);
        return attempt;
    }

    private Map<String, Object> event(SendMessageContext ctx, long latencyMs, int attempt) {
        SendResult result = ctx.getSendResult();
        Exception error = ctx.getException();
        Map<String, Object> e = new LinkedHashMap<>();
        e.put("schema_version", 1);
        e.put("event_id", idPrefix + idCounter.incrementAndGet());
        e.put("ts_ms", System.currentTimeMillis());
        e.put("cluster", cluster);
        e.put("producer_group", ctx.getProducerGroup());
        e.put("client_id", clientId(ctx.getProducer()));
        e.put("client_version", clientVersion);
        e.put("topic", ctx.getMq().getTopic());
        e.put("broker_name", ctx.getMq().getBrokerName());
        e.put("queue_id", ctx.getMq().getQueueId());
        boolean ok = error == null && result != null;
        e.put("status", ok ? result.getSendStatus().name() : "FAILED");
        e.put("latency_ms", latencyMs);
        e.put("error", ok ? null : describe(error));
        e.put("queue_offset", ok ? result.getQueueOffset() : null);
        e.put("attempt", attempt);
        e.put("send_latency_fault_enable", faultEnable(ctx.getProducer()));
        return e;
    }

    static String describe(Exception error) {
        if (error == null) {
            return "no send result";
        }
        String text = error.getClass().getSimpleName() + ": " + error.getMessage();
        return text.length() > 2000 ? text.substring(0, 2000) : text;
    }

    private static String clientId(DefaultMQProducerImpl impl) {
        try {
            return impl.getMqClientFactory().getClientId();
        } catch (RuntimeException e) {
            return "unknown";
        }
    }

    private static Boolean faultEnable(DefaultMQProducerImpl impl) {
        try {
            return impl.isSendLatencyFaultEnable();
        } catch (RuntimeException | LinkageError e) {
            return null;
        }
    }

    /** "V4_9_8" -> "4.9.8", the form the fault tables are chosen by. */
    static String clientVersion() {
        // Read at run time: the application's client jar, not the one this hook was compiled against.
        String desc = MQVersion.getVersionDesc(MQVersion.CURRENT_VERSION);
        return desc.replaceFirst("^V", "").replace('_', '.').replace(".SNAPSHOT", "-SNAPSHOT");
    }

    @Override
    public void close() {
        sink.close();
    }
}
