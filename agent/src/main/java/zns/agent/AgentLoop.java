package zns.agent;

import java.io.IOException;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;

import org.zeromq.ZContext;
import org.zeromq.ZMQ;

/**
 * The agent's one thread: finds the application's client instances, keeps one
 * {@link Follower} per NameServer list they use, waits for events and has the clients
 * refresh what the events name.
 *
 * <p>It sleeps until something is due: an event on a followed stream, the next heartbeat
 * deadline, a follower's next attempt, or the next look at the clients' tables. Those
 * tables change in two ways: the agent's own refreshes (the follower looks again right
 * after each, so a broker new to a route is subscribed at once) and the application
 * starting to use a topic, a client or a NameServer list, which nothing announces. So the
 * tables are read a second after a change was seen, then at doubling intervals up to
 * {@link #SYNC_MAX_MS} while nothing changes: an idle agent reads them a few times a
 * minute, not every second. With no RocketMQ client loaded it sleeps until the class is
 * loaded. The JeroMQ context (which adds two daemon I/O threads) exists only while some
 * follower has a socket.
 */
final class AgentLoop implements Runnable {
    static final long SYNC_MIN_MS = 1000;
    /**
     * The longest wait between two reads of the tables: how late a topic the application
     * has just started to use can be followed. Its client pulled that topic's route itself
     * at first use, and the follower pulls it once more when it subscribes (protocol step
     * 2), so the only cost is that a change within those seconds arrives at that pull
     * instead of at once: still well ahead of the client's own 30 s poll.
     */
    static final long SYNC_MAX_MS = 10_000;
    private static final long NO_CLIENT_SLEEP_MS = 60_000;

    private final AgentConfig config;
    private final RocketMqClients clients;
    private final Map<String, Follower> followers = new LinkedHashMap<>();
    private final Map<String, RocketMqClients.Group> groups = new LinkedHashMap<>();
    private ZContext context;
    private Selector selector;
    private final Map<Follower, SelectionKey> registered = new LinkedHashMap<>();
    private boolean moreQueued;
    private long nextSyncMs;
    private long syncIntervalMs = SYNC_MIN_MS;
    private volatile boolean stopped;

    AgentLoop(AgentConfig config, RocketMqClients clients) {
        this.config = config;
        this.clients = clients;
    }

    static long nowMs() {
        return TimeUnit.NANOSECONDS.toMillis(System.nanoTime());
    }

    void stop() {
        stopped = true;
    }

    @Override
    public void run() {
        int failuresInARow = 0;
        while (!stopped) {
            try {
                step();
                failuresInARow = 0;
            } catch (Throwable t) {
                // A bug of the agent must not become the application's problem: drop the
                // streams (the application polls as before) and try again, slower each time.
                failuresInARow++;
                if (failuresInARow == 1) {
                    Log.info("internal error, streams reset: " + t);
                }
                closeAll();
                LockSupport.parkNanos(TimeUnit.MILLISECONDS.toNanos(Math.min(60_000, 1000L << Math.min(6, failuresInARow))));
            }
        }
        closeAll();
    }

    private void step() throws IOException {
        long now = nowMs();
        if (now >= nextSyncMs || (clients.scanPending() && !clients.anyManager())) {
            syncIntervalMs = sync(now) ? SYNC_MIN_MS : Math.min(SYNC_MAX_MS, syncIntervalMs * 2);
            // a class load was noted but the class is not defined yet: look again shortly
            nextSyncMs = now + (clients.anyManager() ? syncIntervalMs : clients.scanPending() ? 100 : NO_CLIENT_SLEEP_MS);
        }
        long deadline = nextSyncMs;
        for (Follower f : followers.values()) {
            f.tick(now);
            deadline = Math.min(deadline, f.nextDeadlineMs());
        }
        releaseContextIfUnused();
        long wait = Math.max(1, deadline - nowMs());
        if (register()) {
            if (moreQueued) {
                selector.selectNow();
            } else {
                selector.select(wait);
            }
            selector.selectedKeys().clear();
            // every socket is read whichever woke the loop: one follower is the usual case,
            // and a read to EAGAIN is what re-arms a socket's descriptor
            long t = nowMs();
            moreQueued = false;
            for (Follower f : registered.keySet()) {
                moreQueued |= f.drain(t, Follower.DRAIN_MAX) >= Follower.DRAIN_MAX;
            }
        } else {
            LockSupport.parkNanos(TimeUnit.MILLISECONDS.toNanos(wait)); // unparked when RocketMQ loads
        }
        for (Follower f : followers.values()) {
            if (f.flush()) {
                f.syncSubscriptions(); // the pulls may have put new brokers in the routes
            }
        }
    }

    /** Reads the clients' tables; false when nothing changed since the last read. */
    private boolean sync(long now) {
        boolean changed = false;
        Map<String, List<Object>> found = clients.instancesByNamesrv();
        for (Map.Entry<String, List<Object>> e : found.entrySet()) {
            RocketMqClients.Group g = groups.get(e.getKey());
            if (g == null) {
                g = new RocketMqClients.Group(e.getKey(), e.getValue());
                groups.put(e.getKey(), g);
                followers.put(e.getKey(), new Follower(e.getKey(), g, config, this::context, now));
                changed = true;
            } else {
                changed |= g.update(e.getValue());
            }
        }
        for (Iterator<Map.Entry<String, Follower>> it = followers.entrySet().iterator(); it.hasNext(); ) {
            Map.Entry<String, Follower> e = it.next();
            if (!found.containsKey(e.getKey())) { // its clients were shut down
                e.getValue().close();
                groups.remove(e.getKey());
                it.remove();
                changed = true;
            } else {
                changed |= e.getValue().syncSubscriptions();
            }
        }
        return changed;
    }

    private ZContext context() {
        if (context == null) {
            ZContext c = new ZContext(1);
            c.setThreadFactor((runnable, name) -> {
                Thread t = new Thread(runnable, "zns-agent-" + name);
                t.setDaemon(true);
                t.setContextClassLoader(AgentLoop.class.getClassLoader());
                t.setUncaughtExceptionHandler((thread, e) -> { });
                return t;
            });
            c.setUncaughtExceptionHandler((thread, e) -> { });
            c.setNotificationExceptionHandler((thread, e) -> { });
            context = c;
        }
        return context;
    }

    /**
     * Registers the followers' sockets with the selector (each once, for as long as it
     * lives); false when no follower has one. The agent waits on the sockets' descriptors
     * itself rather than with JeroMQ's poller, which rebuilds its registrations and asks
     * every socket for its events at each call: that was most of an idle agent's CPU, one
     * wake per hb.
     */
    private boolean register() throws IOException {
        for (Iterator<Map.Entry<Follower, SelectionKey>> it = registered.entrySet().iterator(); it.hasNext(); ) {
            Map.Entry<Follower, SelectionKey> e = it.next();
            Follower f = e.getKey();
            if (followers.get(f.name()) != f || f.socket() == null || e.getValue().attachment() != f.socket()) {
                e.getValue().cancel();
                it.remove();
            }
        }
        for (Follower f : followers.values()) {
            ZMQ.Socket s = f.socket();
            if (s != null && !registered.containsKey(f)) {
                if (selector == null) {
                    selector = Selector.open();
                }
                registered.put(f, s.getFD().register(selector, SelectionKey.OP_READ, s));
            }
        }
        return !registered.isEmpty();
    }

    private void closeSelector() {
        registered.clear();
        moreQueued = false;
        if (selector != null) {
            try {
                selector.close();
            } catch (IOException | RuntimeException e) {
                // nothing left to free
            }
        }
        selector = null;
    }

    private void releaseContextIfUnused() {
        if (context == null) {
            return;
        }
        for (Follower f : followers.values()) {
            if (f.following()) {
                return;
            }
        }
        closeSelector();
        ZContext c = context;
        context = null;
        try {
            c.close(); // its I/O threads end: an idle agent is one thread
        } catch (RuntimeException e) {
            // nothing left to free
        }
    }

    private void closeAll() {
        for (Follower f : followers.values()) {
            try {
                f.close();
            } catch (RuntimeException e) {
                // going away anyway
            }
        }
        followers.clear();
        groups.clear();
        closeSelector();
        if (context != null) {
            try {
                context.close();
            } catch (RuntimeException e) {
                // going away anyway
            }
            context = null;
        }
    }

    /** For the command line: one line per follower. */
    List<Map<String, Object>> describe() {
        List<Map<String, Object>> out = new ArrayList<>();
        for (Follower f : followers.values()) {
            out.add(f.describe());
        }
        return out;
    }
}
