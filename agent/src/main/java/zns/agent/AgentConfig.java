package zns.agent;

/**
 * The agent's arguments: {@code -javaagent:zns-agent.jar[=key=value,key=value...]}.
 * None is needed; every one has a default.
 *
 * <pre>
 * events=tcp://host:port   follow this events endpoint instead of asking the NameServers
 * heartbeatMs=1000         the hb interval of that endpoint (asked NameServers say theirs)
 * minBackoffMs=1000        first wait before asking a NameServer again
 * maxBackoffMs=30000       longest wait before asking a NameServer again
 * probeTimeoutMs=1000      connect and read timeout of one GET_NAMESRV_CONFIG
 * log=info|quiet|debug     quiet: not even the start/stop lines; debug: a line per refresh
 * </pre>
 */
final class AgentConfig {
    String events;
    long heartbeatMs = 1000;
    long minBackoffMs = 1000;
    long maxBackoffMs = 30_000;
    int probeTimeoutMs = 1000;
    boolean quiet;
    boolean debug;

    /** Parses the agent argument string; an IllegalArgumentException names what is wrong. */
    static AgentConfig parse(String args) {
        AgentConfig c = new AgentConfig();
        if (args == null || args.trim().isEmpty()) {
            return c;
        }
        for (String item : args.split(",")) {
            String part = item.trim();
            if (part.isEmpty()) {
                continue;
            }
            int eq = part.indexOf('=');
            if (eq <= 0) {
                throw new IllegalArgumentException("expected key=value, got '" + part + "'");
            }
            String key = part.substring(0, eq).trim();
            String value = part.substring(eq + 1).trim();
            switch (key) {
                case "events":
                    if (!value.startsWith("tcp://") || value.lastIndexOf(':') <= "tcp://".length()) {
                        throw new IllegalArgumentException("events must be tcp://host:port, got '" + value + "'");
                    }
                    c.events = value;
                    break;
                case "heartbeatMs":
                    c.heartbeatMs = number(key, value, 10, 3_600_000);
                    break;
                case "minBackoffMs":
                    c.minBackoffMs = number(key, value, 10, 3_600_000);
                    break;
                case "maxBackoffMs":
                    c.maxBackoffMs = number(key, value, 10, 3_600_000);
                    break;
                case "probeTimeoutMs":
                    c.probeTimeoutMs = (int) number(key, value, 10, 60_000);
                    break;
                case "log":
                    if (!value.equals("info") && !value.equals("quiet") && !value.equals("debug")) {
                        throw new IllegalArgumentException("log must be info, quiet or debug, got '" + value + "'");
                    }
                    c.quiet = value.equals("quiet");
                    c.debug = value.equals("debug");
                    break;
                default:
                    throw new IllegalArgumentException("unknown argument '" + key + "' (known: events, heartbeatMs,"
                        + " minBackoffMs, maxBackoffMs, probeTimeoutMs, log)");
            }
        }
        if (c.maxBackoffMs < c.minBackoffMs) {
            throw new IllegalArgumentException("maxBackoffMs " + c.maxBackoffMs + " is below minBackoffMs " + c.minBackoffMs);
        }
        return c;
    }

    private static long number(String key, String value, long min, long max) {
        long n;
        try {
            n = Long.parseLong(value);
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException(key + " must be a whole number of milliseconds, got '" + value + "'");
        }
        if (n < min || n > max) {
            throw new IllegalArgumentException(key + " must be between " + min + " and " + max + ", got " + n);
        }
        return n;
    }
}
