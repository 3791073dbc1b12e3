package io.faultwatch.rocketmq.feed;

import java.lang.reflect.Field;
import java.lang.reflect.InvocationHandler;
import java.lang.reflect.Method;
import java.lang.reflect.Proxy;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.function.Supplier;

import org.apache.rocketmq.client.producer.DefaultMQProducer;

/**
 * A running producer's own latency fault table ({@code LatencyFaultToleranceImpl}), read and written
 * through the client's classes.
 *
 * The client exposes no public handle on it in 4.9.x, so the handle is found by reflection once:
 * {@code DefaultMQProducerImpl.mqFaultStrategy} then {@code MQFaultStrategy.latencyFaultTolerance}.
 * Writes go through the tolerance's own {@code updateFaultItem} (4.9.x: name, latency, duration;
 * 5.x: the same and {@code reachable}), the call {@code MQFaultStrategy.updateFaultItem} itself makes,
 * so the item's rules (4.9: always overwrite; 5.x: only grow) stay the client's. A table wrapped in
 * a dynamic proxy whose handler is a {@link Supplier} of the real table (faultwatch send hook's tap)
 * is read and written through the real one.
 */
public final class FaultTable {
    /** One fault item as the client holds it. */
    public static final class Item {
        public final String brokerName;
        public final long currentLatency;
        public final long startTimestamp;
        public final Boolean reachable;

        Item(String brokerName, long currentLatency, long startTimestamp, Boolean reachable) {
            this.brokerName = brokerName;
            this.currentLatency = currentLatency;
            this.startTimestamp = startTimestamp;
            this.reachable = reachable;
        }
    }

    private final Object strategy;
    private final Object tolerance;
    private final Method update3;
    private final Method update4;

    public FaultTable(DefaultMQProducer producer) {
        try {
            Object impl = producer.getDefaultMQProducerImpl();
            strategy = field(impl, "mqFaultStrategy");
            tolerance = unwrap(field(strategy, "latencyFaultTolerance"));
            update4 = method(tolerance.getClass(), "updateFaultItem", String.class, long.class, long.class, boolean.class);
            update3 = method(tolerance.getClass(), "updateFaultItem", String.class, long.class, long.class);
        } catch (ReflectiveOperationException e) {
            throw new IllegalStateException("faultwatch: this RocketMQ client's fault table is not where 4.9.x/5.x keep it: "
                    + e, e);
        }
        if (update3 == null && update4 == null) {
            throw new IllegalStateException("faultwatch: no updateFaultItem on " + tolerance.getClass().getName());
        }
    }

    /** True when the client has a reachable flag (5.x). */
    public boolean hasReachable() {
        return update4 != null;
    }

    public boolean sendLatencyFaultEnable() {
        try {
            return (Boolean) strategy.getClass().getMethod("isSendLatencyFaultEnable").invoke(strategy);
        } catch (ReflectiveOperationException e) {
            throw new IllegalStateException(e);
        }
    }

    /** Pushes {@code brokerName}'s item to "not available for {@code durationMs} from now". */
    public void update(String brokerName, long currentLatency, long durationMs) {
        try {
            if (update4 != null) {
                update4.invoke(tolerance, brokerName, currentLatency, durationMs, true);
            } else {
                update3.invoke(tolerance, brokerName, currentLatency, durationMs);
            }
        } catch (ReflectiveOperationException e) {
            throw new IllegalStateException("faultwatch: updateFaultItem failed for " + brokerName + ": " + e, e);
        }
    }

    /** The items now in the table. */
    public List<Item> items() {
        List<Item> out = new ArrayList<>();
        try {
            Map<?, ?> table = (Map<?, ?>) field(tolerance, "faultItemTable");
            for (Object item : table.values()) {
                Class<?> c = item.getClass();
                String name = (String) call(c, item, "getName");
                long latency = (Long) call(c, item, "getCurrentLatency");
                long start = (Long) call(c, item, "getStartTimestamp");
                Method reach = method(c, "isReachable");
                Boolean reachable = reach == null ? null : (Boolean) reach.invoke(item);
                out.add(new Item(name, latency, start, reachable));
            }
        } catch (ReflectiveOperationException e) {
            throw new IllegalStateException("faultwatch: cannot read the fault items: " + e, e);
        }
        return out;
    }

    public Item item(String brokerName) {
        for (Item i : items()) {
            if (i.brokerName.equals(brokerName)) {
                return i;
            }
        }
        return null;
    }

    private static Object unwrap(Object tolerance) {
        Object t = tolerance;
        while (Proxy.isProxyClass(t.getClass())) {
            InvocationHandler h = Proxy.getInvocationHandler(t);
            if (!(h instanceof Supplier)) {
                break;
            }
            t = ((Supplier<?>) h).get();
        }
        return t;
    }

    private static Object field(Object target, String name) throws ReflectiveOperationException {
        for (Class<?> c = target.getClass(); c != null; c = c.getSuperclass()) {
            try {
                Field f = c.getDeclaredField(name);
                f.setAccessible(true);
                return f.get(target);
            } catch (NoSuchFieldException e) {
                // look in the superclass
            }
        }
        throw new NoSuchFieldException(target.getClass().getName() + "." + name);
    }

    private static Object call(Class<?> c, Object target, String name) throws ReflectiveOperationException {
        Method m = method(c, name);
        if (m == null) {
            throw new NoSuchMethodException(c.getName() + "." + name);
        }
        return m.invoke(target);
    }

    private static Method method(Class<?> c, String name, Class<?>... params) {
        for (Class<?> k = c; k != null; k = k.getSuperclass()) {
            try {
                Method m = k.getDeclaredMethod(name, params);
                m.setAccessible(true);
                return m;
            } catch (NoSuchMethodException e) {
                // look in the superclass
            }
        }
        return null;
    }
}
