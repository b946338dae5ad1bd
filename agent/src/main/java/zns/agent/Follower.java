package zns.agent;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ThreadLocalRandom;
import java.util.function.Supplier;

import org.zeromq.SocketType;
import org.zeromq.ZContext;
import org.zeromq.ZMQ;

/**
 * Follows one zns events stream for the clients that share one NameServer list.
 *
 * <p>Two states. <b>Idle</b>: ask the NameServers, in the clients' order, for their
 * events endpoint (GET_NAMESRV_CONFIG); a NameServer that is not zns or cannot be
 * reached is asked again after a backoff (1 s doubling to {@code maxBackoffMs}, with
 * jitter), and meanwhile the application polls as it always does. <b>Following</b>: a SUB
 * socket subscribed to {@code route/<topic>} of every held topic and to
 * {@code broker/<cluster>/<name>} of every broker in their routes; each event goes through
 * the {@link Recipe} and the topics it names are refreshed by the clients themselves.
 *
 * <p>The {@code hb} comes on a second SUB socket that the loop does not wait on: it is
 * read whenever the loop wakes anyway and at the silence deadline. An idle agent then
 * wakes once per three heartbeat intervals instead of at every hb (each wake of a JVM
 * thread that runs cold code costs a fraction of a millisecond). The events socket
 * subscribes to {@code hb} only while a new subscription waits for its proof (protocol
 * step 2: the first hb on that socket after it). No hb for three intervals gives the
 * stream up (back to idle, asking again at once if it was followed for the longest
 * backoff, else after the backoff: see {@link #stop}); since the hb
 * socket is read at that deadline, a stream that dies is noticed three to six intervals
 * after its last hb, and meanwhile the application polls as it always does.
 *
 * <p>Logs one line when it starts following (at the first hb, when push is proven to
 * work) and one when it stops or finds no zns, never the same line twice in a row.
 */
final class Follower {
    /** Beyond this many held topics, one subscription to every route and broker channel. */
    static final int MAX_TOPIC_SUBSCRIPTIONS = 4096;
    /**
     * Events queued in the SUB socket beyond this are dropped, which bounds the agent's
     * memory inside the application (an event carries a whole route). A dropped change is
     * repaired by the topic's next event, or by the application's own 30 s poll.
     */
    static final int RCV_HWM = 1_000;
    /** hb events queued beyond this are dropped: the socket is read every third hb. */
    static final int HB_RCV_HWM = 100;
    /**
     * The largest frame taken on the events socket; a larger one closes the connection
     * (JeroMQ reconnects) before anything is allocated for it. The agent reads six scalar
     * fields of an event, but a route event carries its whole route, about 250 bytes per
     * broker of the topic: 256 KiB holds a topic served by a thousand brokers.
     */
    static final long MAX_EVENT_BYTES = 256 * 1024;
    /** The largest frame taken on the hb socket: an hb is about 60 bytes. */
    static final long MAX_HB_BYTES = 4 * 1024;
    /**
     * Bytes received on the events socket and not read by the agent beyond which the stream
     * is dropped ({@link FrameBudget}): 1,000 queued events (the high-water mark) of 8 KiB,
     * topics on about 30 brokers each, fit.
     */
    static final long MAX_UNREAD_EVENT_BYTES = 8L << 20;
    /** The same for the hb socket: {@link #HB_RCV_HWM} hb events of the largest size fit. */
    static final long MAX_UNREAD_HB_BYTES = HB_RCV_HWM * MAX_HB_BYTES;
    /**
     * The least time between the starts of two pulls of one topic: events of the topic that
     * arrive meanwhile (rising revisions, new epochs) are folded into one pull at the end of
     * the gap, so a topic is pulled ten times a second at most (11 in a second counted from
     * a pull) whatever the stream says. A
     * change after a quiet time is pulled at once; one that follows another within the gap
     * waits for its end.
     */
    static final long MIN_PULL_GAP_MS = 100;
    /** Pulls before consumers are woken even if events keep coming (the rest: next flush). */
    static final int MAX_PULL_ROUNDS = 8;
    static final int DRAIN_MAX = 10_000;
    private static final byte[] HB_CHANNEL = "hb\0".getBytes(StandardCharsets.UTF_8);
    private static final byte[] ALL_ROUTES = "route/".getBytes(StandardCharsets.UTF_8);
    private static final byte[] ALL_BROKERS = "broker/".getBytes(StandardCharsets.UTF_8);

    private enum Said { NOTHING, FOLLOWING, IDLE }

    private final String name;
    private final AgentConfig config;
    private final Supplier<ZContext> zmq;
    private final Runnable wake;
    private Target target;

    private long nextAttemptMs;
    private long backoffMs;
    private long provenAtMs = -1; // when the current stream's first hb came
    private Said said = Said.NOTHING;

    private ZMQ.Socket sub;
    private ZMQ.Socket hbSub;
    private ZContext socketContext; // the context of the current sockets
    private FrameBudget subBudget;
    private FrameBudget hbBudget;
    private boolean hbOnSub;
    private String endpoint;
    private String namesrv;
    private Recipe recipe;
    private boolean wholesale;
    private Map<String, Set<String>> held = Collections.emptyMap();
    private final Set<String> subscribedTopics = new HashSet<>();
    private final Set<String> subscribedBrokers = new HashSet<>();
    private final Set<String> dirty = new HashSet<>();
    private String dirtyWhy = "";
    private long dirtyReadAtMs; // wall clock, for the debug line only
    private final Map<String, Long> pulledAtMs = new HashMap<>(); // start of each held topic's last pull

    // counters, for the command-line check and for tests reading them by reflection
    long events;
    long refreshes;
    long badEvents;

    /** `wake` interrupts the owner's wait (any thread may run it); see {@link FrameBudget}. */
    Follower(String name, Target target, AgentConfig config, Supplier<ZContext> zmq, Runnable wake, long nowMs) {
        this.name = name;
        this.target = target;
        this.config = config;
        this.zmq = zmq;
        this.wake = wake;
        this.nextAttemptMs = nowMs;
        this.backoffMs = config.minBackoffMs;
    }

    String name() {
        return name;
    }

    void retarget(Target target) {
        this.target = target;
    }

    ZMQ.Socket socket() {
        return sub;
    }

    boolean following() {
        return sub != null;
    }

    /** When this follower next needs the loop: an attempt to resolve, a silence check or a pull due. */
    long nextDeadlineMs() {
        if (sub == null) {
            return nextAttemptMs;
        }
        long deadline = recipe.silentAt();
        for (String t : dirty) {
            deadline = Math.min(deadline, pullDueMs(t));
        }
        return deadline;
    }

    private long pullDueMs(String topic) {
        Long at = pulledAtMs.get(topic);
        return at == null ? Long.MIN_VALUE : at + MIN_PULL_GAP_MS;
    }

    /** Periodic work: resolve when idle and due; read the hb socket; give up a silent stream. */
    void tick(long nowMs) {
        if (sub == null) {
            if (nowMs >= nextAttemptMs) {
                resolve(nowMs);
            }
            return;
        }
        drainSocket(hbSub, nowMs, DRAIN_MAX, false);
        if (sub != null && !withinBudget(nowMs)) {
            return;
        }
        if (sub != null && recipe.silent(nowMs)) {
            stop(nowMs, recipe.sawHb()
                ? "no heartbeat from " + endpoint + " for " + (3 * hbMs) + " ms"
                : "no events from " + endpoint + " within " + (3 * hbMs) + " ms", true);
        }
    }

    private long hbMs = 1000;

    private void resolve(long nowMs) {
        String why = "the clients list no NameServer";
        if (config.events != null) {
            follow(config.events, config.heartbeatMs, "the events agent argument", nowMs);
            return;
        }
        for (String addr : target.namesrvAddrs()) {
            try {
                NamesrvProbe.Answer answer = NamesrvProbe.ask(addr, config.probeTimeoutMs);
                if (answer.endpoint != null) {
                    follow(answer.endpoint, answer.heartbeatIntervalMs, addr, nowMs);
                    return;
                }
                why = addr + ": " + answer.why;
            } catch (IOException | RuntimeException e) {
                why = addr + ": " + e.getMessage();
            }
        }
        idle(nowMs, why);
    }

    private static ZMQ.Socket subSocket(ZContext context, int hwm, long maxFrameBytes, FrameBudget budget) {
        ZMQ.Socket s = context.createSocket(SocketType.SUB);
        s.setLinger(0);
        s.setRcvHWM(hwm);
        s.setMaxMsgSize(maxFrameBytes);
        s.setMsgAllocator(budget);
        s.setReconnectIVL(200);
        s.setReconnectIVLMax(2000);
        return s;
    }

    /**
     * False (and the stream dropped, retried after a backoff) when a socket was given more
     * bytes than its account allows without the agent reading them: closing the sockets
     * frees what JeroMQ holds for them.
     */
    private boolean withinBudget(long nowMs) {
        FrameBudget over = subBudget.exceeded() ? subBudget : hbBudget.exceeded() ? hbBudget : null;
        if (over == null) {
            return true;
        }
        stop(nowMs, endpoint + " sent more than " + over.limit() / 1024 + " KiB that the agent had not read"
            + " on its " + (over == subBudget ? "events" : "hb") + " socket", false);
        return false;
    }

    private void follow(String endpoint, long hbMs, String namesrv, long nowMs) {
        this.subBudget = new FrameBudget(MAX_UNREAD_EVENT_BYTES, wake);
        this.hbBudget = new FrameBudget(MAX_UNREAD_HB_BYTES, wake);
        this.socketContext = zmq.get();
        ZMQ.Socket s = subSocket(socketContext, RCV_HWM, MAX_EVENT_BYTES, subBudget);
        ZMQ.Socket h = subSocket(socketContext, HB_RCV_HWM, MAX_HB_BYTES, hbBudget);
        h.subscribe(HB_CHANNEL);
        this.sub = s;
        this.hbSub = h;
        this.hbOnSub = false;
        this.endpoint = endpoint;
        this.namesrv = namesrv;
        this.hbMs = hbMs;
        this.recipe = new Recipe(hbMs, nowMs);
        this.wholesale = false;
        subscribedTopics.clear();
        subscribedBrokers.clear();
        held = Collections.emptyMap(); // every held topic is new to this socket
        syncSubscriptions();
        try {
            h.connect(endpoint);
            s.connect(endpoint);
        } catch (RuntimeException e) {
            stop(nowMs, "cannot connect to " + endpoint + ": " + e.getMessage(), false);
        }
    }

    private void idle(long nowMs, String why) {
        if (said != Said.IDLE) {
            Log.info("not following " + name + ": " + why + "; the application polls its NameServer as before"
                + " (asking again with backoff up to " + config.maxBackoffMs / 1000 + " s)");
            said = Said.IDLE;
        }
        long jitter = ThreadLocalRandom.current().nextLong(backoffMs / 5 + 1);
        nextAttemptMs = nowMs + backoffMs - backoffMs / 10 + jitter;
        backoffMs = Math.min(config.maxBackoffMs, backoffMs * 2);
    }

    /**
     * Leaves the stream; `retrySoon` asks again at once (the next attempt then backs off)
     * when the stream was followed for at least the longest backoff, and the backoff then
     * starts again from its minimum. A stream that broke sooner is asked again after the
     * growing backoff: an endpoint that sends a valid hb and then breaks the stream (or
     * names a heartbeat interval of 10 ms and beats every second) is asked again at
     * doubling intervals, and logged as often, not many times a second.
     */
    private void stop(long nowMs, String why, boolean retrySoon) {
        boolean held = provenAtMs >= 0 && nowMs - provenAtMs >= config.maxBackoffMs;
        if (held) {
            backoffMs = config.minBackoffMs;
        }
        provenAtMs = -1;
        closeSocket();
        if (retrySoon && held && said == Said.FOLLOWING) {
            Log.info("stopped following zns events at " + endpoint + " (" + describeSource() + "): " + why
                + "; the application polls its NameServer as before until zns answers again");
            said = Said.IDLE;
            nextAttemptMs = nowMs;
        } else {
            idle(nowMs, why);
        }
    }

    private String describeSource() {
        return config.events != null ? "given by the events agent argument" : "NameServer " + namesrv;
    }

    void close() {
        closeSocket();
    }

    private void closeSocket() {
        for (ZMQ.Socket s : new ZMQ.Socket[] {sub, hbSub}) {
            if (s != null) {
                try {
                    // linger 0: queued events are dropped at once; and the context forgets the
                    // socket (a socket closed by itself stays in its context's list, and with it
                    // whatever its queue held)
                    socketContext.destroySocket(s);
                } catch (RuntimeException e) {
                    // the context may already be closing; the socket goes with it
                }
            }
        }
        socketContext = null;
        sub = null;
        hbSub = null;
        subBudget = null;
        hbBudget = null;
        recipe = null;
        dirty.clear();
    }

    /**
     * Brings the subscriptions in line with the topics the clients hold now; false when
     * those topics and their brokers are what they were at the last call.
     */
    boolean syncSubscriptions() {
        Map<String, Set<String>> now = target.topics();
        boolean changed = !now.equals(held);
        held = now;
        pulledAtMs.keySet().retainAll(now.keySet());
        if (sub == null || !changed) {
            return changed;
        }
        if (wholesale || now.size() > MAX_TOPIC_SUBSCRIPTIONS) {
            if (!wholesale) {
                for (String t : subscribedTopics) {
                    sub.unsubscribe(routeChannel(t));
                }
                for (String b : subscribedBrokers) {
                    sub.unsubscribe(brokerChannel(b));
                }
                subscribedBrokers.clear();
                sub.subscribe(ALL_ROUTES);
                sub.subscribe(ALL_BROKERS);
                wholesale = true;
            }
            List<String> added = new ArrayList<>();
            for (String t : now.keySet()) {
                if (!subscribedTopics.contains(t)) {
                    added.add(t);
                }
            }
            subscribedTopics.retainAll(now.keySet());
            subscribedTopics.addAll(added);
            recipe.subscribed(added);
            awaitProof();
            return changed;
        }
        List<String> added = new ArrayList<>();
        List<String> removed = new ArrayList<>();
        for (String t : now.keySet()) {
            if (subscribedTopics.add(t)) {
                sub.subscribe(routeChannel(t));
                added.add(t);
            }
        }
        for (String t : subscribedTopics) {
            if (!now.containsKey(t)) {
                removed.add(t);
            }
        }
        for (String t : removed) {
            subscribedTopics.remove(t);
            sub.unsubscribe(routeChannel(t));
        }
        Set<String> brokers = new HashSet<>();
        for (Set<String> bs : now.values()) {
            brokers.addAll(bs);
        }
        for (String b : brokers) {
            if (subscribedBrokers.add(b)) {
                sub.subscribe(brokerChannel(b));
            }
        }
        for (String b : new ArrayList<>(subscribedBrokers)) {
            if (!brokers.contains(b)) {
                subscribedBrokers.remove(b);
                sub.unsubscribe(brokerChannel(b));
            }
        }
        recipe.subscribed(added);
        recipe.unsubscribed(removed);
        awaitProof();
        return changed;
    }

    /** New subscriptions are proven by an hb on their own socket: receive hb there until then. */
    private void awaitProof() {
        if (recipe.unprovenPending() && !hbOnSub) {
            sub.subscribe(HB_CHANNEL);
            hbOnSub = true;
        }
    }

    /**
     * Reads every event waiting (at most `max` on the events socket); returns how many the
     * events socket had. The hb socket is read first: an hb of an old epoch still queued
     * there must not come after the new epoch's events.
     */
    int drain(long nowMs, int max) {
        drainSocket(hbSub, nowMs, max, false);
        int n = drainSocket(sub, nowMs, max, true);
        if (sub != null) {
            withinBudget(nowMs);
        }
        return n;
    }

    private int drainSocket(ZMQ.Socket socket, long nowMs, int max, boolean eventsSocket) {
        int n = 0;
        while (socket != null && socket == (eventsSocket ? sub : hbSub) && n < max) {
            byte[] channel = socket.recv(ZMQ.DONTWAIT);
            if (channel == null) {
                break;
            }
            byte[] body = null;
            while (socket.hasReceiveMore()) { // an event is [channel, body]; anything more is skipped
                byte[] part = socket.recv(ZMQ.DONTWAIT);
                if (body == null) {
                    body = part;
                }
            }
            n++;
            (eventsSocket ? subBudget : hbBudget).read();
            if (body == null) {
                badEvents++;
                continue;
            }
            Event e;
            try {
                e = Event.decode(body);
            } catch (IOException ex) {
                badEvents++;
                continue;
            }
            events++;
            boolean wasProven = recipe.sawHb();
            String oldEpoch = recipe.epoch();
            Set<String> topics = recipe.onEvent(e, held, nowMs, eventsSocket);
            if (eventsSocket && hbOnSub && e.op.equals("hb") && !recipe.unprovenPending()) {
                sub.unsubscribe(HB_CHANNEL); // proven: hb only on its own socket again
                hbOnSub = false;
            }
            if (!wasProven && recipe.sawHb()) {
                provenAtMs = nowMs;
                if (said != Said.FOLLOWING) {
                    Log.info("following zns events at " + endpoint + " (" + describeSource() + ") for "
                        + held.size() + " topic(s): route changes reach this application"
                        + " as they happen");
                    said = Said.FOLLOWING;
                }
            }
            if (!topics.isEmpty()) {
                String why = oldEpoch != null && !oldEpoch.equals(e.epoch) ? "epoch " + e.epoch
                    : e.op.equals("hb") ? "subscribed" : e.toString();
                markDirty(topics, why);
            }
        }
        return n;
    }

    private void markDirty(Set<String> topics, String why) {
        if (dirty.isEmpty()) {
            dirtyWhy = why;
            dirtyReadAtMs = System.currentTimeMillis();
        } else if (!dirtyWhy.endsWith("...")) {
            dirtyWhy = dirtyWhy + ", ...";
        }
        dirty.addAll(topics);
    }

    /**
     * Has the clients refresh every topic the events named since the last flush, then wakes
     * their consumers. One change of zns is several events (a route event per topic, a
     * broker event) sent microseconds apart: the events that arrived during a pull are read
     * and pulled too before any consumer work, so that no producer's topic waits behind a
     * consumer's heartbeat to a new broker (seen: 480 ms). A topic pulled less than
     * {@link #MIN_PULL_GAP_MS} ago stays marked until its gap ends ({@link #nextDeadlineMs});
     * the pulls are the agent thread's own calls, one at a time, so one topic never has two
     * pulls in flight.
     */
    boolean flush() {
        boolean pulled = false;
        for (int round = 0; !dirty.isEmpty() && round < MAX_PULL_ROUNDS; round++) {
            long now = AgentLoop.nowMs();
            Set<String> due = new HashSet<>();
            for (String t : dirty) {
                if (now >= pullDueMs(t)) {
                    due.add(t);
                }
            }
            if (due.isEmpty()) {
                break;
            }
            Set<String> topics = inRefreshOrder(due);
            String why = dirtyWhy;
            long readAt = dirtyReadAtMs;
            dirty.removeAll(due);
            for (String t : topics) {
                pulledAtMs.put(t, now);
            }
            refreshes += topics.size();
            long started = System.nanoTime();
            String detail = target.refresh(topics, why);
            pulled = true;
            // bench/agent.py splits a change's latency with this line: when the event was read
            // (wall ms) and when each pull ended (ms after the refresh began)
            Log.debug("refreshed " + topics + " (" + why + "): event read at " + readAt + ", refreshed in "
                + (System.nanoTime() - started) / 1000 / 1000.0 + " ms" + (detail.isEmpty() ? "" : " (" + detail + ")"));
            if (sub != null) {
                drain(AgentLoop.nowMs(), DRAIN_MAX);
            }
        }
        if (!pulled) {
            return false;
        }
        String woken = target.wakeConsumers();
        if (!woken.isEmpty()) {
            Log.debug("consumers woken (" + woken + ")");
        }
        return true;
    }

    /**
     * The application's topics first, then the clients' own (a consumer group's
     * {@code %RETRY%} and {@code %DLQ%} topics, RocketMQ's system topics): each pull is a
     * round trip to the NameServer, and a producer waits on its own topic, not on those.
     */
    static Set<String> inRefreshOrder(Set<String> topics) {
        java.util.TreeSet<String> application = new java.util.TreeSet<>();
        java.util.TreeSet<String> internal = new java.util.TreeSet<>();
        for (String t : topics) {
            (t.startsWith("%") || t.startsWith("rmq_sys_") || t.startsWith("RMQ_SYS_") ? internal : application).add(t);
        }
        Set<String> ordered = new java.util.LinkedHashSet<>(application);
        ordered.addAll(internal);
        return ordered;
    }

    Map<String, Object> describe() {
        Map<String, Object> m = new HashMap<>();
        m.put("name", name);
        m.put("following", sub != null && recipe != null && recipe.sawHb());
        m.put("endpoint", endpoint);
        m.put("topics", held.size());
        m.put("events", events);
        m.put("refreshes", refreshes);
        return m;
    }

    private static byte[] routeChannel(String topic) {
        return ("route/" + topic + "\0").getBytes(StandardCharsets.UTF_8);
    }

    private static byte[] brokerChannel(String clusterAndName) {
        return ("broker/" + clusterAndName + "\0").getBytes(StandardCharsets.UTF_8);
    }
}
