package io.faultwatch.rocketmq.hook;

import java.lang.ref.WeakReference;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.concurrent.ConcurrentLinkedDeque;
import java.util.concurrent.atomic.AtomicLong;
import java.util.logging.Logger;

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
 * client sets once and keeps across retries. The send thread only captures the attempt's fields into a
 * small record and offers it to the {@link EventSink}, whose own thread encodes and sends it. The same
 * jar runs with RocketMQ's 4.9.x and 5.x clients.
 */
public final class FaultwatchSendHook implements SendMessageHook, AutoCloseable {
    public static final String DEFAULT_TOPIC = "rmq.send-results";
    private static final String START_KEY = "faultwatch.start.nanos";
    private static final Logger LOG = Logger.getLogger(FaultwatchSendHook.class.getName());

    private final EventSink sink;
    // Event ids: one random prefix per hook, then a counter (no SecureRandom on the send path).
    private final SendEvent.Origin origin;
    private final AtomicLong idCounter = new AtomicLong();
    private final ThreadLocal<SendThread> sendThread = ThreadLocal.withInitial(SendThread::new);
    // The event of this thread's last synchronous attempt, until the client's updateFaultItem completes it.
    private final ThreadLocal<SendEvent> pending = new ThreadLocal<>();
    // The tapped producers, copied on install so the send path reads them without a lock.
    private volatile WeakReference<?>[] tapped = new WeakReference<?>[0];
    // The client's own removals of fault items, newest last (at most MAX_REMOVALS kept).
    private final ConcurrentLinkedDeque<Removal> removals = new ConcurrentLinkedDeque<>();
    private final AtomicLong removalCount = new AtomicLong();
    static final int MAX_REMOVALS = 1024;
    static final long REMOVAL_LOG_INTERVAL_MS = 60_000;
    private final AtomicLong lastRemovalLogMs = new AtomicLong(Long.MIN_VALUE / 2);

    /**
     * A fault item the client dropped from its table by itself: 4.9.x's {@code pickOneAtLeast} fallback
     * (every broker of the route unavailable) removes the item of a picked broker that has no write
     * queues, i.e. one that has left the topic's route. No send shows that, so faultwatch, which replays
     * the table from send events, keeps that broker's window to its end; while the broker stays out of
     * the route the window cannot change what the producer picks, but once it is back the client sends
     * to it and faultwatch still counts it avoided. So the next event of the thread that removed it
     * (the attempt the fallback selected for) carries the removal, and faultwatch ends the window there;
     * the hook also keeps the newest removals for an operator (and faultwatch's lab) to read.
     */
    public static final class Removal {
        public final String broker;
        /** The hook's clock just after the client removed the item. */
        public final long atMs;

        Removal(String broker, long atMs) {
            this.broker = broker;
            this.atMs = atMs;
        }
    }

    /**
     * This thread's last message id and its attempt number, and the synchronous attempt it has begun
     * (the client calls a synchronous attempt's before and after hooks on the sending thread).
     */
    private static final class SendThread {
        String id;
        int attempt;
        SendMessageContext started;
        long startNanos;
        // The item the client removed on this thread since its last event (the attempt it selected for).
        Removal removed;
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
        this.sink = sink;
        this.origin = new SendEvent.Origin(UUID.randomUUID() + "-", cluster, clientVersion());
        warmUp();
    }

    /**
     * Loads and initialises what the after-call uses before the first send: the client times each
     * attempt around the hook, so a slow first call (class loading) would be counted as
     * broker latency and could open an avoidance window that the events cannot show.
     */
    private void warmUp() {
        try {
            SendEvent sample = new SendEvent(origin, 0L, System.currentTimeMillis(), "warm-up", "warm-up", "warm-up",
                    "warm-up", 0, null, 0L, "warm-up", 0L, 0, null);
            sample.reachable = Boolean.TRUE;
            Long.parseLong(Long.toString(System.nanoTime()));
            tapped((DefaultMQProducerImpl) null);
            attempt(null);
            sendThread.remove();
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
        addTapped(impl);
        return true;
    }

    /** True when {@code producer}'s events carry the client's own latency (see {@link #install}). */
    public boolean tapped(DefaultMQProducer producer) {
        return tapped(producer.getDefaultMQProducerImpl());
    }

    private boolean tapped(DefaultMQProducerImpl impl) {
        for (WeakReference<?> ref : tapped) {
            if (ref.get() == impl && impl != null) {
                return true;
            }
        }
        return false;
    }

    private synchronized void addTapped(DefaultMQProducerImpl impl) {
        if (tapped(impl)) {
            return;
        }
        int live = 0;
        WeakReference<?>[] next = new WeakReference<?>[tapped.length + 1];
        for (WeakReference<?> ref : tapped) {
            if (ref.get() != null) {
                next[live++] = ref;
            }
        }
        next[live++] = new WeakReference<>(impl);
        tapped = Arrays.copyOf(next, live);
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
        SendEvent left = pending.get();
        if (left != null) { // the client never fed the last attempt back (it left by an unchecked exception)
            pending.remove();
            offer(left);
        }
        if (ctx.getCommunicationMode() == CommunicationMode.SYNC) {
            SendThread t = sendThread.get();
            t.started = ctx;
            t.startNanos = System.nanoTime();
            return;
        }
        // Other modes may run the after hook on another thread: the start travels in the context.
        Map<String, String> props = ctx.getProps();
        if (props == null) {
            props = new HashMap<>();
            ctx.setProps(props);
        }
        props.put(START_KEY, Long.toString(System.nanoTime()));
    }

    /** When the attempt of {@code ctx} began (System.nanoTime), or -1 when this hook never saw it begin. */
    private long started(SendMessageContext ctx) {
        SendThread t = sendThread.get();
        if (t.started == ctx) {
            t.started = null;
            return t.startNanos;
        }
        Map<String, String> props = ctx.getProps();
        String start = props == null ? null : props.remove(START_KEY);
        return start == null ? -1L : Long.parseLong(start);
    }

    @Override
    public void sendMessageAfter(SendMessageContext ctx) {
        try {
            long end = System.nanoTime();
            long start = started(ctx);
            if (start < 0 || ctx.getMq() == null) {
                return; // an asynchronous send's second after-call, or a context we never saw start
            }
            long latencyMs = Math.max(0, (end - start) / 1_000_000L);
            SendEvent event = event(ctx, latencyMs, attempt(ctx.getMessage()));
            if (awaitsClient(ctx, event)) {
                pending.set(event);
            } else {
                offer(event);
            }
        } catch (Exception | LinkageError e) {
            // Never fail the application's send because of faultwatch.
        }
    }

    /** A synchronous attempt of a tapped producer whose client will call its fault table next. */
    private boolean awaitsClient(SendMessageContext ctx, SendEvent event) {
        return ctx.getCommunicationMode() == CommunicationMode.SYNC
                && Boolean.TRUE.equals(event.faultEnable)
                && tapped(ctx.getProducer());
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
        SendEvent p = pending.get();
        if (p == null) {
            return; // not a send of this thread's (the feed's writes), or an attempt no hook saw
        }
        pending.remove();
        try {
            if (p.broker.equals(broker)) {
                long start = tap.startTimestamp(broker);
                long afterMs = System.currentTimeMillis();
                boolean written = start >= beforeMs + durationMs && start <= afterMs + durationMs;
                p.tsMs = written ? start - durationMs : beforeMs;
                p.latencyMs = latencyMs;
                if (reachable != null) {
                    p.reachable = reachable;
                }
            }
            offer(p);
        } catch (Exception | LinkageError e) {
            // Never fail the application's send because of faultwatch.
        }
    }

    /** The tap saw the client {@code remove} its item for {@code broker} (see {@link Removal}). */
    void clientRemoved(String broker, long atMs) {
        Removal removal = new Removal(broker, atMs);
        sendThread.get().removed = removal; // the next event of this thread carries it
        removals.addLast(removal);
        long count = removalCount.incrementAndGet();
        while (removals.size() > MAX_REMOVALS) {
            removals.pollFirst();
        }
        long last = lastRemovalLogMs.get();
        if (atMs - last >= REMOVAL_LOG_INTERVAL_MS && lastRemovalLogMs.compareAndSet(last, atMs)) {
            LOG.info("faultwatch send hook: the RocketMQ client removed its fault item for " + broker
                    + " by itself (4.9's fallback: every routed broker unavailable, " + broker + " outside the route); "
                    + "this thread's next event tells faultwatch (" + count + " such removals so far)");
        }
    }

    /** The client's own removals of fault items seen so far (the newest {@value #MAX_REMOVALS}), oldest first. */
    public List<Removal> removals() {
        return new ArrayList<>(removals);
    }

    /** How many fault items the tapped clients removed by themselves since this hook was made. */
    public long removalCount() {
        return removalCount.get();
    }

    private void offer(SendEvent event) {
        try {
            sink.offer(event);
        } catch (RuntimeException | LinkageError e) {
            // an event that cannot be queued is lost, never the application's send
        }
    }

    private int attempt(Message msg) {
        String id = msg == null ? null : msg.getProperty(MessageConst.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX);
        SendThread last = sendThread.get();
        int attempt = id != null && id.equals(last.id) ? last.attempt + 1 : 0;
        last.id = id;
        last.attempt = attempt;
        return attempt;
    }

    private SendEvent event(SendMessageContext ctx, long latencyMs, int attempt) {
        SendResult result = ctx.getSendResult();
        Exception error = ctx.getException();
        boolean ok = error == null && result != null;
        SendEvent event = new SendEvent(origin, idCounter.incrementAndGet(), System.currentTimeMillis(),
                ctx.getProducerGroup(), clientId(ctx.getProducer()), ctx.getMq().getTopic(), ctx.getMq().getBrokerName(),
                ctx.getMq().getQueueId(), ok ? result.getSendStatus().name() : null, latencyMs,
                ok ? null : describe(error), ok ? result.getQueueOffset() : 0L, attempt, faultEnable(ctx.getProducer()));
        SendThread t = sendThread.get();
        if (t.removed != null) {
            event.removed = t.removed;
            t.removed = null;
        }
        return event;
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
