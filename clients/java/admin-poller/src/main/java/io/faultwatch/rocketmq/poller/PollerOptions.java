package io.faultwatch.rocketmq.poller;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/** The poller's command line; an unknown or incomplete option stops it with a message naming it. */
final class PollerOptions {
    static final List<String> STRATEGIES =
            Arrays.asList("AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH", "CONFIG", "MACHINE_ROOM", "MACHINE_ROOM_NEARBY");
    static final String USAGE = "usage: AdminPoller --namesrv HOST:PORT --cluster NAME --group G [--group G2 ...]\n"
            + "  [--kafka BOOTSTRAP] [--stdout] [--interval-ms 10000] [--timeout-ms 3000] [--once]\n"
            + "  [--strategy AVG] [--progress-topic rmq.consumer-progress] [--membership-topic rmq.group-membership]";

    String namesrv;
    String cluster;
    final List<String> groups = new ArrayList<>();
    String kafka;
    boolean stdout;
    boolean once;
    long intervalMs = 10_000;
    long timeoutMs = 3_000;
    String strategy = "AVG";
    String progressTopic = "rmq.consumer-progress";
    String membershipTopic = "rmq.group-membership";

    static PollerOptions parse(String[] args) {
        PollerOptions o = new PollerOptions();
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            switch (a) {
                case "--stdout": o.stdout = true; break;
                case "--once": o.once = true; break;
                case "--namesrv": o.namesrv = value(args, ++i, a); break;
                case "--cluster": o.cluster = value(args, ++i, a); break;
                case "--group": o.groups.add(value(args, ++i, a)); break;
                case "--kafka": o.kafka = value(args, ++i, a); break;
                case "--interval-ms": o.intervalMs = number(args, ++i, a); break;
                case "--timeout-ms": o.timeoutMs = number(args, ++i, a); break;
                case "--strategy": o.strategy = value(args, ++i, a); break;
                case "--progress-topic": o.progressTopic = value(args, ++i, a); break;
                case "--membership-topic": o.membershipTopic = value(args, ++i, a); break;
                default: throw fail("unknown option " + a);
            }
        }
        if (o.namesrv == null || o.cluster == null || o.groups.isEmpty()) {
            throw fail("--namesrv, --cluster and at least one --group are required");
        }
        if (o.kafka == null && !o.stdout) {
            throw fail("give --kafka BOOTSTRAP and/or --stdout: the events must go somewhere");
        }
        if (!STRATEGIES.contains(o.strategy)) {
            throw fail("unknown --strategy " + o.strategy + "; valid: " + STRATEGIES);
        }
        return o;
    }

    private static String value(String[] args, int i, String name) {
        if (i >= args.length) {
            throw fail(name + " needs a value");
        }
        return args[i];
    }

    private static long number(String[] args, int i, String name) {
        try {
            long v = Long.parseLong(value(args, i, name));
            if (v <= 0) {
                throw fail(name + " must be > 0");
            }
            return v;
        } catch (NumberFormatException e) {
            throw fail(name + " must be a whole number of milliseconds, got " + args[i]);
        }
    }

    private static IllegalArgumentException fail(String why) {
        return new IllegalArgumentException("faultwatch admin poller: " + why + "\n" + USAGE);
    }
}
