package zns.agent;

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
 * deadline, a follower's next attempt, or the next look at the clients (every second while
 * any client exists, to see new topics and instances). With no RocketMQ client loaded it
 * sleeps until the class is loaded. The JeroMQ context (which adds two daemon I/O threads)
 * exists only while some follower has a socket.
 */
final class AgentLoop implements Runnable {
    static final long SYNC_MS = 1000;
    private static final long NO_CLIENT_SLEEP_MS = 60_000;

    private final AgentConfig config;
    private final RocketMqClients clients;
    private final Map<String, Follower> followers = new LinkedHashMap<>();
    private final Map<String, RocketMqClients.Group> groups = new LinkedHashMap<>();
    private ZContext context;
    private ZMQ.Poller poller;
    private final List<Follower> polled = new ArrayList<>();
    private final List<ZMQ.Socket> polledSockets = new ArrayList<>();
    private long nextSyncMs;
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

    private void step() {
        long now = nowMs();
        if (now >= nextSyncMs || (clients.scanPending() && !clients.anyManager())) {
            sync(now);
            // a class load was noted but the class is not defined yet: look again shortly
            nextSyncMs = now + (clients.anyManager() ? SYNC_MS : clients.scanPending() ? 100 : NO_CLIENT_SLEEP_MS);
        }
        long deadline = nextSyncMs;
        for (Follower f : followers.values()) {
            f.tick(now);
            deadline = Math.min(deadline, f.nextDeadlineMs());
        }
        releaseContextIfUnused();
        long wait = Math.max(1, deadline - nowMs());
        if (rebuildPoller()) {
            poller.poll(wait);
            long t = nowMs();
            for (int i = 0; i < polled.size(); i++) {
                if (poller.pollin(i)) {
                    polled.get(i).drain(t, Follower.DRAIN_MAX);
                }
            }
        } else {
            LockSupport.parkNanos(TimeUnit.MILLISECONDS.toNanos(wait)); // unparked when RocketMQ loads
        }
        for (Follower f : followers.values()) {
            f.flush();
        }
    }

    private void sync(long now) {
        Map<String, List<Object>> found = clients.instancesByNamesrv();
        for (Map.Entry<String, List<Object>> e : found.entrySet()) {
            RocketMqClients.Group g = groups.get(e.getKey());
            if (g == null) {
                g = new RocketMqClients.Group(e.getKey(), e.getValue());
                groups.put(e.getKey(), g);
                followers.put(e.getKey(), new Follower(e.getKey(), g, config, this::context, now));
            } else {
                g.update(e.getValue());
            }
        }
        for (Iterator<Map.Entry<String, Follower>> it = followers.entrySet().iterator(); it.hasNext(); ) {
            Map.Entry<String, Follower> e = it.next();
            if (!found.containsKey(e.getKey())) { // its clients were shut down
                e.getValue().close();
                groups.remove(e.getKey());
                it.remove();
            } else {
                e.getValue().syncSubscriptions();
            }
        }
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

    /** The poller over the current sockets; false when no follower has one. */
    private boolean rebuildPoller() {
        List<ZMQ.Socket> now = new ArrayList<>();
        List<Follower> owners = new ArrayList<>();
        for (Follower f : followers.values()) {
            if (f.socket() != null) {
                now.add(f.socket());
                owners.add(f);
            }
        }
        if (now.isEmpty()) {
            closePoller();
            return false;
        }
        if (poller != null && now.equals(polledSockets)) {
            return true;
        }
        closePoller();
        poller = context().createPoller(now.size());
        for (ZMQ.Socket s : now) {
            poller.register(s, ZMQ.Poller.POLLIN);
        }
        polledSockets.addAll(now);
        polled.addAll(owners);
        return true;
    }

    private void closePoller() {
        if (poller != null) {
            try {
                poller.close();
            } catch (RuntimeException e) {
                // closing with the context
            }
        }
        poller = null;
        polled.clear();
        polledSockets.clear();
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
        closePoller();
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
        closePoller();
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
