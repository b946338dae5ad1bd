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
    /** How long the agent's thread waits for a JeroMQ context to terminate (see {@link #terminate}). */
    static final long TERMINATE_WAIT_MS = 1000;
    /** Internal errors further apart than this start the backoff again from its minimum. */
    private static final long FAILURES_FORGOTTEN_MS = 600_000;

    private final AgentConfig config;
    private final RocketMqClients clients;
    private final Map<String, Follower> followers = new LinkedHashMap<>();
    private final Map<String, RocketMqClients.Group> groups = new LinkedHashMap<>();
    private volatile ZContext context; // read by JeroMQ's threads (see failed)
    private volatile Selector selector; // woken by other threads (see wake)
    private final Map<Follower, SelectionKey> registered = new LinkedHashMap<>();
    private boolean moreQueued;
    private long nextSyncMs;
    private long syncIntervalMs = SYNC_MIN_MS;
    private volatile boolean stopped;
    private volatile Throwable contextFailure; // a JeroMQ thread of the current context died of it

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
        int failures = 0;
        long lastFailureMs = 0;
        while (!stopped) {
            try {
                step();
            } catch (Throwable t) {
                // A bug of the agent, or a JeroMQ thread that died (of an OutOfMemoryError the
                // application caused, say), must not become the application's problem nor stop
                // the agent for good: drop the streams and the context (the application polls as
                // before) and start again after 2 s, 4 s, ... up to 64 s while errors keep coming.
                long now = nowMs();
                failures = now - lastFailureMs > FAILURES_FORGOTTEN_MS ? 1 : failures + 1;
                lastFailureMs = now;
                if (failures == 1) {
                    Log.info("internal error, streams reset: " + t + "; starting again with backoff");
                }
                closeAll();
                LockSupport.parkNanos(TimeUnit.MILLISECONDS.toNanos(1000L << Math.min(6, failures)));
            }
        }
        closeAll();
    }

    private void step() throws IOException {
        Throwable failed = contextFailure;
        if (failed != null) {
            contextFailure = null;
            throw new IllegalStateException("a JeroMQ thread failed: " + failed, failed);
        }
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
                followers.put(e.getKey(), new Follower(e.getKey(), g, config, this::context, this::wake, now));
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
            // A JeroMQ thread that throws an Error is dead, and its context with it; one that
            // throws a RuntimeException goes on, with a connection in an unknown state. Either
            // way the loop starts over with a fresh context (no zns stream makes it throw).
            // The threads are made here, so the handler is set here (the context's own setting
            // applies only to the threads it makes itself).
            Thread.UncaughtExceptionHandler failure = (thread, e) -> failed(c, e);
            c.setThreadFactor((runnable, name) -> {
                Thread t = new Thread(runnable, "zns-agent-" + name);
                t.setDaemon(true);
                t.setContextClassLoader(AgentLoop.class.getClassLoader());
                t.setUncaughtExceptionHandler(failure);
                return t;
            });
            c.setUncaughtExceptionHandler(failure);
            c.setNotificationExceptionHandler(failure);
            context = c;
        }
        return context;
    }

    /** A thread of `c` threw `e`: the loop starts over, unless `c` was already left behind. */
    private void failed(ZContext c, Throwable e) {
        if (context == c) {
            contextFailure = e;
            wake();
        }
    }

    /** Ends the loop's wait now; any thread may call it. */
    private void wake() {
        Selector s = selector;
        if (s != null) {
            s.wakeup();
        }
    }

    /**
     * Closes a context on a thread of its own and waits at most {@link #TERMINATE_WAIT_MS}:
     * a context whose I/O thread died never finishes terminating (its sockets' pipes wait
     * for that thread), and the agent must not wait with it. Such a context is left behind,
     * with the daemon thread blocked in it; the agent goes on with a fresh one.
     */
    private static void terminate(ZContext c) {
        Thread closer = new Thread(() -> {
            try {
                c.close();
            } catch (Throwable ignored) {
                // nothing left to free
            }
        }, "zns-agent-close");
        closer.setDaemon(true);
        closer.setUncaughtExceptionHandler((t, e) -> { });
        closer.start();
        try {
            closer.join(TERMINATE_WAIT_MS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
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
        terminate(c); // its I/O threads end: an idle agent is one thread
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
        ZContext c = context;
        context = null; // first: a failure of its threads while it terminates is no news
        if (c != null) {
            terminate(c);
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
