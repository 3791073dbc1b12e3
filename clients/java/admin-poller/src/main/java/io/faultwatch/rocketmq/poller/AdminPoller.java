package io.faultwatch.rocketmq.poller;

import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

import com.fasterxml.jackson.databind.ObjectMapper;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.protocol.admin.ConsumeStats;
import org.apache.rocketmq.remoting.protocol.admin.OffsetWrapper;
import org.apache.rocketmq.remoting.protocol.body.ClusterInfo;
import org.apache.rocketmq.remoting.protocol.body.Connection;
import org.apache.rocketmq.remoting.protocol.body.ConsumerConnection;
import org.apache.rocketmq.remoting.protocol.route.BrokerData;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/**
 * faultwatch's admin poller: every interval, per consumer group, the progress of each queue
 * ({@code consumer_progress} events) and the group's members ({@code group_membership} events).
 *
 * Progress is asked of each broker on its own ({@code examineConsumeStats(brokerAddr, ...)}), in
 * parallel with a per-call timeout, so a frozen broker costs its own rows and never the others'.
 * Every broker the poller has seen is accounted for each cycle: one status line on stderr per cycle
 * names the brokers that answered and, for the others, why not (gone from the name server's route,
 * refused, timed out). Events go to Kafka and/or stdout (JSON lines).
 */
public final class AdminPoller implements AutoCloseable {
    private static final ObjectMapper JSON = new ObjectMapper();

    private final PollerOptions opt;
    private final DefaultMQAdminExt admin;
    private final KafkaProducer<byte[], byte[]> kafka;
    private final ExecutorService pool = Executors.newCachedThreadPool(r -> {
        Thread t = new Thread(r, "faultwatch-poller-call");
        t.setDaemon(true);
        return t;
    });
    private final Map<String, String> knownBrokers = new TreeMap<>();
    private final PrintStream out = System.out;
    private final PrintStream status = System.err;

    AdminPoller(PollerOptions opt) throws Exception {
        this.opt = opt;
        this.admin = new DefaultMQAdminExt(opt.timeoutMs);
        admin.setNamesrvAddr(opt.namesrv);
        admin.setInstanceName("faultwatch-poller-" + ProcessHandle.current().pid());
        admin.start();
        this.kafka = opt.kafka == null ? null : kafkaProducer(opt.kafka);
    }

    private static KafkaProducer<byte[], byte[]> kafkaProducer(String bootstrap) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "zstd");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "20");
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "5000");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "false");
        p.put(ProducerConfig.CLIENT_ID_CONFIG, "faultwatch-admin-poller");
        return new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer());
    }

    public static void main(String[] args) throws Exception {
        PollerOptions opt = PollerOptions.parse(args);
        try (AdminPoller poller = new AdminPoller(opt)) {
            while (true) {
                long started = System.currentTimeMillis();
                poller.pollOnce();
                if (opt.once) {
                    return;
                }
                long wait = opt.intervalMs - (System.currentTimeMillis() - started);
                if (wait > 0) {
                    Thread.sleep(wait);
                }
            }
        }
    }

    /** One cycle: progress per (broker, group), membership per group, one status line. */
    void pollOnce() throws Exception {
        long now = System.currentTimeMillis();
        Map<String, Object> brokers = new TreeMap<>();
        Map<String, String> route = masters(brokers);
        for (Map.Entry<String, String> e : knownBrokers.entrySet()) {
            if (!route.containsKey(e.getKey())) {
                brokers.put(e.getKey(), "down: not in the name server's route (last address " + e.getValue() + ")");
            }
        }
        knownBrokers.putAll(route);
        int events = 0;
        Map<String, Future<ConsumeStats>> calls = new LinkedHashMap<>();
        for (String group : opt.groups) {
            for (Map.Entry<String, String> b : route.entrySet()) {
                String addr = b.getValue();
                calls.put(b.getKey() + "\u0000" + group,
                        pool.submit(() -> admin.examineConsumeStats(addr, group, null, opt.timeoutMs)));
            }
        }
        for (Map.Entry<String, Future<ConsumeStats>> c : calls.entrySet()) {
            String[] key = c.getKey().split("\u0000", 2);
            try {
                ConsumeStats stats = c.getValue().get(opt.timeoutMs + 1000, TimeUnit.MILLISECONDS);
                events += emitProgress(now, key[1], stats);
                brokers.putIfAbsent(key[0], "ok");
            } catch (TimeoutException e) {
                c.getValue().cancel(true);
                brokers.put(key[0], "down: no answer within " + opt.timeoutMs + " ms");
            } catch (Exception e) {
                Throwable cause = e.getCause() == null ? e : e.getCause();
                String why = cause.getClass().getSimpleName() + ": " + cause.getMessage();
                if (why.contains("CODE: 206") || why.contains("not online") || why.contains("CODE: 15")) {
                    brokers.putIfAbsent(key[0], "ok"); // the broker answered: this group has nothing there
                } else if (cause.getClass().getSimpleName().contains("Timeout")) {
                    brokers.put(key[0], "down: no answer within " + opt.timeoutMs + " ms (" + why + ")");
                } else {
                    brokers.put(key[0], "down: " + why);
                }
            }
        }
        for (String group : opt.groups) {
            events += emitMembership(now, group);
        }
        if (kafka != null) {
            kafka.flush();
        }
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("poll_ms", now);
        line.put("events", events);
        line.put("brokers", brokers);
        status.println(JSON.writeValueAsString(line));
        status.flush();
    }

    private Map<String, String> masters(Map<String, Object> brokers) {
        Map<String, String> out = new TreeMap<>();
        try {
            ClusterInfo info = admin.examineBrokerClusterInfo();
            for (BrokerData d : info.getBrokerAddrTable().values()) {
                String addr = d.getBrokerAddrs().get(0L);
                if (addr != null) {
                    out.put(d.getBrokerName(), addr);
                }
            }
        } catch (Exception e) {
            brokers.put("<name server>", "down: " + e.getClass().getSimpleName() + ": " + e.getMessage());
        }
        return out;
    }

    private int emitProgress(long now, String group, ConsumeStats stats) throws Exception {
        int n = 0;
        for (Map.Entry<MessageQueue, OffsetWrapper> q : stats.getOffsetTable().entrySet()) {
            MessageQueue mq = q.getKey();
            OffsetWrapper w = q.getValue();
            Map<String, Object> e = new LinkedHashMap<>();
            e.put("schema_version", 1);
            e.put("ts_ms", now);
            e.put("cluster", opt.cluster);
            e.put("consumer_group", group);
            e.put("topic", mq.getTopic());
            e.put("broker_name", mq.getBrokerName());
            e.put("queue_id", mq.getQueueId());
            e.put("consumer_offset", Math.max(-1, w.getConsumerOffset()));
            e.put("broker_offset", Math.max(0, w.getBrokerOffset()));
            e.put("last_timestamp_ms", w.getLastTimestamp() > 0 ? w.getLastTimestamp() : null);
            write(opt.progressTopic, mq.getBrokerName(), e);
            n++;
        }
        return n;
    }

    private int emitMembership(long now, String group) throws Exception {
        ConsumerConnection cc;
        try {
            cc = admin.examineConsumerConnectionInfo(group);
        } catch (Exception e) {
            return 0; // no member online: nothing to say about members (progress rows still show the lag)
        }
        List<String> ids = new ArrayList<>();
        for (Connection c : cc.getConnectionSet()) {
            ids.add(c.getClientId());
        }
        ids.sort(null);
        int n = 0;
        for (String topic : new TreeMap<>(cc.getSubscriptionTable()).keySet()) {
            Map<String, Object> e = new LinkedHashMap<>();
            e.put("schema_version", 1);
            e.put("ts_ms", now);
            e.put("cluster", opt.cluster);
            e.put("consumer_group", group);
            e.put("topic", topic);
            e.put("client_ids", ids);
            e.put("strategy", opt.strategy);
            write(opt.membershipTopic, group, e);
            n++;
        }
        return n;
    }

    private void write(String topic, String key, Map<String, Object> event) throws Exception {
        byte[] value = JSON.writeValueAsBytes(event);
        if (opt.stdout) {
            out.println(new String(value, StandardCharsets.UTF_8));
        }
        if (kafka != null) {
            kafka.send(new ProducerRecord<>(topic, key.getBytes(StandardCharsets.UTF_8), value));
        }
    }

    @Override
    public void close() {
        out.flush();
        pool.shutdownNow();
        if (kafka != null) {
            kafka.close();
        }
        admin.shutdown();
    }
}
