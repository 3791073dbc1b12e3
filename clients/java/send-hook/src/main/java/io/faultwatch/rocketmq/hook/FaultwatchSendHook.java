package io.faultwatch.rocketmq.hook;

import java.nio.charset.StandardCharsets;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.WeakHashMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.logging.Logger;

import com.fasterxml.jackson.databind.ObjectMapper;

import org.apache.rocketmq.client.hook.SendMessageContext;
import org.apache.rocketmq.client.hook.SendMessageHook;
import org.apache.rocketmq.client.impl.CommunicationMode;
import org.apache.rocketmq.client.impl.producer.DefaultMQProducerImpl;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.MQVersion;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageConst;

/**
 * faultwatch's send hook: one {@code send_result} v1 event per send attempt, to Kafka.
 *
 * Install it with {@link #install(DefaultMQProducer)}: that registers the hook and a tap on the
 * producer's fault strategy ({@link ClientLatencyTap}), so each synchronous attempt's event carries
 * the latency the client itself charged it with and the client's own clock reading when it updated
 * its fault table: the window faultwatch computes from the event is then the client's, to the
 * millisecond. Where the tap cannot help (fault tolerance off: the client never calls its table;
 * asynchronous sends; a hook registered by hand with {@code registerSendMessageHook}), the hook
 * times the attempt itself between its before and after calls, which sees a little less of the
 * attempt than the client does. The attempt number comes from the message's unique id, which the
 * client sets once and keeps across retries. The same jar runs with RocketMQ's 4.9.x and 5.x clients.
 */
public final class FaultwatchSendHook implements SendMessageHook, AutoCloseable {
    public static final String DEFAULT_TOPIC = "rmq.send-results";
    private static final String START_KEY = "faultwatch.start.nanos";
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final Logger LOG = Logger.getLogger(FaultwatchSendHook.class.getName());

    private final String cluster;
    private final EventSink sink;
    private final String clientVersion = clientVersion();
    private final ThreadLocal<String[]> lastMessage = ThreadLocal.withInitial(() -> new String[] {null, "0"});
    // Event ids: one random prefix per hook, then a counter (no SecureRandom on the send path).
    private final String idPrefix = UUID.randomUUID().toString() + "-";
    private final AtomicLong idCounter = new AtomicLong();
    // The event of this thread's last synchronous attempt, until the client's updateFaultItem completes it.
    private final ThreadLocal<Pending> pending = new ThreadLocal<>();
    private final Map<DefaultMQProducerImpl, Boolean> tapped = Collections.synchronizedMap(new WeakHashMap<>());

    private static final class Pending {
        final String broker;
        final Map<String, Object> event;

        Pending(String broker, Map<String, Object> event) {
            this.broker = broker;
            this.event = event;
        }
    }

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

    /**
     * Registers this hook on {@code producer} and taps its fault strategy so the events carry the
     * client's own latency and timestamp (before or after {@code start()}). Returns false, and logs
     * why, when this client keeps its fault table where the tap cannot reach it: the hook is still
     * registered and times attempts itself.
     */
    public boolean install(DefaultMQProducer producer) {
        DefaultMQProducerImpl impl = producer.getDefaultMQProducerImpl();
        impl.registerSendMessageHook(this);
        try {
            ClientLatencyTap.install(impl, this);
        } catch (ReflectiveOperationException | RuntimeException e) {
            LOG.warning("faultwatch send hook: cannot tap the fault strategy of producer " + producer.getProducerGroup()
                    + " (" + e + "); its events carry the hook's own timing");
            return false;
        }
        tapped.put(impl, Boolean.TRUE);
        return true;
    }

    /** True when {@code producer}'s events carry the client's own latency (see {@link #install}). */
    public boolean tapped(DefaultMQProducer producer) {
        return tapped.containsKey(producer.getDefaultMQProducerImpl());
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
        Pending left = pending.get();
        if (left != null) { // the client never fed the last attempt back (it left by an unchecked exception)
            pending.remove();
            offer(left);
        }
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
            Pending p = new Pending(ctx.getMq().getBrokerName(), event);
            if (awaitsClient(ctx, event)) {
                pending.set(p);
            } else {
                offer(p);
            }
        } catch (Exception | LinkageError e) {
            // Never fail the application's send because of faultwatch.
        }
    }

    /** A synchronous attempt of a tapped producer whose client will call its fault table next. */
    private boolean awaitsClient(SendMessageContext ctx, Map<String, Object> event) {
        return ctx.getCommunicationMode() == CommunicationMode.SYNC
                && Boolean.TRUE.equals(event.get("send_latency_fault_enable"))
                && tapped.containsKey(ctx.getProducer());
    }

    /**
     * The client's {@code updateFaultItem(broker, latency, duration[, reachable])}, seen by the tap just
     * after the client's table took it. Completes this thread's pending event for that broker with the
     * client's latency and with the client's clock reading: the item's new avoid-until minus the
     * duration, when the item shows the client wrote it during this call; else the tap's reading just
     * before the call (5.x leaves an item alone unless the window grows, and no earlier time can make
     * faultwatch grow a window the client did not).
     */
    void clientUpdated(String broker, long latencyMs, long durationMs, Boolean reachable, long beforeMs,
                       ClientLatencyTap tap) {
        Pending p = pending.get();
        if (p == null) {
            return; // not a send of this thread's (the feed's writes), or an attempt no hook saw
        }
        pending.remove();
        try {
            if (p.broker.equals(broker)) {
                long start = tap.startTimestamp(broker);
                long afterMs = System.currentTimeMillis();
                boolean written = start >= beforeMs + durationMs && start <= afterMs + durationMs;
                p.event.put("ts_ms", written ? start - durationMs : beforeMs);
                p.event.put("latency_ms", latencyMs);
                if (reachable != null) {
                    p.event.put("reachable", reachable);
                }
            }
            offer(p);
        } catch (Exception | LinkageError e) {
            // Never fail the application's send because of faultwatch.
        }
    }

    private void offer(Pending p) {
        try {
            sink.offer(p.broker.getBytes(StandardCharsets.UTF_8), JSON.writeValueAsBytes(p.event));
        } catch (Exception | LinkageError e) {
            // an event that cannot be encoded is lost, never the application's send
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
