package zns.agent;

import java.io.IOException;
import java.lang.instrument.Instrumentation;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.TimeUnit;

import org.zeromq.ZContext;

/**
 * zns-agent: pushed route changes for unmodified RocketMQ Java applications.
 *
 * <pre>
 * java -javaagent:zns-agent.jar[=options] ...            attach at start (or JAVA_TOOL_OPTIONS)
 * java -jar zns-agent.jar NAMESRV                         is NAMESRV a zns? prints its events endpoint
 * java -jar zns-agent.jar NAMESRV --follow S TOPIC...     follow TOPIC for S seconds, print refreshes
 *                         [--args events=tcp://H:P,...]   agent arguments ({@link AgentConfig})
 * </pre>
 *
 * Attached, it starts one daemon thread ({@link AgentLoop}) and returns at once; nothing it
 * does can throw into the application. Options are described in {@link AgentConfig}.
 */
public final class ZnsAgent {
    private static boolean started;

    private ZnsAgent() {
    }

    public static void premain(String args, Instrumentation instrumentation) {
        start(args, instrumentation);
    }

    public static void agentmain(String args, Instrumentation instrumentation) {
        start(args, instrumentation);
    }

    private static synchronized void start(String args, Instrumentation instrumentation) {
        try {
            if (started) {
                return; // attached twice (JAVA_TOOL_OPTIONS and -javaagent): one agent is enough
            }
            AgentConfig config;
            try {
                config = AgentConfig.parse(args);
            } catch (IllegalArgumentException e) {
                Log.info("not started: bad agent argument: " + e.getMessage());
                return;
            }
            Log.quiet = config.quiet;
            Log.debug = config.debug;
            RocketMqClients clients = new RocketMqClients(instrumentation);
            AgentLoop loop = new AgentLoop(config, clients);
            Thread thread = new Thread(loop, "zns-agent");
            thread.setDaemon(true);
            thread.setContextClassLoader(ZnsAgent.class.getClassLoader());
            thread.setUncaughtExceptionHandler((t, e) -> { });
            clients.wakeOnLoad(thread);
            instrumentation.addTransformer(clients, false);
            thread.start();
            started = true;
        } catch (Throwable t) {
            try {
                Log.info("not started: " + t);
            } catch (Throwable ignored) {
                // nothing more to do without disturbing the application
            }
        }
    }

    /** The command-line check; see the class comment. Exit 0: zns found (and followed). */
    public static void main(String[] argv) throws Exception {
        List<String> args = new ArrayList<>(Arrays.asList(argv));
        if (args.isEmpty() || args.contains("-h") || args.contains("--help")) {
            System.out.println("usage: java -jar zns-agent.jar NAMESRV [--follow SECONDS TOPIC...] [--args AGENT_ARGS]\n"
                + "  attach: java -javaagent:zns-agent.jar[=events=...,maxBackoffMs=...,log=quiet] ...");
            System.exit(args.isEmpty() ? 2 : 0);
        }
        String agentArgs = option(args, "--args");
        String follow = option(args, "--follow");
        String namesrv = args.remove(0);
        AgentConfig config;
        try {
            config = AgentConfig.parse(agentArgs);
        } catch (IllegalArgumentException e) {
            System.err.println("zns-agent: " + e.getMessage());
            System.exit(2);
            return;
        }
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("namesrv", namesrv);
        NamesrvProbe.Answer answer;
        if (config.events != null) {
            answer = new NamesrvProbe.Answer(config.events, config.heartbeatMs, null);
        } else {
            try {
                answer = NamesrvProbe.ask(namesrv, config.probeTimeoutMs);
            } catch (IOException e) {
                answer = new NamesrvProbe.Answer(null, 0, e.getMessage());
            }
        }
        out.put("events", answer.endpoint);
        out.put("heartbeat_ms", answer.heartbeatIntervalMs);
        out.put("why", answer.why);
        System.out.println(Json.write(out));
        System.out.flush();
        if (answer.endpoint == null) {
            System.exit(1);
        }
        if (follow == null) {
            System.exit(0);
        }
        Log.quiet = config.quiet;
        Log.debug = config.debug;
        long until = AgentLoop.nowMs() + (long) (Double.parseDouble(follow) * 1000);
        PrintingTarget target = new PrintingTarget(namesrv, new TreeSet<>(args));
        ZContext[] context = new ZContext[1];
        Follower f = new Follower(namesrv, target, config, () -> {
            if (context[0] == null) {
                context[0] = new ZContext(1);
            }
            return context[0];
        }, () -> { }, AgentLoop.nowMs()); // no wake: the poll below is at most 100 ms
        try {
            while (AgentLoop.nowMs() < until) {
                long now = AgentLoop.nowMs();
                f.tick(now);
                f.syncSubscriptions();
                if (f.socket() != null) {
                    org.zeromq.ZMQ.Poller poller = context[0].createPoller(1);
                    poller.register(f.socket(), org.zeromq.ZMQ.Poller.POLLIN);
                    poller.poll(Math.max(1, Math.min(Math.min(until, f.nextDeadlineMs()) - now, 100)));
                    poller.close();
                    f.drain(AgentLoop.nowMs(), 10_000);
                } else {
                    TimeUnit.MILLISECONDS.sleep(Math.max(1, Math.min(until, f.nextDeadlineMs()) - now));
                }
                f.flush();
            }
        } finally {
            Map<String, Object> summary = f.describe();
            summary.put("summary", true);
            System.out.println(Json.write(summary));
            System.out.flush();
            f.close();
            if (context[0] != null) {
                context[0].close();
            }
        }
        System.exit(0);
    }

    private static String option(List<String> args, String name) {
        int i = args.indexOf(name);
        if (i < 0 || i + 1 >= args.size()) {
            return null;
        }
        String value = args.get(i + 1);
        args.remove(i + 1);
        args.remove(i);
        return value;
    }

    /** The command line's target: fixed topics; a refresh prints one JSON line. */
    private static final class PrintingTarget implements Target {
        private final String namesrv;
        private final Set<String> topics;

        PrintingTarget(String namesrv, Set<String> topics) {
            this.namesrv = namesrv;
            this.topics = topics;
        }

        @Override
        public List<String> namesrvAddrs() {
            return Collections.singletonList(namesrv);
        }

        @Override
        public Map<String, Set<String>> topics() {
            Map<String, Set<String>> m = new LinkedHashMap<>();
            for (String t : topics) {
                m.put(t, new HashSet<>());
            }
            return m;
        }

        @Override
        public String refresh(Set<String> refreshed, String why) {
            Map<String, Object> line = new LinkedHashMap<>();
            line.put("refresh", new TreeSet<>(refreshed));
            line.put("why", why);
            line.put("wall_ms", System.currentTimeMillis());
            System.out.println(Json.write(line));
            System.out.flush();
            return "";
        }

        @Override
        public String wakeConsumers() {
            return "";
        }
    }
}
