/*
 * An ordinary RocketMQ application for the zns-agent tests (tests/interop/test_agent.py,
 * bench/agent.py): a producer and/or a consumer with RocketMQ's defaults (30 s NameServer
 * poll, 20 s rebalance) unless told otherwise, that reports what its client believes, so
 * that a test can see when a route change reaches it. It knows nothing of the agent.
 *
 *   --namesrv A --topic T [--rate R] [--retries N] [--consumer push|lite|none]
 *   [--group G] [--duration S] [--watch-ms MS] [--print-sends true] [--print-receives true] [--poll-ms MS]
 *
 * JSON lines on stdout, each with wall_ms (the wall clock, ms):
 *   {"event":"publish","brokers":[...]}    the brokers with writable queues in the
 *                                           producer's publish info changed
 *   {"event":"assigned","brokers":[...]}   the brokers of the queues assigned to the
 *                                           consumer (its process queues) changed
 *   {"event":"send","seq":N,"ok":B,"broker":B,"error":E}   with --print-sends
 *   {"event":"received","broker":B}        each message the push consumer got, with --print-receives
 *   {"summary":true,"sent":N,"failed":N,"brokers":{...},"received":{...}}
 * The watch reads the client's tables every --watch-ms (5 by default; 0 = no watch, for
 * idle measurements) on its own thread, so that a send blocked on a dying broker does not
 * delay it. Stops after --duration seconds or when stdin closes.
 *
 * Compiled against the 5.3.3 client; uses only classes and methods that RocketMQ 4.9.x has
 * under the same names, so the same class file runs on a 4.9 classpath.
 */

import java.lang.reflect.Field;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.impl.producer.TopicPublishInfo;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

public final class AgentProbe {
    private static final Map<String, String> opts = new TreeMap<>();
    private static volatile boolean running = true;
    private static boolean printReceives;

    private AgentProbe() {
    }

    public static void main(String[] args) throws Exception {
        for (int i = 0; i + 1 < args.length; i += 2) {
            opts.put(args[i].replaceFirst("^--", ""), args[i + 1]);
        }
        String namesrv = opts.get("namesrv");
        String topic = opts.get("topic");
        double rate = Double.parseDouble(opts.getOrDefault("rate", "0"));
        String consumerKind = opts.getOrDefault("consumer", "none");
        long watchMs = Long.parseLong(opts.getOrDefault("watch-ms", "5"));
        boolean printSends = Boolean.parseBoolean(opts.getOrDefault("print-sends", "false"));
        printReceives = Boolean.parseBoolean(opts.getOrDefault("print-receives", "false"));
        long endNs = System.nanoTime() + (long) (Double.parseDouble(opts.getOrDefault("duration", "600")) * 1e9);
        String pid = java.lang.management.ManagementFactory.getRuntimeMXBean().getName().split("@")[0];

        Thread stdin = new Thread(() -> {
            try {
                while (System.in.read() >= 0) {
                    // keep reading: the test closes stdin to stop the probe
                }
            } catch (Exception e) {
                // closed
            }
            running = false;
        }, "probe-stdin");
        stdin.setDaemon(true);
        stdin.start();

        DefaultMQProducer producer = null;
        if (rate > 0) {
            producer = new DefaultMQProducer(opts.getOrDefault("group", "agent_probe_producer"));
            producer.setNamesrvAddr(namesrv);
            producer.setInstanceName("agent-probe-" + pid);
            producer.setRetryTimesWhenSendFailed(Integer.parseInt(opts.getOrDefault("retries", "2")));
            if (opts.containsKey("poll-ms")) {
                producer.setPollNameServerInterval(Integer.parseInt(opts.get("poll-ms")));
            }
            producer.start();
        }
        DefaultMQPushConsumer push = null;
        DefaultLitePullConsumer lite = null;
        Map<String, AtomicLong> received = new ConcurrentHashMap<>();
        String group = opts.getOrDefault("consumer-group", "agent_probe_cg_" + pid + "_" + System.nanoTime());
        if (consumerKind.equals("push")) {
            push = startPush(namesrv, topic, group, pid, received);
        } else if (consumerKind.equals("lite")) {
            lite = startLite(namesrv, topic, group, pid);
            DefaultLitePullConsumer l = lite;
            Thread poller = new Thread(() -> {
                while (running) {
                    try {
                        for (MessageExt m : l.poll(200)) {
                            received.computeIfAbsent(String.valueOf(m.getBrokerName()), k -> new AtomicLong()).incrementAndGet();
                        }
                    } catch (Exception e) {
                        // shutting down
                    }
                }
            }, "probe-lite-poll");
            poller.setDaemon(true);
            poller.start();
        }
        print("{\"event\":\"started\",\"pid\":" + pid + ",\"wall_ms\":" + System.currentTimeMillis() + "}");

        // The watch has its own thread: a send stuck on a dying broker (up to the 3 s send
        // timeout) must not delay seeing the client's tables change.
        if (watchMs > 0) {
            final DefaultMQProducer watchedProducer = producer;
            final Object rebalance = push != null ? push.getDefaultMQPushConsumerImpl().getRebalanceImpl()
                : lite != null ? liteRebalance(lite) : null;
            Thread watch = new Thread(() -> watch(watchedProducer, rebalance, topic, watchMs), "probe-watch");
            watch.setDaemon(true);
            watch.start();
        }

        long sent = 0;
        long failed = 0;
        Map<String, Long> brokers = new TreeMap<>();
        long periodNs = rate > 0 ? (long) (1e9 / rate) : Long.MAX_VALUE;
        long nextSend = System.nanoTime();
        long seq = 0;
        while (running && System.nanoTime() < endNs) {
            long now = System.nanoTime();
            if (producer != null && now >= nextSend) {
                nextSend += periodNs;
                if (nextSend < now) {
                    nextSend = now + periodNs;
                }
                String broker = null;
                String error = null;
                boolean ok;
                try {
                    Message msg = new Message(topic, "probe", ("agent probe " + seq).getBytes(StandardCharsets.UTF_8));
                    SendResult r = producer.send(msg);
                    ok = r.getSendStatus() == SendStatus.SEND_OK;
                    broker = r.getMessageQueue().getBrokerName();
                } catch (Exception e) {
                    ok = false;
                    error = e.getClass().getSimpleName() + ": " + String.valueOf(e.getMessage()).split("\n")[0];
                }
                if (ok) {
                    sent++;
                    brokers.merge(broker, 1L, Long::sum);
                } else {
                    failed++;
                }
                if (printSends) {
                    print("{\"event\":\"send\",\"seq\":" + seq + ",\"ok\":" + ok + ",\"broker\":" + str(broker)
                        + ",\"error\":" + str(error) + ",\"wall_ms\":" + System.currentTimeMillis() + "}");
                }
                seq++;
            }
            long wake = producer != null ? nextSend : Long.MAX_VALUE;
            long sleep = Math.min(wake, endNs) - System.nanoTime();
            if (sleep > 0) {
                TimeUnit.NANOSECONDS.sleep(Math.min(sleep, TimeUnit.MILLISECONDS.toNanos(200)));
            }
        }
        StringBuilder r = new StringBuilder("{");
        for (Map.Entry<String, AtomicLong> e : received.entrySet()) {
            r.append(r.length() > 1 ? "," : "").append(str(e.getKey())).append(':').append(e.getValue().get());
        }
        r.append('}');
        StringBuilder b = new StringBuilder("{");
        for (Map.Entry<String, Long> e : brokers.entrySet()) {
            b.append(b.length() > 1 ? "," : "").append(str(e.getKey())).append(':').append(e.getValue());
        }
        b.append('}');
        print("{\"summary\":true,\"sent\":" + sent + ",\"failed\":" + failed + ",\"brokers\":" + b + ",\"received\":" + r + "}");
        Runtime.getRuntime().halt(0); // a client's shutdown waits on Netty; nothing is left to flush
    }

    /** Prints a line whenever the producer's publish info or the consumer's assigned queues change. */
    private static void watch(DefaultMQProducer producer, Object rebalance, String topic, long watchMs) {
        String published = null;
        String assigned = null;
        while (running) {
            if (producer != null) {
                String p = publishBrokers(producer, topic);
                if (p != null && !p.equals(published)) {
                    published = p;
                    print("{\"event\":\"publish\",\"brokers\":" + p + ",\"wall_ms\":" + System.currentTimeMillis() + "}");
                }
            }
            if (rebalance != null) {
                String a = assignedBrokers(rebalance, topic);
                if (!a.equals(assigned)) {
                    assigned = a;
                    print("{\"event\":\"assigned\",\"brokers\":" + a + ",\"wall_ms\":" + System.currentTimeMillis() + "}");
                }
            }
            try {
                TimeUnit.MILLISECONDS.sleep(watchMs);
            } catch (InterruptedException e) {
                return;
            }
        }
    }

    /** A loaded machine can time out a start's first route request: start again, as an application would. */
    private static DefaultMQPushConsumer startPush(String namesrv, String topic, String group, String pid,
                                                   Map<String, AtomicLong> received) throws Exception {
        for (int attempt = 1; ; attempt++) {
            DefaultMQPushConsumer push = new DefaultMQPushConsumer(group);
            push.setNamesrvAddr(namesrv);
            push.setInstanceName("agent-probe-" + pid);
            push.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET);
            push.setConsumeThreadMin(1);
            push.setConsumeThreadMax(2);
            push.subscribe(topic, "*");
            push.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                for (MessageExt m : msgs) {
                    received.computeIfAbsent(String.valueOf(m.getBrokerName()), k -> new AtomicLong()).incrementAndGet();
                    if (printReceives) {
                        print("{\"event\":\"received\",\"broker\":" + str(m.getBrokerName()) + ",\"wall_ms\":"
                            + System.currentTimeMillis() + "}");
                    }
                }
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
            try {
                push.start();
                return push;
            } catch (Exception e) {
                push.shutdown();
                if (attempt == 3) {
                    throw e;
                }
            }
        }
    }

    private static DefaultLitePullConsumer startLite(String namesrv, String topic, String group, String pid)
            throws Exception {
        for (int attempt = 1; ; attempt++) {
            DefaultLitePullConsumer lite = new DefaultLitePullConsumer(group);
            lite.setNamesrvAddr(namesrv);
            lite.setInstanceName("agent-probe-" + pid);
            lite.subscribe(topic, "*");
            try {
                lite.start();
                return lite;
            } catch (Exception e) {
                lite.shutdown();
                if (attempt == 3) {
                    throw e;
                }
            }
        }
    }

    private static String publishBrokers(DefaultMQProducer producer, String topic) {
        TopicPublishInfo info = producer.getDefaultMQProducerImpl().getTopicPublishInfoTable().get(topic);
        if (info == null || info.getMessageQueueList() == null) {
            return null;
        }
        Set<String> names = new TreeSet<>();
        for (MessageQueue mq : info.getMessageQueueList()) {
            names.add(mq.getBrokerName());
        }
        return list(names);
    }

    private static Object liteRebalance(DefaultLitePullConsumer lite) {
        try {
            Object impl = field(lite, "defaultLitePullConsumerImpl");
            return field(impl, "rebalanceImpl");
        } catch (Exception e) {
            return null;
        }
    }

    private static String assignedBrokers(Object rebalanceImpl, String topic) {
        Set<String> names = new TreeSet<>();
        try {
            Map<?, ?> table = (Map<?, ?>) rebalanceImpl.getClass().getMethod("getProcessQueueTable").invoke(rebalanceImpl);
            for (Object key : new ArrayList<>((Collection<?>) table.keySet())) {
                MessageQueue mq = (MessageQueue) key;
                if (mq.getTopic().equals(topic)) {
                    names.add(mq.getBrokerName());
                }
            }
        } catch (Exception e) {
            // not readable now; seen at the next look
        }
        return list(names);
    }

    private static Object field(Object target, String name) throws Exception {
        for (Class<?> c = target.getClass(); c != null; c = c.getSuperclass()) {
            try {
                Field f = c.getDeclaredField(name);
                f.setAccessible(true);
                return f.get(target);
            } catch (NoSuchFieldException e) {
                // the superclass then
            }
        }
        throw new NoSuchFieldException(name);
    }

    private static String list(Collection<String> names) {
        List<String> quoted = new ArrayList<>();
        for (String n : names) {
            quoted.add(str(n));
        }
        return "[" + String.join(",", quoted) + "]";
    }

    private static String str(String s) {
        return s == null ? "null" : "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }

    private static void print(String line) {
        synchronized (System.out) {
            System.out.println(line);
            System.out.flush();
        }
    }
}
