package zns.agent;

import java.lang.instrument.ClassFileTransformer;
import java.lang.instrument.Instrumentation;
import java.lang.ref.WeakReference;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.security.ProtectionDomain;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;

/**
 * The application's RocketMQ client instances, seen by reflection, without a compile-time
 * dependency on RocketMQ (the same code serves 4.9.x, whose route classes live in another
 * package, and 5.x).
 *
 * <p>Every producer, push or lite-pull consumer and admin tool of a process registers an
 * {@code MQClientInstance} in the {@code factoryTable} of the singleton
 * {@code org.apache.rocketmq.client.impl.MQClientManager}. An instance holds the routes it
 * uses ({@code getTopicRouteTable()}), its NameServer list
 * ({@code getMQClientAPIImpl().getNameServerAddressList()}), and refreshes a topic with
 * {@code updateTopicRouteInfoFromNameServer(topic)}, which updates its producers'
 * publish info and its consumers' subscribe info; {@code rebalanceImmediately()} then
 * wakes its consumers' rebalancing. All of these exist with the same names in 4.9.x and
 * 5.x.
 *
 * <p>The manager class is found among the loaded classes (each class loader that loaded
 * RocketMQ has its own); a class file transformer that never changes a class only notes
 * when one is loaded later, so that nothing is scanned periodically.
 */
final class RocketMqClients implements ClassFileTransformer {
    static final String MANAGER_CLASS = "org.apache.rocketmq.client.impl.MQClientManager";
    private static final String MANAGER_PATH = MANAGER_CLASS.replace('.', '/');

    private final Instrumentation instrumentation;
    private final List<WeakReference<Class<?>>> managers = new ArrayList<>();
    /** Scans of the loaded classes still to make: one at start, a few after a load is noted. */
    private volatile int scansLeft = 1;
    private volatile Thread waiter;

    RocketMqClients(Instrumentation instrumentation) {
        this.instrumentation = instrumentation;
    }

    /** Wakes `thread` when a RocketMQ client class is loaded. */
    void wakeOnLoad(Thread thread) {
        this.waiter = thread;
    }

    @Override
    public byte[] transform(ClassLoader loader, String className, Class<?> redefined, ProtectionDomain domain,
                            byte[] classfile) {
        if (MANAGER_PATH.equals(className)) {
            scansLeft = 5;
            Thread t = waiter;
            if (t != null) {
                java.util.concurrent.locks.LockSupport.unpark(t);
            }
        }
        return null; // no class is ever changed
    }

    /** A RocketMQ client class was loaded and not found among the loaded classes yet. */
    boolean scanPending() {
        return scansLeft > 0;
    }

    boolean anyManager() {
        return !managers.isEmpty();
    }

    /** The instances of every manager, grouped by their NameServer list (";"-joined). */
    Map<String, List<Object>> instancesByNamesrv() {
        if (scansLeft > 0 && instrumentation != null) {
            // the transformer runs before the class is defined: when not found yet, look again
            scansLeft = scan() ? 0 : scansLeft - 1;
        }
        Map<String, List<Object>> groups = new TreeMap<>();
        for (WeakReference<Class<?>> ref : new ArrayList<>(managers)) {
            Class<?> manager = ref.get();
            if (manager == null) {
                managers.remove(ref);
                continue;
            }
            for (Object instance : instancesOf(manager)) {
                List<String> addrs = namesrvAddrs(instance);
                if (!addrs.isEmpty()) {
                    groups.computeIfAbsent(String.join(";", addrs), k -> new ArrayList<>()).add(instance);
                }
            }
        }
        return groups;
    }

    private boolean scan() {
        boolean found = false;
        for (Class<?> c : instrumentation.getAllLoadedClasses()) {
            if (MANAGER_CLASS.equals(c.getName())) {
                boolean known = false;
                for (WeakReference<Class<?>> ref : managers) {
                    known |= ref.get() == c;
                }
                if (!known) {
                    managers.add(new WeakReference<Class<?>>(c));
                }
                found = true;
            }
        }
        return found;
    }

    /** For the command line and tests: a manager class reached without instrumentation. */
    void addManager(Class<?> manager) {
        managers.add(new WeakReference<Class<?>>(manager));
    }

    private static Collection<?> instancesOf(Class<?> manager) {
        try {
            Object singleton = staticCall(manager, "getInstance");
            Object table = findField(manager, "factoryTable").get(singleton);
            if (table instanceof Map) {
                return new ArrayList<>(((Map<?, ?>) table).values());
            }
        } catch (Throwable t) {
            // not the class this agent knows (a future version?): nothing to follow
        }
        return Collections.emptyList();
    }

    static List<String> namesrvAddrs(Object instance) {
        try {
            Object api = call(instance, "getMQClientAPIImpl");
            Object list = call(api, "getNameServerAddressList");
            if (list instanceof List) {
                List<String> out = new ArrayList<>();
                for (Object a : (List<?>) list) {
                    if (a != null) {
                        out.add(a.toString());
                    }
                }
                return out;
            }
        } catch (Throwable t) {
            // an instance not started yet, or shutting down
        }
        return Collections.emptyList();
    }

    /** Topic -> the brokers of its route as cluster/brokerName, for one instance. */
    static Map<String, Set<String>> topicsOf(Object instance) {
        Map<String, Set<String>> out = new HashMap<>();
        try {
            Object table = call(instance, "getTopicRouteTable");
            if (!(table instanceof Map)) {
                return out;
            }
            for (Map.Entry<?, ?> e : ((Map<?, ?>) table).entrySet()) {
                Set<String> brokers = new HashSet<>();
                Object route = e.getValue();
                Object datas = route == null ? null : call(route, "getBrokerDatas");
                if (datas instanceof List) {
                    for (Object bd : (List<?>) datas) {
                        Object cluster = call(bd, "getCluster");
                        Object name = call(bd, "getBrokerName");
                        if (cluster != null && name != null) {
                            brokers.add(cluster + "/" + name);
                        }
                    }
                }
                out.put(String.valueOf(e.getKey()), brokers);
            }
        } catch (Throwable t) {
            // the table changed shape under us: seen again at the next sync
        }
        return out;
    }

    static boolean hasConsumers(Object instance) {
        try {
            Field f = findField(instance.getClass(), "consumerTable");
            Object table = f.get(instance);
            return table instanceof Map && !((Map<?, ?>) table).isEmpty();
        } catch (Throwable t) {
            return false;
        }
    }

    /**
     * The methods and fields this agent reads, looked up once per class (each lookup copies a
     * Method or Field: most of an idle look at the tables was that). A ClassValue keeps them
     * with the class itself, so an application's class loader that goes away is not held.
     * Each class's map holds at most the dozen names used here.
     */
    private static final ClassValue<Map<String, Object>> MEMBERS = new ClassValue<Map<String, Object>>() {
        @Override
        protected Map<String, Object> computeValue(Class<?> type) {
            return new java.util.concurrent.ConcurrentHashMap<>();
        }
    };

    private static Field findField(Class<?> c, String name) throws NoSuchFieldException {
        Map<String, Object> members = MEMBERS.get(c);
        Object known = members.get("field " + name);
        if (known instanceof Field) {
            return (Field) known;
        }
        for (Class<?> k = c; k != null; k = k.getSuperclass()) {
            try {
                Field f = k.getDeclaredField(name);
                f.setAccessible(true);
                members.put("field " + name, f);
                return f;
            } catch (NoSuchFieldException e) {
                // try the superclass
            }
        }
        throw new NoSuchFieldException(name);
    }

    private static Method method(Class<?> c, String name) throws NoSuchMethodException {
        Map<String, Object> members = MEMBERS.get(c);
        Object known = members.get(name);
        if (known instanceof Method) {
            return (Method) known;
        }
        Method m = name.equals("updateTopicRouteInfoFromNameServer") ? c.getMethod(name, String.class) : c.getMethod(name);
        members.put(name, m);
        return m;
    }

    static Object call(Object target, String method) throws ReflectiveOperationException {
        return method(target.getClass(), method).invoke(target);
    }

    private static Object staticCall(Class<?> c, String method) throws ReflectiveOperationException {
        return method(c, method).invoke(null);
    }

    private static boolean brokerAdded(Map<String, Set<String>> before, Map<String, Set<String>> after,
                                       Set<String> topics) {
        for (String topic : topics) {
            Set<String> was = before.get(topic);
            Set<String> now = after.get(topic);
            if (was != null && now != null && !was.containsAll(now)) {
                return true;
            }
        }
        return false;
    }

    /** The clients of one NameServer list, as a {@link Target}. */
    static final class Group implements Target {
        private final List<String> addrs;
        private List<Object> instances;
        long failedRefreshes;
        /** The longest wait for a heartbeat of the client's own (its request timeout is 3 s). */
        static final long HEARTBEAT_WAIT_MS = 3000;
        /** Instances with consumers whose topics were pulled, each with "a broker was added". */
        private final Map<Object, Boolean> consumersToWake = new java.util.IdentityHashMap<>();

        Group(String key, List<Object> instances) {
            List<String> a = new ArrayList<>();
            for (String s : key.split(";")) {
                if (!s.isEmpty()) {
                    a.add(s);
                }
            }
            this.addrs = a;
            this.instances = instances;
        }

        /** False when these are the instances it had (the same objects, in the same order). */
        boolean update(List<Object> instances) {
            boolean changed = !instances.equals(this.instances);
            this.instances = instances;
            return changed;
        }

        @Override
        public List<String> namesrvAddrs() {
            return addrs;
        }

        @Override
        public Map<String, Set<String>> topics() {
            Map<String, Set<String>> all = new LinkedHashMap<>();
            for (Object instance : instances) {
                for (Map.Entry<String, Set<String>> e : topicsOf(instance).entrySet()) {
                    all.computeIfAbsent(e.getKey(), k -> new HashSet<>()).addAll(e.getValue());
                }
            }
            return all;
        }

        @Override
        public String refresh(Set<String> topics, String why) {
            StringBuilder detail = new StringBuilder();
            long started = System.nanoTime();
            for (Object instance : instances) {
                ClassLoader loader = instance.getClass().getClassLoader();
                Thread self = Thread.currentThread();
                ClassLoader previous = self.getContextClassLoader();
                self.setContextClassLoader(loader); // the application's loader, for whatever RocketMQ looks up
                try {
                    Map<String, Set<String>> before = topicsOf(instance);
                    Set<String> heldHere = before.keySet();
                    boolean any = false;
                    Method update = method(instance.getClass(), "updateTopicRouteInfoFromNameServer");
                    for (String topic : topics) {
                        if (!heldHere.contains(topic)) {
                            continue;
                        }
                        any = true;
                        try {
                            update.invoke(instance, topic);
                        } catch (Throwable t) {
                            failedRefreshes++; // the client logs its own failures; its poll stays
                        }
                        if (Log.debug) {
                            detail.append(detail.length() == 0 ? "" : ", ").append(topic).append(" +")
                                .append(sinceMs(started));
                        }
                    }
                    if (any && hasConsumers(instance)) {
                        boolean added = brokerAdded(before, topicsOf(instance), topics);
                        consumersToWake.merge(instance, added, Boolean::logicalOr);
                    }
                } catch (Throwable t) {
                    failedRefreshes++;
                } finally {
                    self.setContextClassLoader(previous);
                }
            }
            return detail.toString();
        }

        @Override
        public String wakeConsumers() {
            StringBuilder detail = new StringBuilder();
            long started = System.nanoTime();
            for (Map.Entry<Object, Boolean> e : consumersToWake.entrySet()) {
                Object instance = e.getKey();
                Thread self = Thread.currentThread();
                ClassLoader previous = self.getContextClassLoader();
                self.setContextClassLoader(instance.getClass().getClassLoader());
                try {
                    // A broker new to these routes does not know this consumer yet: the
                    // consumer-id list it would return leaves this client out. Heartbeat
                    // first, as the client's own 30 s timer would, then rebalance.
                    if (e.getValue()) {
                        // The client heartbeats on its own too (5.x: a broker it has just
                        // connected to, as a producer's send does after our pull), and the
                        // method only tries its lock: it skips when that heartbeat holds it.
                        // Rebalancing before the new broker has the heartbeat gets no
                        // consumer-id list, and RocketMQ retries at most once a second
                        // (seen: 2 s). So wait for a heartbeat in flight, then ours.
                        awaitHeartbeatLock(instance, HEARTBEAT_WAIT_MS);
                        call(instance, "sendHeartbeatToAllBrokerWithLock");
                        awaitHeartbeatLock(instance, HEARTBEAT_WAIT_MS);
                        if (Log.debug) {
                            detail.append(detail.length() == 0 ? "" : ", ").append("heartbeat +").append(sinceMs(started));
                        }
                    }
                    call(instance, "rebalanceImmediately");
                } catch (Throwable t) {
                    failedRefreshes++;
                } finally {
                    self.setContextClassLoader(previous);
                }
            }
            consumersToWake.clear();
            return detail.toString();
        }

        /** Until no heartbeat of the client holds its heartbeat lock (at most `maxMs`). */
        private static void awaitHeartbeatLock(Object instance, long maxMs) {
            try {
                Object lock = findField(instance.getClass(), "lockHeartbeat").get(instance);
                if (!(lock instanceof java.util.concurrent.locks.ReentrantLock)) {
                    return;
                }
                long end = System.nanoTime() + maxMs * 1_000_000L;
                while (((java.util.concurrent.locks.ReentrantLock) lock).isLocked() && System.nanoTime() < end) {
                    java.util.concurrent.locks.LockSupport.parkNanos(2_000_000L);
                }
            } catch (Throwable t) {
                // a client without that lock: heartbeat as before
            }
        }

        private static String sinceMs(long startedNs) {
            return (System.nanoTime() - startedNs) / 1000 / 1000.0 + " ms";
        }
    }
}
