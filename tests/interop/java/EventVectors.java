/*
 * Feeds event bodies to zns-agent's own decoder (Event.decode over MsgPack.readMap), for
 * tests/interop/test_agent_events.py. In the agent's package so that it reaches the
 * package-private classes of the jar it runs beside (java -cp zns-agent.jar:DIR); it is
 * not part of the jar.
 *
 * stdin: bodies, each a 4-byte big-endian length then the bytes. stdout: one JSON line per
 * body, in order:
 *   {"op":...,"epoch":...,"revision":N,"topic":...,"cluster":...,"broker_name":...}
 *   {"refused":"<the IOException's message>"}      the body is not a ZNS/1 event
 *   {"thrown":"<class>: <message>"}                 anything else: the decoder's bug
 */
package zns.agent;

import java.io.DataInputStream;
import java.io.EOFException;
import java.io.IOException;
import java.util.LinkedHashMap;
import java.util.Map;

public final class EventVectors {
    private EventVectors() {
    }

    public static void main(String[] args) throws IOException {
        DataInputStream in = new DataInputStream(new java.io.BufferedInputStream(System.in));
        StringBuilder out = new StringBuilder();
        while (true) {
            int length;
            try {
                length = in.readInt();
            } catch (EOFException end) {
                break;
            }
            byte[] body = new byte[length];
            in.readFully(body);
            Map<String, Object> line = new LinkedHashMap<>();
            try {
                Event e = Event.decode(body);
                line.put("op", e.op);
                line.put("epoch", e.epoch);
                line.put("revision", e.revision);
                line.put("topic", e.topic);
                line.put("cluster", e.cluster);
                line.put("broker_name", e.brokerName);
            } catch (IOException refused) {
                line.put("refused", String.valueOf(refused.getMessage()));
            } catch (Throwable t) { // StackOverflowError, OutOfMemoryError, any RuntimeException
                line.put("thrown", t.getClass().getName() + ": " + t.getMessage());
            }
            out.append(Json.write(line)).append('\n');
        }
        System.out.print(out);
        System.out.flush();
    }
}
