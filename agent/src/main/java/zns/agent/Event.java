package zns.agent;

import java.io.IOException;
import java.util.Map;

/** The fields of a ZNS/1 event (protocol §7) that the agent acts on. */
final class Event {
    final String op;         // "route", "broker" or "hb"; anything else is ignored
    final String epoch;
    final long revision;
    final String topic;      // route events
    final String cluster;    // broker events
    final String brokerName; // broker events

    Event(String op, String epoch, long revision, String topic, String cluster, String brokerName) {
        this.op = op;
        this.epoch = epoch;
        this.revision = revision;
        this.topic = topic;
        this.cluster = cluster;
        this.brokerName = brokerName;
    }

    /** Decodes an event body; an IOException when it is not a readable ZNS/1 event. */
    static Event decode(byte[] body) throws IOException {
        Map<String, Object> m = MsgPack.readMap(body);
        String op = text(m, "op");
        String epoch = text(m, "epoch");
        Object revision = m.get("revision");
        if (op == null || epoch == null || !(revision instanceof Long)) {
            throw new IOException("not a ZNS/1 event: op, epoch or revision missing");
        }
        return new Event(op, epoch, (Long) revision, text(m, "topic"), text(m, "cluster"), text(m, "broker_name"));
    }

    private static String text(Map<String, Object> m, String key) {
        Object v = m.get(key);
        return v instanceof String ? (String) v : null;
    }

    @Override
    public String toString() {
        return op + "@" + epoch + "/" + revision + (topic != null ? " " + topic : "")
            + (brokerName != null ? " " + cluster + "/" + brokerName : "");
    }
}
