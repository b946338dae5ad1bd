package zns.agent;

import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * What a {@link Follower} serves: clients that share one list of NameServers. In the agent
 * these are the application's RocketMQ client instances ({@link RocketMqClients}); in the
 * command-line check, a fixed list of topics whose refreshes are printed.
 */
interface Target {
    /** The NameServer addresses ("host:port") these clients use, in their order. */
    List<String> namesrvAddrs();

    /** The topics held, each with its route's brokers as {@code cluster/brokerName}. */
    Map<String, Set<String>> topics();

    /**
     * Have the clients pull these topics now, in this order; never throws. Returns what took
     * how long, for the agent's debug line ("" if nothing to say).
     */
    String refresh(Set<String> topics, String why);

    /**
     * After the pulls of one change: wake the rebalancing of the consumers whose topics were
     * pulled (after a heartbeat when a broker was added to their routes); never throws.
     * Returns what took how long, as {@link #refresh} does.
     */
    String wakeConsumers();
}
