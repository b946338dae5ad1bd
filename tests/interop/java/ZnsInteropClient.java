/*
 * A small RocketMQ client for the zns interop tests. It talks to whatever
 * NameServer --namesrv names (the Java one or zns) and prints JSON lines that the
 * Python harness (tests/interop/rocketmq.py) parses. Compiled at test time against
 * each version's cached client classpath (4.9.7, 5.3.3, 5.5.0); see tests/interop/README.md.
 * One source for all of them: the route classes moved package in 5.0
 * (common.protocol.route -> remoting.protocol.route), so they are never named here
 * (`var`), and the BrokerData getters 5.0 added (isEnableActingMaster, getZoneName)
 * are read reflectively and left out of the output on 4.x.
 *
 *   produce      --namesrv A --topic T --count N          one summary line
 *   produce-loop --namesrv A --topic T --duration S --rate R
 *                one line per send, then a summary line; a line "stop" on stdin ends
 *                it before the duration (the harness stops it once it has what it needs)
 *   consume      --namesrv A --topic T --count N --timeout S   one summary line
 *   route        --namesrv A --topic T                    the TopicRouteData as JSON
 *   watch-route  --namesrv A --topic T --broker NAME [--timeout S] [--every-ms N]
 *                a producer (RocketMQ's 30 s route poll unless --poll-ms) follows T;
 *                prints a "listed" line once its route table has broker NAME, then a
 *                "gone" line (wall-clock ms) as soon as the table no longer lists it
 *   mqadmin      <mqadmin arguments>                      runs the stock mqadmin command
 *                in-process and halts as soon as it returns (the stock launcher's JVM
 *                lingers while Netty's non-daemon threads shut down gracefully)
 *
 * Exit codes: 0 success, 1 some sends/receives missing, 2 error (printed as JSON).
 * Every mode flushes and leaves through Runtime.halt, for the same reason.
 */

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.exception.MQBrokerException;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.impl.producer.DefaultMQProducerImpl;
import org.apache.rocketmq.client.impl.producer.TopicPublishInfo;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.remoting.netty.NettyClientConfig;
import org.apache.rocketmq.remoting.netty.NettyRemotingClient;
import org.apache.rocketmq.remoting.protocol.RemotingCommand;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;
import org.apache.rocketmq.tools.command.MQAdminStartup;

public final class ZnsInteropClient {

    private ZnsInteropClient() {
    }

    public static void main(String[] args) {
        int rc;
        try {
            if (args.length == 0) {
                throw new IllegalArgumentException("usage: ZnsInteropClient produce|produce-loop|consume|route|watch-route|mqadmin ...");
            }
            String mode = args[0];
            if (mode.equals("mqadmin")) {
                String[] rest = new String[args.length - 1];
                System.arraycopy(args, 1, rest, 0, rest.length);
                awaitNameServers(rest);
                MQAdminStartup.main0(rest, null);
                rc = 0;
            } else {
                Map<String, String> opts = parse(args);
                if (mode.equals("produce") || mode.equals("consume") || mode.equals("route")) {
                    awaitNameServers(opts.get("namesrv"));
                }
                switch (mode) {
                    case "produce":
                        rc = produce(opts);
                        break;
                    case "produce-loop":
                        rc = produceLoop(opts);
                        break;
                    case "consume":
                        rc = consume(opts);
                        break;
                    case "route":
                        rc = route(opts);
                        break;
                    case "watch-route":
                        rc = watchRoute(opts);
                        break;
                    default:
                        throw new IllegalArgumentException("unknown mode " + mode);
                }
            }
        } catch (Throwable t) {
            Map<String, Object> err = new LinkedHashMap<>();
            err.put("ok", false);
            err.put("error", describe(t));
            if (t instanceof MQClientException) {
                err.put("code", ((MQClientException) t).getResponseCode());
            }
            System.out.println(json(err));
            t.printStackTrace();
            rc = 2;
        }
        System.out.flush();
        System.err.flush();
        Runtime.getRuntime().halt(rc);
    }

    /**
     * Before a stock mqadmin command: wait, up to 40 s (the harness gives the process 60),
     * until every NameServer of its -n has answered this JVM once (GET_NAMESRV_CONFIG, 319).
     * A stock command gives its request 5 s (DefaultMQAdminExt), counted from before its
     * own connect; in a fresh JVM that budget also paid for loading and setting up Netty
     * and the remoting codec, which on a loaded 2-core machine took more than all of it
     * (RemotingTimeoutException before the request was even sent). Done here first, with
     * a deadline of its own, the command's budget covers only its own request.
     */
    private static void awaitNameServers(String[] mqadminArgs) throws Exception {
        for (int i = 0; i + 1 < mqadminArgs.length; i++) {
            if (mqadminArgs[i].equals("-n")) {
                awaitNameServers(mqadminArgs[i + 1]);
            }
        }
    }

    /** The same for produce, consume and route: their first request has 3 s (api-timeout). */
    private static void awaitNameServers(String namesrv) throws Exception {
        NettyRemotingClient client = new NettyRemotingClient(new NettyClientConfig());
        client.start();
        long deadline = System.nanoTime() + 40_000_000_000L;
        for (String addr : namesrv.split(";")) {
            if (addr.trim().isEmpty()) {
                continue;
            }
            long left = Math.max(1, (deadline - System.nanoTime()) / 1_000_000);
            try {
                client.invokeSync(addr.trim(), RemotingCommand.createRequestCommand(319, null), left);
            } catch (Exception e) {
                // One that is down or refuses is the test's business (some kill one on purpose):
                // the command itself meets it.
            }
        }
        // Not shut down: its Netty threads stop when the JVM halts after the command.
    }

    // ---- options -------------------------------------------------------------------

    private static Map<String, String> parse(String[] args) {
        Map<String, String> opts = new HashMap<>();
        for (int i = 1; i < args.length; i++) {
            String a = args[i];
            if (!a.startsWith("--") || i + 1 >= args.length) {
                throw new IllegalArgumentException("expected --name value, got " + a);
            }
            opts.put(a.substring(2), args[++i]);
        }
        if (!opts.containsKey("namesrv")) {
            throw new IllegalArgumentException("--namesrv is required");
        }
        if (!opts.containsKey("topic")) {
            throw new IllegalArgumentException("--topic is required");
        }
        return opts;
    }

    private static int intOpt(Map<String, String> o, String k, int dflt) {
        return o.containsKey(k) ? Integer.parseInt(o.get(k)) : dflt;
    }

    private static double doubleOpt(Map<String, String> o, String k, double dflt) {
        return o.containsKey(k) ? Double.parseDouble(o.get(k)) : dflt;
    }

    // ---- producer ------------------------------------------------------------------

    private static DefaultMQProducer startProducer(Map<String, String> o) throws MQClientException {
        DefaultMQProducer p = new DefaultMQProducer(o.getOrDefault("group", "zns_interop_producer"));
        p.setNamesrvAddr(o.get("namesrv"));
        p.setInstanceName("zns-interop-" + ProcessHandle.current().pid());
        p.setSendMsgTimeout(intOpt(o, "send-timeout", 3000));
        p.setRetryTimesWhenSendFailed(intOpt(o, "retries", 2));
        p.setPollNameServerInterval(intOpt(o, "poll-ms", 1000));
        p.setHeartbeatBrokerInterval(intOpt(o, "heartbeat-ms", 5000));
        p.setSendLatencyFaultEnable(true);
        p.setMqClientApiTimeout(intOpt(o, "api-timeout", 3000));
        p.start();
        return p;
    }

    private static Message message(String topic, String runId, long seq, int bodySize) {
        StringBuilder body = new StringBuilder("zns-interop ").append(runId).append(' ').append(seq);
        while (body.length() < bodySize) {
            body.append('.');
        }
        Message m = new Message(topic, "interop", body.toString().getBytes(java.nio.charset.StandardCharsets.UTF_8));
        m.setKeys(runId + "-" + seq);
        return m;
    }

    private static int produce(Map<String, String> o) throws Exception {
        String topic = o.get("topic");
        int count = intOpt(o, "count", 1);
        int bodySize = intOpt(o, "body-size", 64);
        String runId = o.getOrDefault("run-id", Long.toString(System.currentTimeMillis(), 36));
        DefaultMQProducer p = startProducer(o);
        long started = System.nanoTime();
        int sent = 0;
        int failed = 0;
        Map<String, Integer> brokers = new TreeMap<>();
        List<String> errors = new ArrayList<>();
        try {
            for (long seq = 0; seq < count; seq++) {
                try {
                    SendResult r = p.send(message(topic, runId, seq, bodySize));
                    if (r.getSendStatus() == SendStatus.SEND_OK) {
                        sent++;
                        brokers.merge(r.getMessageQueue().getBrokerName(), 1, Integer::sum);
                    } else {
                        failed++;
                        addError(errors, "status " + r.getSendStatus());
                    }
                } catch (Exception e) {
                    failed++;
                    addError(errors, describe(e));
                }
            }
        } finally {
            boundedShutdown(p::shutdown);
        }
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("mode", "produce");
        out.put("ok", failed == 0);
        out.put("topic", topic);
        out.put("run_id", runId);
        out.put("requested", count);
        out.put("sent", sent);
        out.put("failed", failed);
        out.put("brokers", brokers);
        out.put("errors", errors);
        out.put("elapsed_ms", (System.nanoTime() - started) / 1_000_000);
        System.out.println(json(out));
        return failed == 0 ? 0 : 1;
    }

    private static int produceLoop(Map<String, String> o) throws Exception {
        String topic = o.get("topic");
        double duration = doubleOpt(o, "duration", 10);
        double rate = doubleOpt(o, "rate", 20);
        int bodySize = intOpt(o, "body-size", 64);
        String runId = o.getOrDefault("run-id", Long.toString(System.currentTimeMillis(), 36));
        DefaultMQProducer p = startProducer(o);
        long started = System.nanoTime();
        long end = started + (long) (duration * 1e9);
        long periodNs = (long) (1e9 / rate);
        int sent = 0;
        int failed = 0;
        Map<String, Integer> brokers = new TreeMap<>();
        AtomicBoolean stop = new AtomicBoolean();
        Thread stdin = new Thread(() -> {
            try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
                for (String line = in.readLine(); line != null; line = in.readLine()) {
                    if (line.trim().equals("stop")) {
                        stop.set(true);
                        return;
                    }
                }
            } catch (IOException e) {
                // no stdin: the duration ends the loop
            }
        }, "produce-loop-stdin");
        stdin.setDaemon(true);
        stdin.start();
        System.out.println(json(mapOf("event", "started", "run_id", runId)));
        System.out.flush();
        try {
            long seq = 0;
            long next = started;
            while (!stop.get() && System.nanoTime() < end) {
                long t0 = System.nanoTime();
                Map<String, Object> line = new LinkedHashMap<>();
                line.put("seq", seq);
                line.put("t_ms", (t0 - started) / 1_000_000);
                try {
                    SendResult r = p.send(message(topic, runId, seq, bodySize));
                    boolean ok = r.getSendStatus() == SendStatus.SEND_OK;
                    line.put("ok", ok);
                    line.put("broker", r.getMessageQueue().getBrokerName());
                    line.put("queue", r.getMessageQueue().getQueueId());
                    if (ok) {
                        sent++;
                        brokers.merge(r.getMessageQueue().getBrokerName(), 1, Integer::sum);
                    } else {
                        failed++;
                        line.put("error", "status " + r.getSendStatus());
                    }
                } catch (Exception e) {
                    failed++;
                    line.put("ok", false);
                    line.put("error", describe(e));
                }
                line.put("latency_ms", (System.nanoTime() - t0) / 1_000_000);
                System.out.println(json(line));
                System.out.flush();
                seq++;
                next += periodNs;
                long sleep = next - System.nanoTime();
                if (sleep > 0) {
                    TimeUnit.NANOSECONDS.sleep(sleep);
                } else {
                    next = System.nanoTime();
                }
            }
        } finally {
            boundedShutdown(p::shutdown);
        }
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("mode", "produce-loop");
        out.put("summary", true);
        out.put("sent", sent);
        out.put("failed", failed);
        out.put("brokers", brokers);
        out.put("elapsed_ms", (System.nanoTime() - started) / 1_000_000);
        System.out.println(json(out));
        return 0;
    }

    // ---- consumer ------------------------------------------------------------------

    private static int consume(Map<String, String> o) throws Exception {
        String topic = o.get("topic");
        int count = intOpt(o, "count", 1);
        double timeout = doubleOpt(o, "timeout", 30);
        String runId = o.get("run-id");
        Set<String> unique = ConcurrentHashMap.newKeySet();
        AtomicLong received = new AtomicLong();
        Map<String, AtomicLong> brokers = new ConcurrentHashMap<>();
        CountDownLatch done = new CountDownLatch(1);

        // A fresh group by default: it starts from the first offset and shares no queues.
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(
            o.getOrDefault("group", "zns_interop_cg_" + ProcessHandle.current().pid() + "_" + System.nanoTime()));
        c.setNamesrvAddr(o.get("namesrv"));
        c.setInstanceName("zns-interop-" + ProcessHandle.current().pid());
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.setPollNameServerInterval(intOpt(o, "poll-ms", 1000));
        c.setHeartbeatBrokerInterval(intOpt(o, "heartbeat-ms", 5000));
        c.setConsumeThreadMin(2);
        c.setConsumeThreadMax(4);
        c.setMqClientApiTimeout(intOpt(o, "api-timeout", 3000));
        c.subscribe(topic, "*");
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                String key = m.getKeys();
                if (runId != null && (key == null || !key.startsWith(runId + "-"))) {
                    continue;
                }
                received.incrementAndGet();
                unique.add(key == null ? m.getMsgId() : key);
                brokers.computeIfAbsent(m.getBrokerName() == null ? "?" : m.getBrokerName(),
                    k -> new AtomicLong()).incrementAndGet();
            }
            if (unique.size() >= count) {
                done.countDown();
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        long started = System.nanoTime();
        c.start();
        boolean complete = done.await((long) (timeout * 1000), TimeUnit.MILLISECONDS);
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("mode", "consume");
        out.put("ok", complete);
        out.put("topic", topic);
        out.put("expected", count);
        out.put("received", received.get());
        out.put("unique", unique.size());
        Map<String, Long> b = new TreeMap<>();
        brokers.forEach((k, v) -> b.put(k, v.get()));
        out.put("brokers", b);
        out.put("timed_out", !complete);
        out.put("elapsed_ms", (System.nanoTime() - started) / 1_000_000);
        System.out.println(json(out));
        System.out.flush();
        boundedShutdown(c::shutdown);
        return complete ? 0 : 1;
    }

    // ---- route ---------------------------------------------------------------------

    private static int route(Map<String, String> o) throws Exception {
        DefaultMQAdminExt admin = new DefaultMQAdminExt(intOpt(o, "api-timeout", 3000));
        admin.setNamesrvAddr(o.get("namesrv"));
        admin.setInstanceName("zns-interop-" + ProcessHandle.current().pid());
        admin.start();
        try {
            var route = admin.examineTopicRouteInfo(o.get("topic"));
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("ok", true);
            out.put("topic", o.get("topic"));
            out.put("orderTopicConf", route.getOrderTopicConf());
            List<Object> bds = new ArrayList<>();
            for (var bd : route.getBrokerDatas()) {
                Map<String, Object> m = new LinkedHashMap<>();
                m.put("cluster", bd.getCluster());
                m.put("brokerName", bd.getBrokerName());
                Map<String, String> addrs = new TreeMap<>();
                bd.getBrokerAddrs().forEach((id, addr) -> addrs.put(Long.toString(id), addr));
                m.put("brokerAddrs", addrs);
                putIfPresent(m, "enableActingMaster", bd, "isEnableActingMaster");
                putIfPresent(m, "zoneName", bd, "getZoneName");
                bds.add(m);
            }
            out.put("brokerDatas", bds);
            List<Object> qds = new ArrayList<>();
            for (var qd : route.getQueueDatas()) {
                Map<String, Object> m = new LinkedHashMap<>();
                m.put("brokerName", qd.getBrokerName());
                m.put("readQueueNums", qd.getReadQueueNums());
                m.put("writeQueueNums", qd.getWriteQueueNums());
                m.put("perm", qd.getPerm());
                m.put("topicSysFlag", qd.getTopicSysFlag());
                qds.add(m);
            }
            out.put("queueDatas", qds);
            Map<String, Object> filters = new TreeMap<>();
            if (route.getFilterServerTable() != null) {
                filters.putAll(route.getFilterServerTable());
            }
            out.put("filterServerTable", filters);
            // The client's own serialization of what it parsed: every field it knows.
            out.put("parsed", route.toJson());
            System.out.println(json(out));
            return 0;
        } catch (MQClientException e) {
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("ok", false);
            out.put("code", e.getResponseCode());
            out.put("error", describe(e));
            System.out.println(json(out));
            return 2;
        } finally {
            boundedShutdown(admin::shutdown);
        }
    }

    /** A getter only some versions have (5.0 added to BrokerData): its value, or no key. */
    private static void putIfPresent(Map<String, Object> m, String key, Object target, String getter) {
        try {
            m.put(key, target.getClass().getMethod(getter).invoke(target));
        } catch (NoSuchMethodException e) {
            // absent in this client version
        } catch (ReflectiveOperationException e) {
            throw new IllegalStateException(e);
        }
    }

    // ---- watch-route ---------------------------------------------------------------

    /**
     * What a producer believes: the route in its own topic table, which only the periodic
     * NameServer poll (pollNameServerInterval, 30 s by default) refreshes. The topic is put
     * into the table as a send would put it, so the poll follows it; the table is then read
     * every --every-ms and the moment --broker leaves it is printed (wall clock, ms).
     */
    private static int watchRoute(Map<String, String> o) throws Exception {
        String topic = o.get("topic");
        String broker = o.get("broker");
        if (broker == null) {
            throw new IllegalArgumentException("--broker is required");
        }
        o.putIfAbsent("poll-ms", "30000");
        long deadline = System.nanoTime() + (long) (doubleOpt(o, "timeout", 60) * 1e9);
        int every = intOpt(o, "every-ms", 10);
        DefaultMQProducer p = startProducer(o);
        try {
            DefaultMQProducerImpl impl = p.getDefaultMQProducerImpl();
            impl.getTopicPublishInfoTable().putIfAbsent(topic, new TopicPublishInfo());
            boolean listed = false;
            while (System.nanoTime() < deadline) {
                if (!listed) {
                    impl.getMqClientFactory().updateTopicRouteInfoFromNameServer(topic);
                }
                boolean now = lists(impl.getTopicPublishInfoTable().get(topic), broker);
                if (now && !listed) {
                    listed = true;
                    System.out.println(json(mapOf("event", "listed", "broker", broker, "wall_ms", System.currentTimeMillis())));
                    System.out.flush();
                } else if (!now && listed) {
                    System.out.println(json(mapOf("event", "gone", "ok", true, "broker", broker, "wall_ms", System.currentTimeMillis())));
                    return 0;
                }
                TimeUnit.MILLISECONDS.sleep(every);
            }
            System.out.println(json(mapOf("event", "timeout", "ok", false, "broker", broker, "listed", listed)));
            return 1;
        } finally {
            boundedShutdown(p::shutdown);
        }
    }

    private static boolean lists(TopicPublishInfo info, String broker) {
        if (info == null || info.getTopicRouteData() == null) {
            return false;
        }
        for (var bd : info.getTopicRouteData().getBrokerDatas()) {
            if (broker.equals(bd.getBrokerName())) {
                return true;
            }
        }
        return false;
    }

    // ---- helpers -------------------------------------------------------------------

    /**
     * Unregister from the brokers and close, but give up after a second: a client's
     * shutdown joins a Netty event thread that polls every 3 s, and the JVM halts next.
     */
    private static void boundedShutdown(Runnable shutdown) {
        Thread t = new Thread(shutdown, "zns-interop-shutdown");
        t.setDaemon(true);
        t.start();
        try {
            t.join(1000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    private static void addError(List<String> errors, String e) {
        if (errors.size() < 10) {
            errors.add(e);
        }
    }

    private static String describe(Throwable t) {
        String msg = t.getClass().getSimpleName() + ": " + t.getMessage();
        if (t instanceof MQBrokerException) {
            msg += " (code " + ((MQBrokerException) t).getResponseCode() + ")";
        }
        if (msg.length() > 300) {
            msg = msg.substring(0, 300) + "...";
        }
        return msg;
    }

    private static Map<String, Object> mapOf(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i < kv.length; i += 2) {
            m.put((String) kv[i], kv[i + 1]);
        }
        return m;
    }

    /** Standard JSON (RocketMQ's own serializer writes non-string map keys unquoted). */
    static String json(Object v) {
        StringBuilder sb = new StringBuilder();
        write(sb, v);
        return sb.toString();
    }

    private static void write(StringBuilder sb, Object v) {
        if (v == null) {
            sb.append("null");
        } else if (v instanceof String) {
            sb.append('"');
            for (char ch : ((String) v).toCharArray()) {
                switch (ch) {
                    case '"': sb.append("\\\""); break;
                    case '\\': sb.append("\\\\"); break;
                    case '\n': sb.append("\\n"); break;
                    case '\r': sb.append("\\r"); break;
                    case '\t': sb.append("\\t"); break;
                    default:
                        if (ch < 0x20) {
                            sb.append(String.format("\\u%04x", (int) ch));
                        } else {
                            sb.append(ch);
                        }
                }
            }
            sb.append('"');
        } else if (v instanceof Boolean || v instanceof Integer || v instanceof Long) {
            sb.append(v);
        } else if (v instanceof Number) {
            sb.append(((Number) v).doubleValue());
        } else if (v instanceof Map) {
            sb.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                if (!first) {
                    sb.append(',');
                }
                first = false;
                write(sb, String.valueOf(e.getKey()));
                sb.append(':');
                write(sb, e.getValue());
            }
            sb.append('}');
        } else if (v instanceof Iterable) {
            sb.append('[');
            boolean first = true;
            for (Object x : (Iterable<?>) v) {
                if (!first) {
                    sb.append(',');
                }
                first = false;
                write(sb, x);
            }
            sb.append(']');
        } else {
            write(sb, v.toString());
        }
    }
}
