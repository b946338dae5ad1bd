package zns.agent;

import java.io.ByteArrayInputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.Properties;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Asks a NameServer for its configuration with one RocketMQ remoting request,
 * GET_NAMESRV_CONFIG (319), on a short-lived plain TCP connection of its own (protocol
 * §12). zns answers with its bound endpoints, among them {@code pub}, the ZNS/1 events
 * endpoint; RocketMQ's own NameServer answers without one, and the agent then stays idle.
 *
 * The application's client is not used for this: the answer must not depend on its
 * state, and a NameServer that only speaks TLS is not zns anyway (zns's listener is plain
 * TCP), so such a probe fails and the agent stays idle, as it should.
 */
final class NamesrvProbe {
    static final int GET_NAMESRV_CONFIG = 319;
    private static final int MAX_REPLY_BYTES = 1 << 20;
    private static final Pattern CODE = Pattern.compile("\"code\"\\s*:\\s*\"?(-?\\d+)");

    /** What the NameServer said: its configuration, or why it is not a zns to follow. */
    static final class Answer {
        final String endpoint;          // the events endpoint to connect to, or null
        final long heartbeatIntervalMs; // the server's hb interval
        final String why;               // when endpoint is null: why not

        Answer(String endpoint, long heartbeatIntervalMs, String why) {
            this.endpoint = endpoint;
            this.heartbeatIntervalMs = heartbeatIntervalMs;
            this.why = why;
        }
    }

    private NamesrvProbe() {
    }

    /** Asks `namesrv` ("host:port"); an IOException when it cannot be asked at all. */
    static Answer ask(String namesrv, int timeoutMs) throws IOException {
        int colon = namesrv.lastIndexOf(':');
        if (colon <= 0) {
            throw new IOException("NameServer address " + namesrv + " has no port");
        }
        String host = namesrv.substring(0, colon);
        if (host.startsWith("[") && host.endsWith("]")) {
            host = host.substring(1, host.length() - 1);
        }
        int port;
        try {
            port = Integer.parseInt(namesrv.substring(colon + 1).trim());
        } catch (NumberFormatException e) {
            throw new IOException("NameServer address " + namesrv + " has no numeric port");
        }
        Properties config = request(host, port, timeoutMs);
        return interpret(config, host);
    }

    static Answer interpret(Properties config, String namesrvHost) {
        String pub = config.getProperty("pub");
        if (pub == null || pub.trim().isEmpty()) {
            return new Answer(null, 0, "no events endpoint in its configuration (not zns)");
        }
        if ("true".equalsIgnoreCase(config.getProperty("curve", "false").trim())) {
            return new Answer(null, 0, "its events need CURVE, which the agent does not do");
        }
        long hbMs = 1000;
        String hb = config.getProperty("heartbeatInterval");
        if (hb != null) {
            try {
                hbMs = Math.max(10, Math.round(Double.parseDouble(hb.trim()) * 1000));
            } catch (NumberFormatException e) {
                hbMs = 1000;
            }
        }
        return new Answer(substituteWildcard(pub.trim(), namesrvHost), hbMs, null);
    }

    /** `tcp://*:9877` or `tcp://0.0.0.0:9877` is reached at the NameServer's own host (§5). */
    static String substituteWildcard(String endpoint, String namesrvHost) {
        if (!endpoint.startsWith("tcp://")) {
            return endpoint;
        }
        String rest = endpoint.substring("tcp://".length());
        int colon = rest.lastIndexOf(':');
        if (colon < 0) {
            return endpoint;
        }
        String host = rest.substring(0, colon);
        if (host.equals("*") || host.equals("0.0.0.0") || host.equals("::") || host.equals("[::]") || host.isEmpty()) {
            String h = namesrvHost.contains(":") ? "[" + namesrvHost + "]" : namesrvHost;
            return "tcp://" + h + rest.substring(colon);
        }
        return endpoint;
    }

    private static Properties request(String host, int port, int timeoutMs) throws IOException {
        byte[] header = ("{\"code\":" + GET_NAMESRV_CONFIG + ",\"flag\":0,\"language\":\"JAVA\",\"opaque\":1,"
            + "\"serializeTypeCurrentRPC\":\"JSON\",\"version\":479}").getBytes(StandardCharsets.UTF_8);
        try (Socket socket = new Socket()) {
            socket.connect(new InetSocketAddress(host, port), timeoutMs);
            socket.setSoTimeout(timeoutMs);
            socket.setTcpNoDelay(true);
            DataOutputStream out = new DataOutputStream(socket.getOutputStream());
            out.writeInt(4 + header.length);
            out.writeInt(header.length); // serialize type 0 (JSON) in the high byte
            out.write(header);
            out.flush();
            DataInputStream in = new DataInputStream(socket.getInputStream());
            int length = in.readInt();
            if (length < 4 || length > MAX_REPLY_BYTES) {
                throw new IOException("reply length " + length + " out of bounds");
            }
            byte[] frame = new byte[length];
            in.readFully(frame);
            return parseReply(frame);
        }
    }

    /** A reply frame after its length field: the config when the code is SUCCESS (0). */
    static Properties parseReply(byte[] frame) throws IOException {
        DataInputStream in = new DataInputStream(new ByteArrayInputStream(frame));
        int typeAndLength = in.readInt();
        int type = (typeAndLength >>> 24) & 0xff;
        int headerLength = typeAndLength & 0xffffff;
        if (headerLength > frame.length - 4) {
            throw new IOException("header length " + headerLength + " beyond the frame");
        }
        byte[] header = new byte[headerLength];
        in.readFully(header);
        int code;
        if (type == 0) {
            Matcher m = CODE.matcher(new String(header, StandardCharsets.UTF_8));
            if (!m.find()) {
                throw new IOException("reply header without a code");
            }
            code = Integer.parseInt(m.group(1));
        } else if (type == 1 && headerLength >= 2) {
            code = ((header[0] & 0xff) << 8) | (header[1] & 0xff);
        } else {
            throw new IOException("unknown serialize type " + type);
        }
        if (code != 0) {
            throw new IOException("GET_NAMESRV_CONFIG answered code " + code);
        }
        Properties config = new Properties();
        InputStream body = new ByteArrayInputStream(frame, 4 + headerLength, frame.length - 4 - headerLength);
        config.load(new InputStreamReader(body, StandardCharsets.UTF_8));
        return config;
    }
}
