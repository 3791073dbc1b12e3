package io.faultwatch.rocketmq.hook;

import java.lang.reflect.Field;
import java.lang.reflect.InvocationHandler;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Proxy;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Supplier;

/**
 * Lets the send hook see the latency the client itself charges each attempt with.
 *
 * RocketMQ times an attempt in {@code DefaultMQProducerImpl.sendDefaultImpl}, around
 * {@code sendKernelImpl}, and hands that figure to {@code MQFaultStrategy.updateFaultItem} just after
 * the hook's after-call; the hook's own clock runs inside {@code sendKernelImpl} and sees less of the
 * attempt, so a starved thread can put the two on either side of a {@code notAvailableDuration}
 * bucket edge. The tap replaces the strategy's {@code latencyFaultTolerance} by a dynamic proxy of the
 * {@code LatencyFaultTolerance} interface (both client lines have it, with different methods): every
 * call reaches the client's own table unchanged, and an {@code updateFaultItem} made on a send thread
 * that has a pending hook event completes that event with what the client passed and the client's own
 * clock reading, read back from the item it just wrote. A {@code remove} (4.9's fallback drops the item
 * of a broker that has left the route) is recorded by the hook, since no send shows it. The proxy answers {@link Supplier#get()} with
 * the client's table, so tools that read the table by reflection can see through it.
 */
final class ClientLatencyTap implements InvocationHandler, Supplier<Object> {
    private static final String TOLERANCE_INTERFACE = "org.apache.rocketmq.client.latency.LatencyFaultTolerance";
    private static final Map<Class<?>, Method> START_GETTERS = new ConcurrentHashMap<>();

    private final Object delegate;
    private final FaultwatchSendHook hook;
    private final Field itemTable;

    private ClientLatencyTap(Object delegate, FaultwatchSendHook hook) throws NoSuchFieldException {
        this.delegate = delegate;
        this.hook = hook;
        this.itemTable = declaredField(delegate.getClass(), "faultItemTable");
    }

    /**
     * Wraps {@code producerImpl.mqFaultStrategy.latencyFaultTolerance} (once: a tapped producer is left
     * as it is). Throws when this client keeps its table elsewhere; nothing is changed then.
     */
    static void install(Object producerImpl, FaultwatchSendHook hook) throws ReflectiveOperationException {
        Object strategy = declaredField(producerImpl.getClass(), "mqFaultStrategy").get(producerImpl);
        Field field = declaredField(strategy.getClass(), "latencyFaultTolerance");
        Object current = field.get(strategy);
        if (Proxy.isProxyClass(current.getClass()) && Proxy.getInvocationHandler(current) instanceof ClientLatencyTap) {
            return;
        }
        Class<?> iface = Class.forName(TOLERANCE_INTERFACE, false, current.getClass().getClassLoader());
        Object proxy = Proxy.newProxyInstance(iface.getClassLoader(), new Class<?>[] {iface},
                new ClientLatencyTap(current, hook));
        field.set(strategy, proxy); // 4.9.x declares the field final: an instance field, settable once accessible
    }

    @Override
    public Object get() {
        return delegate;
    }

    @Override
    public Object invoke(Object proxy, Method method, Object[] args) throws Throwable {
        if (method.getDeclaringClass() == Object.class) {
            return objectMethod(proxy, method, args);
        }
        boolean update = "updateFaultItem".equals(method.getName()) && args != null && args.length >= 3;
        long before = update ? System.currentTimeMillis() : 0L;
        Object out;
        try {
            out = method.invoke(delegate, args);
        } catch (InvocationTargetException e) {
            throw e.getCause();
        }
        if ("remove".equals(method.getName()) && args != null && args.length == 1) {
            hook.clientRemoved(String.valueOf(args[0]), System.currentTimeMillis());
        }
        if (update) {
            Boolean reachable = args.length >= 4 && args[3] instanceof Boolean ? (Boolean) args[3] : null;
            String broker = String.valueOf(args[0]);
            hook.clientUpdated(broker, (Long) args[1], (Long) args[2], reachable, before, this);
        }
        return out;
    }

    /** The avoid-until the client holds for {@code broker} now, or -1 when it has no item or it cannot be read. */
    long startTimestamp(String broker) {
        try {
            Object item = ((Map<?, ?>) itemTable.get(delegate)).get(broker);
            if (item == null) {
                return -1L;
            }
            Method getter = START_GETTERS.computeIfAbsent(item.getClass(), ClientLatencyTap::startGetter);
            return getter == null ? -1L : (Long) getter.invoke(item);
        } catch (ReflectiveOperationException | RuntimeException e) {
            return -1L;
        }
    }

    private static Method startGetter(Class<?> itemClass) {
        try {
            Method m = itemClass.getMethod("getStartTimestamp");
            m.setAccessible(true); // the item class is package-private in 4.9.x
            return m;
        } catch (ReflectiveOperationException | RuntimeException e) {
            return null;
        }
    }

    private Object objectMethod(Object proxy, Method method, Object[] args) {
        switch (method.getName()) {
            case "equals": return proxy == args[0];
            case "hashCode": return System.identityHashCode(proxy);
            default: return "faultwatch client-latency tap over " + delegate;
        }
    }

    private static Field declaredField(Class<?> start, String name) throws NoSuchFieldException {
        for (Class<?> c = start; c != null; c = c.getSuperclass()) {
            try {
                Field f = c.getDeclaredField(name);
                f.setAccessible(true);
                return f;
            } catch (NoSuchFieldException e) {
                // look in the superclass
            }
        }
        throw new NoSuchFieldException(start.getName() + "." + name);
    }
}
