package zns.agent;

import java.text.SimpleDateFormat;
import java.util.Date;

/** The agent's few log lines, on the application's standard error, each one line. */
final class Log {
    static volatile boolean quiet;
    static volatile boolean debug;

    private Log() {
    }

    /** A line per refresh, with `log=debug` only. */
    static void debug(String message) {
        if (debug) {
            info(message);
        }
    }

    static void info(String message) {
        if (quiet) {
            return;
        }
        try {
            String time = new SimpleDateFormat("yyyy-MM-dd HH:mm:ss.SSS").format(new Date());
            System.err.println(time + " zns-agent: " + message.replace('\n', ' '));
        } catch (Throwable ignored) {
            // a closed or broken stderr is no reason to disturb the application
        }
    }
}
