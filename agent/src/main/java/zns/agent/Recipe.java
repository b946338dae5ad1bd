package zns.agent;

import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;

/**
 * The no-missed-change recipe of protocol §7, for a follower that never holds a route
 * itself: "pull" means letting the application's own client pull the topic from its
 * NameServer. So applying an event and repairing a gap are the same action (refresh the
 * topic), and revisions serve to do it once per change: an event whose revision was
 * already acted on for that topic is ignored.
 *
 * <ul>
 *   <li>step 2: a topic subscribed since the last {@code hb} is refreshed at the next
 *       {@code hb}, when the subscription is known to be in force;</li>
 *   <li>step 3: a {@code route} event for a held topic, newer than the last acted-on
 *       revision, refreshes it; a {@code broker} event refreshes the held topics whose
 *       route lists that broker (the route events of the same revision then add nothing);</li>
 *   <li>step 4: a new epoch refreshes every held topic; no {@code hb} for three
 *       heartbeat intervals is {@link #silent}, and the caller gives the stream up;</li>
 *   <li>step 5 is the application's own periodic poll, which the agent leaves running.</li>
 * </ul>
 *
 * Pure logic (time is passed in), one instance per followed stream; its memory is one entry
 * per held topic.
 */
final class Recipe {
    private final long silenceMs;
    private String epoch;
    private final Map<String, Long> actedOn = new HashMap<>();
    private final Set<String> unproven = new HashSet<>();
    private long lastHbMs;
    private boolean sawHb;

    Recipe(long heartbeatIntervalMs, long nowMs) {
        this.silenceMs = 3 * heartbeatIntervalMs;
        this.lastHbMs = nowMs;
    }

    /** Topics whose subscriptions were just added: refreshed at the next hb (step 2). */
    void subscribed(Collection<String> topics) {
        unproven.addAll(topics);
    }

    /** Topics no longer held: forgotten. */
    void unsubscribed(Collection<String> topics) {
        for (String t : topics) {
            actedOn.remove(t);
            unproven.remove(t);
        }
    }

    /** True when no hb came for three heartbeat intervals (step 4): the stream is lost. */
    boolean silent(long nowMs) {
        return nowMs - lastHbMs > silenceMs;
    }

    /** When the stream will count as silent if no hb comes first. */
    long silentAt() {
        return lastHbMs + silenceMs + 1;
    }

    boolean sawHb() {
        return sawHb;
    }

    String epoch() {
        return epoch;
    }

    /** Topics subscribed and not yet proven in force by an hb on their socket. */
    boolean unprovenPending() {
        return !unproven.isEmpty();
    }

    /**
     * The held topics to refresh because of `e`.
     *
     * @param held the topics the application holds, each with the brokers of its route
     *             as {@code cluster/brokerName}
     * @param sameSocket whether `e` came on the socket of the route subscriptions: only an
     *             hb there proves them in force (step 2); an hb on another socket proves
     *             the stream alive
     */
    Set<String> onEvent(Event e, Map<String, Set<String>> held, long nowMs, boolean sameSocket) {
        Set<String> refresh = new HashSet<>();
        if (epoch != null && !epoch.equals(e.epoch)) { // a new server: every revision is void
            actedOn.clear();
            unproven.clear();
            refresh.addAll(held.keySet());
        }
        epoch = e.epoch;
        switch (e.op) {
            case "hb":
                lastHbMs = nowMs;
                sawHb = true;
                if (!sameSocket) {
                    break;
                }
                for (String t : unproven) {
                    if (held.containsKey(t)) {
                        refresh.add(t);
                    }
                }
                unproven.clear();
                break;
            case "route":
                if (e.topic != null && held.containsKey(e.topic)) {
                    act(e.topic, e.revision, refresh);
                }
                break;
            case "broker":
                if (e.cluster != null && e.brokerName != null) {
                    String key = e.cluster + "/" + e.brokerName;
                    for (Map.Entry<String, Set<String>> entry : held.entrySet()) {
                        if (entry.getValue().contains(key)) {
                            act(entry.getKey(), e.revision, refresh);
                        }
                    }
                }
                break;
            default:
                break; // an op this agent does not know: ignored (§2: the protocol grows)
        }
        return refresh;
    }

    private void act(String topic, long revision, Set<String> refresh) {
        Long seen = actedOn.get(topic);
        if (seen == null || revision > seen) {
            actedOn.put(topic, revision);
            refresh.add(topic);
        }
    }
}
