package io.faultwatch.rocketmq.lab;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.atomic.AtomicLong;

import com.fasterxml.jackson.databind.ObjectMapper;

import io.faultwatch.rocketmq.feed.AvoidanceFeed;
import io.faultwatch.rocketmq.feed.FaultTable;
import io.faultwatch.rocketmq.hook.FaultwatchSendHook;

import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.impl.producer.DefaultMQProducerImpl;
import org.apache.rocketmq.client.impl.producer.TopicPublishInfo;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * A real RocketMQ producer (and optionally a push consumer) driven by commands on stdin, one JSON
 * answer per command on stdout: what faultwatch's real-cluster tests and its lab run. The producer
 * carries faultwatch's send hook and, when asked, its feed client; {@code faults} reads the
 * producer's own fault table through {@link FaultTable}.
 *
 * Commands: {@code send N}, {@code faults}, {@code hook}, {@code flush}, {@code feed JSON}, {@code feedstats},
 * {@code fallback BROKER}, {@code consume GROUP}, {@code quit}.
 */
public final class Driver {
    private static final ObjectMapper JSON = new ObjectMapper();

    private final Map<String, String> opt;
    private final DefaultMQProducer producer;
    private final FaultwatchSendHook hook;
    private final AvoidanceFeed feed;
    private AvoidanceFeed.Target feedTarget;
    private final FaultTable table;
    private final String topic;
    private final List<DefaultMQPushConsumer> consumers = new ArrayList<>();
    private final AtomicLong consumed = new AtomicLong();
    private long sequence;

    Driver(Map<String, String> opt) throws Exception {
        this.opt = opt;
        this.topic = need("topic");
        producer = new DefaultMQProducer(need("group"));
        producer.setNamesrvAddr(need("namesrv"));
        producer.setInstanceName(opt.getOrDefault("instance", "lab-" + ProcessHandle.current().pid()));
        producer.setSendLatencyFaultEnable(Boolean.parseBoolean(opt.getOrDefault("fault-enable", "true")));
        producer.setSendMsgTimeout(Integer.parseInt(opt.getOrDefault("send-timeout-ms", "3000")));
        producer.setRetryTimesWhenSendFailed(Integer.parseInt(opt.getOrDefault("retries", "2")));
        String kafka = opt.get("kafka");
        hook = kafka == null ? null : new FaultwatchSendHook(need("cluster"), kafka,
                opt.getOrDefault("results-topic", FaultwatchSendHook.DEFAULT_TOPIC),
                Integer.parseInt(opt.getOrDefault("hook-capacity", "100000")), null);
        if (hook != null) {
            if (Boolean.parseBoolean(opt.getOrDefault("client-latency", "true"))) {
                hook.install(producer);
            } else {
                producer.getDefaultMQProducerImpl().registerSendMessageHook(hook); // the hook's own timing only
            }
        }
        producer.start();
        table = new FaultTable(producer);
        feed = startFeed();
        if (feed != null) {
            feedTarget = feed.attach(producer, need("cluster"));
        }
    }

    private AvoidanceFeed startFeed() {
        String mode = opt.getOrDefault("feed", "none");
        switch (mode) {
            case "none": return null;
            case "stdin": return new AvoidanceFeed(1000);
            case "kafka": return AvoidanceFeed.fromKafka(need("kafka"), opt.getOrDefault("feed-topic", "rmq.avoidance"), null);
            case "file": return AvoidanceFeed.fromFile(Paths.get(need("feed-file")));
            default: throw new IllegalArgumentException("unknown --feed " + mode + " (none, stdin, kafka, file)");
        }
    }

    private String need(String key) {
        String v = opt.get(key);
        if (v == null) {
            throw new IllegalArgumentException("faultwatch lab driver: --" + key + " is required");
        }
        return v;
    }

    Map<String, Object> handle(String line) throws Exception {
        String[] parts = line.trim().split(" ", 2);
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("cmd", parts[0]);
        switch (parts[0]) {
            case "send": send(Integer.parseInt(parts[1]), out); break;
            case "faults": faults(out); break;
            case "hook": hookStats(out); break;
            case "flush":
                if (hook != null) {
                    hook.sink().flush();
                }
                hookStats(out);
                break;
            case "feed":
                out.put("accepted", feed.accept(parts[1].getBytes(StandardCharsets.UTF_8)));
                out.put("rejected", feed.rejected());
        out.put("reader_errors", feed.readerErrors());
                out.put("last_rejection", feed.lastRejection());
                break;
            case "feedstats": feedStats(out); break;
            case "fallback": fallback(parts[1], out); break;
            case "consume": consume(parts[1], out); break;
            case "consumed": out.put("consumed", consumed.get()); break;
            default: out.put("error", "unknown command " + parts[0]);
        }
        return out;
    }

    private void send(int n, Map<String, Object> out) {
        int ok = 0;
        int failed = 0;
        Map<String, Integer> byBroker = new TreeMap<>();
        Map<String, Integer> errors = new TreeMap<>();
        long[] micros = new long[n];
        long began = System.nanoTime();
        for (int i = 0; i < n; i++) {
            Message msg = new Message(topic, ("lab " + sequence++).getBytes(StandardCharsets.UTF_8));
            long t0 = System.nanoTime();
            try {
                SendResult r = producer.send(msg);
                micros[i] = (System.nanoTime() - t0) / 1000;
                ok++;
                byBroker.merge(r.getMessageQueue().getBrokerName(), 1, Integer::sum);
            } catch (Exception e) {
                failed++;
                errors.merge(e.getClass().getSimpleName(), 1, Integer::sum);
                out.put("last_error", e.toString());
            }
        }
        long elapsedNanos = System.nanoTime() - began;
        java.util.Arrays.sort(micros);
        out.put("ok", ok);
        out.put("failed", failed);
        out.put("per_s", n * 1e9 / Math.max(1, elapsedNanos));
        out.put("p50_us", n == 0 ? 0 : micros[(int) Math.min(n - 1, Math.floor(0.50 * n))]);
        out.put("p99_us", n == 0 ? 0 : micros[(int) Math.min(n - 1, Math.floor(0.99 * n))]);
        out.put("by_broker", byBroker);
        out.put("errors", errors);
    }

    private void faults(Map<String, Object> out) {
        out.put("now_ms", System.currentTimeMillis());
        out.put("send_latency_fault_enable", table.sendLatencyFaultEnable());
        List<Map<String, Object>> items = new ArrayList<>();
        for (FaultTable.Item i : table.items()) {
            Map<String, Object> m = new LinkedHashMap<>();
            m.put("broker_name", i.brokerName);
            m.put("current_latency", i.currentLatency);
            m.put("start_timestamp", i.startTimestamp);
            m.put("reachable", i.reachable);
            items.add(m);
        }
        items.sort((a, b) -> ((String) a.get("broker_name")).compareTo((String) b.get("broker_name")));
        out.put("items", items);
        out.put("client_id", producer.getDefaultMQProducerImpl().getMqClientFactory().getClientId());
        if (hook != null) {
            List<Map<String, Object>> removed = new ArrayList<>();
            for (FaultwatchSendHook.Removal r : hook.removals()) {
                Map<String, Object> m = new LinkedHashMap<>();
                m.put("broker_name", r.broker);
                m.put("at_ms", r.atMs);
                removed.add(m);
            }
            out.put("removed", removed);
        }
    }

    /**
     * {@code fallback GONE}: runs the client's own queue selection with every broker of the topic's
     * route unavailable, as a loaded producer meets it. The table gets a failure's window on GONE (a
     * broker outside the route, with the lowest latency, so the fallback ranks it first) and a slow
     * send's window on each routed broker; then the client selects until its fallback has picked GONE
     * and, finding no write queues, removed it (4.9.x: within two selections; 5.x never removes).
     * Answers the selections made and the hook's removals.
     */
    private void fallback(String gone, Map<String, Object> out) throws Exception {
        DefaultMQProducerImpl impl = producer.getDefaultMQProducerImpl();
        TopicPublishInfo info = impl.getTopicPublishInfoTable().get(topic);
        if (info == null) {
            out.put("error", "no route for " + topic + " yet: send first");
            return;
        }
        // by reflection: the two client lines differ in these methods' parameters
        Method update = null;
        Method select = null;
        for (Method m : impl.getClass().getMethods()) {
            if (m.getName().equals("updateFaultItem")) {
                update = m;
            } else if (m.getName().equals("selectOneMessageQueue")) {
                select = m;
            }
        }
        Set<String> routed = new TreeSet<>();
        for (MessageQueue mq : info.getMessageQueueList()) {
            routed.add(mq.getBrokerName());
        }
        long latency = 600;
        for (String broker : routed) {
            invokeUpdate(update, impl, broker, latency++, false); // 4.9: 550 ms and more -> 30 s
        }
        invokeUpdate(update, impl, gone, 5, true); // isolation -> the longest window
        long before = hook == null ? 0 : hook.removalCount();
        List<String> picked = new ArrayList<>();
        for (int i = 0; i < 4 && (hook == null || hook.removalCount() == before); i++) {
            Object mq = select.getParameterCount() == 2 ? select.invoke(impl, info, null)
                    : select.invoke(impl, info, null, false);
            picked.add(((MessageQueue) mq).getBrokerName());
        }
        out.put("routed", new ArrayList<>(routed));
        out.put("picked", picked);
        faults(out);
    }

    private static void invokeUpdate(Method update, Object impl, String broker, long latency,
                                     boolean isolation) throws Exception {
        if (update.getParameterCount() == 3) {
            update.invoke(impl, broker, latency, isolation);
        } else {
            update.invoke(impl, broker, latency, isolation, true);
        }
    }

    private void feedStats(Map<String, Object> out) {
        if (feed == null) {
            out.put("error", "no feed: start the driver with --feed");
            return;
        }
        out.put("records", feed.records());
        out.put("rejected", feed.rejected());
        out.put("reader_errors", feed.readerErrors());
        out.put("first_applied_ms", feedTarget.firstAppliedMs());
        out.put("applied", new TreeMap<>(feedTarget.applied()));
        out.put("first_applied_by_broker", new TreeMap<>(feedTarget.firstAppliedByBroker()));
    }

    private void hookStats(Map<String, Object> out) {
        if (hook == null) {
            out.put("error", "no hook: start the driver with --kafka");
            return;
        }
        out.put("offered", hook.sink().offered());
        out.put("dropped", hook.sink().dropped());
        out.put("delivered", hook.sink().delivered());
        out.put("queued", hook.sink().queued());
        out.put("last_failure", hook.sink().lastFailure());
        out.put("client_latency", hook.tapped(producer));
    }

    private void consume(String group, Map<String, Object> out) throws Exception {
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(group);
        c.setNamesrvAddr(need("namesrv"));
        c.setInstanceName(group + "-" + ProcessHandle.current().pid() + "-" + consumers.size());
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.subscribe(topic, "*");
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            consumed.addAndGet(msgs.size());
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        c.start();
        consumers.add(c);
        out.put("client_id", c.getDefaultMQPushConsumerImpl().getmQClientFactory().getClientId());
    }

    void close() {
        for (DefaultMQPushConsumer c : consumers) {
            c.shutdown();
        }
        if (feed != null) {
            feed.close();
        }
        producer.shutdown();
        if (hook != null) {
            hook.close();
        }
    }

    static Map<String, String> options(String[] args) {
        Map<String, String> o = new HashMap<>();
        for (int i = 0; i < args.length; i++) {
            if (!args[i].startsWith("--") || i + 1 >= args.length) {
                throw new IllegalArgumentException("faultwatch lab driver: expected --key value, got " + args[i]);
            }
            o.put(args[i].substring(2), args[++i]);
        }
        return o;
    }

    public static void main(String[] args) throws Exception {
        Driver d = new Driver(options(args));
        Runtime.getRuntime().addShutdownHook(new Thread(d::close));
        System.out.println(JSON.writeValueAsString(Map.of("cmd", "ready")));
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null && !line.trim().equals("quit")) {
            if (line.isBlank()) {
                continue;
            }
            Map<String, Object> out;
            try {
                out = d.handle(line);
            } catch (Exception e) {
                out = new LinkedHashMap<>();
                out.put("error", e.toString());
            }
            System.out.println(JSON.writeValueAsString(out));
            System.out.flush();
        }
        System.exit(0);
    }
}
