/*
 * Kills the I/O thread of the agent loop's JeroMQ context and reports what the loop does,
 * for tests/interop/test_agent_events.py. In the agent's package, like EventVectors, so
 * that it reaches the jar's package-private classes (java -cp zns-agent.jar:DIR); it is not
 * part of the jar. The loop's own methods are called by reflection, in the order its run()
 * calls them after a failure, on a loop that serves no RocketMQ client.
 *
 *   java -cp zns-agent.jar:DIR zns.agent.LoopFault tcp://HOST:PORT   (an events endpoint)
 *
 * stdout, one JSON line each:
 *   {"seen":"<what the loop was told>"}     the loop learned that its context's thread died
 *   {"step":"<what step() threw>"}          its next step gives up the streams
 *   {"closed_ms":N}                         closing everything took N ms (the dead context
 *                                           never terminates: closing must not wait for it)
 *   {"fresh":true|false}                    the loop made a new context after closing
 *   {"hb_wait_ms":N,"errno":E}              how long its receive took, and JeroMQ's errno after it
 *   {"hb":true|false}                       that fresh context receives an hb (30 s at most);
 *                                           when not, every thread's stack goes to stderr
 */
package zns.agent;

import java.lang.reflect.Field;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;

// JeroMQ as the jar has it, relocated (agent/pom.xml)
import zns.agent.shaded.org.zeromq.SocketType;
import zns.agent.shaded.org.zeromq.ZContext;
import zns.agent.shaded.org.zeromq.ZMQ;

public final class LoopFault {
    private LoopFault() {
    }

    public static void main(String[] args) throws Exception {
        String endpoint = args[0];
        AgentLoop loop = new AgentLoop(AgentConfig.parse("events=" + endpoint), new RocketMqClients(null));
        Method context = declared("context");
        Field failure = AgentLoop.class.getDeclaredField("contextFailure");
        failure.setAccessible(true);

        ZContext dying = (ZContext) context.invoke(loop);
        ZMQ.Socket s = dying.createSocket(SocketType.SUB);
        s.setMsgAllocator(size -> {
            throw new OutOfMemoryError("LoopFault: no memory for a frame of " + size + " bytes");
        });
        s.subscribe("hb\0".getBytes(StandardCharsets.UTF_8));
        s.connect(endpoint); // the first frame received kills the I/O thread
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
        while (failure.get(loop) == null && System.nanoTime() < deadline) {
            Thread.sleep(10);
        }
        System.out.println("{\"seen\":" + quote(String.valueOf(failure.get(loop))) + "}");

        try {
            declared("step").invoke(loop);
            System.out.println("{\"step\":null}");
        } catch (InvocationTargetException e) {
            System.out.println("{\"step\":" + quote(String.valueOf(e.getCause())) + "}");
        }
        long started = System.nanoTime();
        declared("closeAll").invoke(loop);
        System.out.println("{\"closed_ms\":" + TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started) + "}");

        ZContext fresh = (ZContext) context.invoke(loop);
        ZMQ.Socket h = fresh.createSocket(SocketType.SUB);
        h.setReceiveTimeOut(30_000); // a deadline, not a measure: a loaded machine may be slow
        h.subscribe("hb\0".getBytes(StandardCharsets.UTF_8));
        h.connect(endpoint);
        System.out.println("{\"fresh\":" + (fresh != dying) + "}");
        long waiting = System.nanoTime();
        byte[] hb = h.recv();
        System.out.println("{\"hb_wait_ms\":" + TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - waiting)
                + ",\"errno\":" + h.errno() + "}");
        System.out.println("{\"hb\":" + (hb != null) + "}");
        System.out.flush();
        if (hb == null) { // what every thread was doing, for the test's failure message
            for (java.util.Map.Entry<Thread, StackTraceElement[]> t : Thread.getAllStackTraces().entrySet()) {
                System.err.println(t.getKey().getName() + " " + t.getKey().getState());
                for (StackTraceElement e : t.getValue()) {
                    System.err.println("    at " + e);
                }
            }
            System.err.flush();
        }
        Runtime.getRuntime().halt(0); // the dead context's threads are daemons, but leave no doubt
    }

    private static Method declared(String name) throws NoSuchMethodException {
        Method m = AgentLoop.class.getDeclaredMethod(name);
        m.setAccessible(true);
        return m;
    }

    private static String quote(String s) {
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }
}
