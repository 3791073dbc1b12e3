package io.faultwatch.rocketmq.hook;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;
import java.util.logging.Logger;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;

import org.apache.kafka.clients.producer.Callback;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.errors.RetriableException;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * A bounded queue of events and the one thread that encodes them and hands them to a Kafka producer.
 *
 * The application's send thread only ever offers to the queue, lock-free: when it is full the oldest
 * event is dropped and counted, so a Kafka outage costs memory up to the bound and never blocks or
 * fails a RocketMQ send. The sink thread is not woken per event: it drains the queue in batches every
 * 50 milliseconds (sooner when a batch fills), writes each event's JSON there and hands it to Kafka,
 * whose client gathers them into large lz4 batches.
 * An event the Kafka client cannot take yet (no metadata or buffer space within max.block.ms) is held
 * and tried again on the next pass, so a Kafka that is slow to answer while a host starts costs no
 * event; records the Kafka client could not deliver are counted as drops. Drops are logged at most
 * once per interval, with the total so far.
 */
public final class EventSink implements AutoCloseable {
    private static final Logger LOG = Logger.getLogger(EventSink.class.getName());
    private static final JsonFactory JSON = new JsonFactory();
    /** Events the sink thread takes per pass; offering the one that fills a batch wakes it. */
    static final int BATCH = 512;
    /**
     * How long the sink thread waits for a batch to fill before it sends what it has. Each wake-up of
     * this thread and of the Kafka client's is CPU taken from the application on a busy host, so both
     * wait for many events at a time (the Kafka client's linger.ms is the other wait).
     */
    static final long WAIT_NANOS = TimeUnit.MILLISECONDS.toNanos(50);

    private final String topic;
    private final int capacity;
    private final ConcurrentLinkedQueue<Object> queue = new ConcurrentLinkedQueue<>();
    private final AtomicInteger size = new AtomicInteger();
    private final KafkaProducer<byte[], byte[]> producer;
    private final Thread sender;
    private final long logIntervalMs;
    private final AtomicLong offered = new AtomicLong();
    private final AtomicLong dropped = new AtomicLong();
    private final AtomicLong delivered = new AtomicLong();
    // Events that left the queue for good: handed to Kafka, failed there, or dropped as the oldest.
    private final AtomicLong settled = new AtomicLong();
    private final ByteArrayOutputStream buffer = new ByteArrayOutputStream(1024);
    private final Callback onDelivery = (meta, err) -> {
        if (err == null) {
            delivered.incrementAndGet();
        } else {
            failed(err);
        }
    };
    private volatile boolean closing;
    // An event Kafka could not take yet, sent before the queue's next (the sink's thread only).
    private Object held;
    // Why the last event that did not reach Kafka was lost (null while none was).
    private volatile String lastFailure;
    private long lastLogMs;
    private long lastLoggedDrops;

    public EventSink(String bootstrap, String topic, int capacity, long logIntervalMs, Properties extra) {
        if (capacity <= 0) {
            throw new IllegalArgumentException("faultwatch send hook: queue capacity must be > 0, got " + capacity);
        }
        this.topic = topic;
        this.capacity = capacity;
        this.logIntervalMs = logIntervalMs;
        this.producer = new KafkaProducer<>(producerConfig(bootstrap, extra), new ByteArraySerializer(),
                new ByteArraySerializer());
        this.sender = new Thread(this::run, "faultwatch-send-hook-sink");
        this.sender.setDaemon(true);
        this.sender.start();
    }

    static Properties producerConfig(String bootstrap, Properties extra) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.ACKS_CONFIG, "1");
        // lz4: a fraction of zstd's CPU per batch (zstd sets up a large context for each); the job reads both.
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "lz4");
        // Few, large requests: the Kafka client's thread costs per wake-up and request far more than per record.
        p.put(ProducerConfig.LINGER_MS_CONFIG, "200");
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, String.valueOf(256 * 1024));
        p.put(ProducerConfig.BUFFER_MEMORY_CONFIG, String.valueOf(8L * 1024 * 1024));
        // The sender thread may wait this long for metadata or buffer space; the app never does.
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "1000");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "30000");
        p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "false");
        p.put(ProducerConfig.CLIENT_ID_CONFIG, "faultwatch-send-hook");
        if (extra != null) {
            p.putAll(extra);
        }
        return p;
    }

    /** Queue one encoded event (key, value); never blocks. */
    public void offer(byte[] key, byte[] value) {
        enqueue(new byte[][] {key, value});
    }

    /** Queue one event, encoded later on the sink's thread; never blocks. */
    void offer(SendEvent event) {
        enqueue(event);
    }

    private void enqueue(Object item) {
        offered.incrementAndGet();
        queue.offer(item);
        int n = size.incrementAndGet();
        boolean dropping = false;
        while (n > capacity && queue.poll() != null) { // the oldest goes
            n = size.decrementAndGet();
            dropped.incrementAndGet();
            settled.incrementAndGet();
            dropping = true;
        }
        if (n == BATCH) {
            LockSupport.unpark(sender);
        }
        if (dropping) {
            maybeLogDrops();
        }
    }

    public long offered() {
        return offered.get();
    }

    public long dropped() {
        return dropped.get();
    }

    public long delivered() {
        return delivered.get();
    }

    public int queued() {
        return Math.max(0, size.get());
    }

    private void run() {
        while (!Thread.currentThread().isInterrupted()) {
            int sent = drain();
            maybeLogDrops();
            if (sent == 0 && closing) {
                return;
            }
            if (sent < BATCH && !closing) {
                LockSupport.parkNanos(this, WAIT_NANOS);
            }
        }
    }

    /**
     * Encodes and sends up to one batch of queued events; returns how many it took from the queue. An
     * event Kafka cannot take yet is held and tried first on the next pass.
     */
    private int drain() {
        if (held != null) {
            Object item = held;
            held = null;
            if (!send(item)) {
                held = item;
                return 0;
            }
            settled.incrementAndGet();
        }
        int taken = 0;
        Object item;
        while (taken < BATCH && (item = queue.poll()) != null) {
            size.decrementAndGet();
            taken++;
            if (!send(item)) {
                held = item;
                break;
            }
            settled.incrementAndGet();
        }
        return taken;
    }

    /** False when Kafka could not take the event yet (the caller holds it); a lost event is counted. */
    private boolean send(Object item) {
        byte[] key;
        byte[] value;
        try {
            if (item instanceof SendEvent) {
                SendEvent e = (SendEvent) item;
                key = e.broker.getBytes(StandardCharsets.UTF_8);
                value = encode(e);
            } else {
                key = ((byte[][]) item)[0];
                value = ((byte[][]) item)[1];
            }
        } catch (IOException | RuntimeException e) {
            failed(e); // an event that cannot be encoded is lost, and counted
            return true;
        }
        try {
            producer.send(new ProducerRecord<>(topic, key, value), onDelivery);
        } catch (RetriableException e) {
            // No metadata or buffer space within max.block.ms (Kafka away, or slow while a host starts):
            // the event waits for the next pass; the queue's bound still drops the oldest behind it.
            if (!closing) {
                lastFailure = e.toString();
                return false;
            }
            failed(e);
        } catch (RuntimeException e) {
            failed(e);
        }
        return true;
    }

    private void failed(Exception e) {
        lastFailure = e.toString();
        dropped.incrementAndGet();
    }

    /** Why the last event lost on the way to Kafka was lost (not one dropped as the oldest); null if none was. */
    public String lastFailure() {
        return lastFailure;
    }

    /** The event's JSON (the sink's thread only: it reuses one buffer). */
    byte[] encode(SendEvent e) throws IOException {
        buffer.reset();
        try (JsonGenerator g = JSON.createGenerator(buffer)) {
            e.writeJson(g);
        }
        return buffer.toByteArray();
    }

    private void maybeLogDrops() {
        long now = System.currentTimeMillis();
        long drops = dropped.get();
        synchronized (this) {
            if (drops == lastLoggedDrops || now - lastLogMs < logIntervalMs) {
                return;
            }
            lastLogMs = now;
            lastLoggedDrops = drops;
        }
        LOG.warning("faultwatch send hook: " + drops + " events dropped so far (Kafka " + topic
                + " unreachable or slow; queue bound " + capacity + "; last failure: " + lastFailure + ")");
    }

    /** Waits up to {@code timeoutMs} for the queue to drain into Kafka, then closes the producer. */
    @Override
    public void close() {
        close(5000);
    }

    public void close(long timeoutMs) {
        closing = true;
        LockSupport.unpark(sender);
        try {
            sender.join(timeoutMs);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        producer.close(Duration.ofMillis(timeoutMs));
    }

    /** Blocks until everything offered so far was handed to Kafka and acknowledged (tests, shutdown). */
    public void flush() {
        long target = offered.get();
        long deadline = System.currentTimeMillis() + 30000;
        LockSupport.unpark(sender);
        while (settled.get() < target && System.currentTimeMillis() < deadline) {
            try {
                Thread.sleep(1);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return;
            }
        }
        producer.flush();
    }
}
