package io.faultwatch.rocketmq.feed;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicLong;
import java.util.logging.Logger;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.rocketmq.client.producer.DefaultMQProducer;

/**
 * The Java twin of faultwatch's Python feed client: keeps the newest avoidance list per cluster and
 * applies it to real producers' own fault tables.
 *
 * A recommended broker's fault item is pushed out to "not available until the recommendation ends"
 * ({@code min(avoid_until_ms, entry expires_ms, list expires_ms)}), never shortened: a longer window
 * the producer learnt itself stands. RocketMQ's selection and its fallbacks then stay the client's own.
 * 4.9.x overwrites an item on every send to that broker, so the feed re-applies its lists every
 * {@code reapplyMs}. When a newer list no longer holds a broker it avoided (its episode closed), the feed
 * releases that broker's item on 4.9.x (one fast {@code updateFaultItem} makes it available at once,
 * ending a 10-minute isolation window early); 5.x windows cannot shrink and are short anyway.
 *
 * Needs {@code producer.setSendLatencyFaultEnable(true)}: with it off the client never reads its fault
 * table, so the feed has no effect (it logs that once per producer).
 */
public final class AvoidanceFeed implements AutoCloseable {
    private static final Logger LOG = Logger.getLogger(AvoidanceFeed.class.getName());

    private final Map<String, AvoidanceList> lists = new ConcurrentHashMap<>();
    private final List<Target> targets = new CopyOnWriteArrayList<>();
    private final AtomicLong rejected = new AtomicLong();
    private final AtomicLong records = new AtomicLong();
    private final AtomicLong readerErrors = new AtomicLong();
    private volatile String lastReaderError;
    private volatile String lastRejection;
    private final long reapplyMs;
    private volatile boolean running = true;
    private Thread thread;

    /** A producer of one cluster, with what the feed did to it. */
    public static final class Target {
        final String cluster;
        final FaultTable table;
        final Map<String, Long> applied = new ConcurrentHashMap<>();
        final Set<String> released = ConcurrentHashMap.newKeySet();
        volatile long firstAppliedMs;
        final Map<String, Long> firstAppliedByBroker = new ConcurrentHashMap<>();

        Target(String cluster, FaultTable table) {
            this.cluster = cluster;
            this.table = table;
        }

        /** Broker -> avoid-until the feed last wrote into this producer's table. */
        public Map<String, Long> applied() {
            return new HashMap<>(applied);
        }

        public long firstAppliedMs() {
            return firstAppliedMs;
        }

        /** Broker -> when the feed first wrote a recommendation for it into this producer's table. */
        public Map<String, Long> firstAppliedByBroker() {
            return new HashMap<>(firstAppliedByBroker);
        }
    }

    public AvoidanceFeed(long reapplyMs) {
        this.reapplyMs = reapplyMs;
    }

    /** Reads {@code topic} (all partitions from the beginning, no consumer group) on a daemon thread. */
    public static AvoidanceFeed fromKafka(String bootstrap, String topic, Properties extra) {
        AvoidanceFeed feed = new AvoidanceFeed(1000);
        feed.start(() -> feed.runKafka(bootstrap, topic, extra), "faultwatch-feed-kafka");
        return feed;
    }

    /** Reads the publisher's per-cluster JSON file whenever it changes. */
    public static AvoidanceFeed fromFile(Path file) {
        AvoidanceFeed feed = new AvoidanceFeed(1000);
        feed.start(() -> feed.runFile(file), "faultwatch-feed-file");
        return feed;
    }

    private void start(Runnable body, String name) {
        thread = new Thread(body, name);
        thread.setDaemon(true);
        thread.start();
    }

    /** Applies this feed's lists for {@code cluster} to {@code producer} from now on. */
    public Target attach(DefaultMQProducer producer, String cluster) {
        Target t = new Target(cluster, new FaultTable(producer));
        if (!t.table.sendLatencyFaultEnable()) {
            LOG.warning("faultwatch feed: producer " + producer.getProducerGroup()
                    + " has sendLatencyFaultEnable=false: its client ignores the fault table, the feed has no effect");
        }
        targets.add(t);
        applyAll(System.currentTimeMillis());
        return t;
    }

    /** Merges one record value (Kafka record or file); a malformed one is counted and skipped. */
    public boolean accept(byte[] value) {
        records.incrementAndGet();
        AvoidanceList next;
        try {
            next = AvoidanceList.parse(value);
        } catch (InvalidListException e) {
            rejected.incrementAndGet();
            lastRejection = e.getMessage();
            LOG.warning("faultwatch feed: skipped a record: " + e.getMessage());
            return false;
        }
        AvoidanceList merged = lists.merge(next.cluster, next, (old, nu) -> nu.newerThan(old) ? nu : old);
        if (merged != next) {
            return false;
        }
        applyAll(System.currentTimeMillis());
        return true;
    }

    public long rejected() {
        return rejected.get();
    }

    /** Failed reads of the topic so far (each retried; the reader stops only on a bad setting). */
    public long readerErrors() {
        return readerErrors.get();
    }

    public String lastReaderError() {
        return lastReaderError;
    }

    public long records() {
        return records.get();
    }

    public String lastRejection() {
        return lastRejection;
    }

    /** Broker -> avoid-until in force for {@code cluster} at {@code nowMs}. */
    public Map<String, Long> avoided(String cluster, long nowMs) {
        AvoidanceList l = lists.get(cluster);
        return l == null ? new HashMap<>() : l.avoidedAt(nowMs);
    }

    /** Writes every list in force into every attached producer's table (and releases closed ones). */
    public synchronized void applyAll(long nowMs) {
        for (Target t : targets) {
            AvoidanceList l = lists.get(t.cluster);
            Map<String, Long> avoid = l == null ? new HashMap<>() : l.avoidedAt(nowMs);
            for (Map.Entry<String, Long> e : avoid.entrySet()) {
                apply(t, e.getKey(), e.getValue(), nowMs);
            }
            boolean fresh = l != null && nowMs < l.expiresMs;
            for (String broker : new ArrayList<>(t.applied.keySet())) {
                if (!avoid.containsKey(broker)) {
                    long until = t.applied.remove(broker);
                    if (fresh && !t.table.hasReachable()) {
                        release(t, broker, until, nowMs);
                    }
                }
            }
        }
    }

    private void apply(Target t, String broker, long until, long nowMs) {
        FaultTable.Item item = t.table.item(broker);
        if (item != null && item.startTimestamp >= until) {
            t.applied.put(broker, until); // the producer's own window already reaches that far
            return;
        }
        t.table.update(broker, item == null ? 0 : item.currentLatency, until - nowMs);
        t.firstAppliedByBroker.putIfAbsent(broker, nowMs);
        if (t.applied.put(broker, until) == null && t.firstAppliedMs == 0) {
            t.firstAppliedMs = nowMs;
        }
    }

    private static void release(Target t, String broker, long until, long nowMs) {
        FaultTable.Item item = t.table.item(broker);
        if (item != null && item.startTimestamp > nowMs) {
            t.table.update(broker, item.currentLatency, 0);
            t.released.add(broker);
        }
    }

    private void runKafka(String bootstrap, String topic, Properties extra) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, "faultwatch-feed");
        if (extra != null) {
            p.putAll(extra);
        }
        try (KafkaConsumer<byte[], byte[]> consumer =
                     new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            Set<TopicPartition> assigned = new HashSet<>();
            long lastApply = 0;
            int failedInARow = 0;
            while (running) {
                long now = System.currentTimeMillis();
                if (now - lastApply >= reapplyMs) {  // the lists in hand keep applying while Kafka is away
                    applyAll(now);
                    lastApply = now;
                }
                try {
                    assigned = assignNew(consumer, topic, assigned);
                    for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(Math.min(reapplyMs, 500)))) {
                        accept(r.value());
                    }
                    failedInARow = 0;
                } catch (KafkaException e) {  // a broker away or slow: the same consumer tries again
                    readerErrors.incrementAndGet();
                    lastReaderError = e.toString();
                    if (failedInARow++ == 0) {
                        LOG.warning("faultwatch feed: reading " + topic + " failed, retrying: " + e);
                    }
                    Thread.sleep(Math.min(200L << Math.min(failedInARow, 7), 10_000L));
                }
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } catch (RuntimeException e) {  // a bad setting (the consumer cannot even be made): nothing to retry
            if (running) {
                readerErrors.incrementAndGet();
                lastReaderError = e.toString();
                LOG.severe("faultwatch feed: Kafka reader stopped: " + e);
            }
        }
    }

    private static Set<TopicPartition> assignNew(KafkaConsumer<byte[], byte[]> consumer, String topic,
                                                 Set<TopicPartition> assigned) {
        List<PartitionInfo> infos = consumer.partitionsFor(topic, Duration.ofSeconds(5));
        Set<TopicPartition> all = new HashSet<>();
        if (infos != null) {
            for (PartitionInfo i : infos) {
                all.add(new TopicPartition(topic, i.partition()));
            }
        }
        if (all.equals(assigned)) {
            return assigned;
        }
        consumer.assign(all);
        Set<TopicPartition> added = new HashSet<>(all);
        added.removeAll(assigned);
        consumer.seekToBeginning(added);
        return all;
    }

    private void runFile(Path file) {
        long seen = -1;
        while (running) {
            try {
                long modified = Files.exists(file) ? Files.getLastModifiedTime(file).toMillis() : -1;
                if (modified != seen && modified >= 0) {
                    seen = modified;
                    accept(Files.readAllBytes(file));
                }
                applyAll(System.currentTimeMillis());
                Thread.sleep(Math.min(reapplyMs, 500));
            } catch (IOException e) {
                LOG.warning("faultwatch feed: cannot read " + file + ": " + e);
            } catch (InterruptedException e) {
                return;
            }
        }
    }

    @Override
    public void close() {
        running = false;
        if (thread != null) {
            thread.interrupt();
            try {
                thread.join(5000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }
}
