package io.faultwatch.rocketmq.hook;

import java.util.ArrayDeque;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;
import java.util.logging.Logger;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * A bounded queue of encoded events and the one thread that hands them to a Kafka producer.
 *
 * The application's send thread only ever offers to the queue: when it is full the oldest event is
 * dropped and counted, so a Kafka outage costs memory up to the bound and never blocks or fails a
 * RocketMQ send. Records the Kafka client could not deliver are counted as drops too. Drops are
 * logged at most once per interval, with the total so far.
 */
public final class EventSink implements AutoCloseable {
    private static final Logger LOG = Logger.getLogger(EventSink.class.getName());

    private final String topic;
    private final int capacity;
    private final ArrayDeque<byte[][]> queue;
    private final KafkaProducer<byte[], byte[]> producer;
    private final Thread sender;
    private final long logIntervalMs;
    private final AtomicLong offered = new AtomicLong();
    private final AtomicLong dropped = new AtomicLong();
    private final AtomicLong delivered = new AtomicLong();
    private volatile boolean closing;
    private long lastLogMs;
    private long lastLoggedDrops;

    public EventSink(String bootstrap, String topic, int capacity, long logIntervalMs, Properties extra) {
        if (capacity <= 0) {
            throw new IllegalArgumentException("faultwatch send hook: queue capacity must be > 0, got " + capacity);
        }
        this.topic = topic;
        this.capacity = capacity;
        this.queue = new ArrayDeque<>(Math.min(capacity, 4096));
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
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "zstd");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "50");
        p.put(ProducerConfig.BATCH_SIZE_CONFIG, "65536");
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

    /** Queue one event (key, value); never blocks. */
    public void offer(byte[] key, byte[] value) {
        offered.incrementAndGet();
        synchronized (queue) {
            if (queue.size() >= capacity) {
                queue.pollFirst();
                dropped.incrementAndGet();
            }
            queue.addLast(new byte[][] {key, value});
            queue.notify();
        }
        maybeLogDrops();
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
        synchronized (queue) {
            return queue.size();
        }
    }

    private void run() {
        while (true) {
            byte[][] next;
            synchronized (queue) {
                while (queue.isEmpty() && !closing) {
                    try {
                        queue.wait(200);
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                        return;
                    }
                }
                if (queue.isEmpty()) {
                    return;
                }
                next = queue.pollFirst();
            }
            try {
                producer.send(new ProducerRecord<>(topic, next[0], next[1]), (meta, err) -> {
                    if (err == null) {
                        delivered.incrementAndGet();
                    } else {
                        dropped.incrementAndGet();
                    }
                });
            } catch (RuntimeException e) {
                dropped.incrementAndGet();
            }
            maybeLogDrops();
        }
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
                + " unreachable or slow; queue bound " + capacity + ")");
    }

    /** Waits up to {@code timeoutMs} for the queue to drain into Kafka, then closes the producer. */
    @Override
    public void close() {
        close(5000);
    }

    public void close(long timeoutMs) {
        closing = true;
        synchronized (queue) {
            queue.notifyAll();
        }
        try {
            sender.join(timeoutMs);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        producer.close(java.time.Duration.ofMillis(timeoutMs));
    }

    /** Blocks until everything queued so far was handed to Kafka and acknowledged (tests, shutdown). */
    public void flush() {
        long deadline = System.currentTimeMillis() + 30000;
        while (queued() > 0 && System.currentTimeMillis() < deadline) {
            try {
                Thread.sleep(5);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return;
            }
        }
        producer.flush();
    }
}
