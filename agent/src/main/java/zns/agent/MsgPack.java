package zns.agent;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;

/**
 * Reads the top-level MessagePack map of a ZNS/1 event (protocol §2, §7): string keys,
 * scalar values kept (String, Long, Boolean, null), nested maps and arrays skipped and
 * kept as {@link #NESTED}. Only the few scalar fields of an event matter to the agent (the
 * route itself is pulled by the application's own client), so a reader of this subset
 * keeps JeroMQ the agent's only dependency.
 *
 * <p>Every length is checked against the bytes left before it is used: a truncated or
 * hostile body is an {@link IOException}, never an allocation of its claimed size.
 */
final class MsgPack {

    /** The value stored for a nested map or array (present, not nil, not read). */
    static final Object NESTED = new Object() {
        @Override
        public String toString() {
            return "<nested>";
        }
    };

    /** Nesting deeper than this is refused (a route is 4 levels deep). */
    private static final int MAX_DEPTH = 32;

    private final byte[] data;
    private int pos;

    private MsgPack(byte[] data) {
        this.data = data;
    }

    /** The top-level map of `data`; an IOException when it is not one or is malformed. */
    static Map<String, Object> readMap(byte[] data) throws IOException {
        MsgPack reader = new MsgPack(data);
        int b = reader.u8();
        long size;
        if ((b & 0xf0) == 0x80) {
            size = b & 0x0f;
        } else if (b == 0xde) {
            size = reader.u16();
        } else if (b == 0xdf) {
            size = reader.u32();
        } else {
            throw new IOException("not a MessagePack map (first byte 0x" + Integer.toHexString(b) + ")");
        }
        // Each entry takes at least two bytes: a claimed size beyond that is malformed.
        if (size * 2 > data.length - reader.pos) {
            throw new IOException("map of " + size + " entries in " + data.length + " bytes");
        }
        Map<String, Object> out = new HashMap<>();
        for (long i = 0; i < size; i++) {
            Object key = reader.value(0);
            Object value = reader.value(0);
            if (key instanceof String) {
                out.put((String) key, value);
            }
        }
        return out;
    }

    private Object value(int depth) throws IOException {
        if (depth > MAX_DEPTH) {
            throw new IOException("nested deeper than " + MAX_DEPTH);
        }
        int b = u8();
        if (b <= 0x7f) {
            return (long) b;
        }
        if (b >= 0xe0) {
            return (long) (byte) b;
        }
        if ((b & 0xe0) == 0xa0) {
            return str(b & 0x1f);
        }
        if ((b & 0xf0) == 0x80) {
            skipEntries((b & 0x0f) * 2L, depth);
            return NESTED;
        }
        if ((b & 0xf0) == 0x90) {
            skipEntries(b & 0x0f, depth);
            return NESTED;
        }
        switch (b) {
            case 0xc0:
                return null;
            case 0xc2:
                return Boolean.FALSE;
            case 0xc3:
                return Boolean.TRUE;
            case 0xc4:
                skip(u8());
                return NESTED;
            case 0xc5:
                skip(u16());
                return NESTED;
            case 0xc6:
                skip(u32());
                return NESTED;
            case 0xc7:
                skip(u8() + 1L);
                return NESTED;
            case 0xc8:
                skip(u16() + 1L);
                return NESTED;
            case 0xc9:
                skip(u32() + 1L);
                return NESTED;
            case 0xca:
                skip(4);
                return NESTED;
            case 0xcb:
                skip(8);
                return NESTED;
            case 0xcc:
                return (long) u8();
            case 0xcd:
                return (long) u16();
            case 0xce:
                return u32();
            case 0xcf:
                return s64(); // above 2^63-1 wraps negative: no revision gets there
            case 0xd0:
                return (long) (byte) u8();
            case 0xd1:
                return (long) (short) u16();
            case 0xd2:
                return (long) (int) u32();
            case 0xd3:
                return s64();
            case 0xd4:
                skip(2);
                return NESTED;
            case 0xd5:
                skip(3);
                return NESTED;
            case 0xd6:
                skip(5);
                return NESTED;
            case 0xd7:
                skip(9);
                return NESTED;
            case 0xd8:
                skip(17);
                return NESTED;
            case 0xd9:
                return str(u8());
            case 0xda:
                return str(u16());
            case 0xdb:
                return str(u32());
            case 0xdc:
                skipEntries(u16(), depth);
                return NESTED;
            case 0xdd:
                skipEntries(u32(), depth);
                return NESTED;
            case 0xde:
                skipEntries(u16() * 2L, depth);
                return NESTED;
            case 0xdf:
                skipEntries(u32() * 2L, depth);
                return NESTED;
            default:
                throw new IOException("invalid MessagePack byte 0x" + Integer.toHexString(b) + " at " + (pos - 1));
        }
    }

    private void skipEntries(long count, int depth) throws IOException {
        if (count > data.length - pos) { // each value is at least one byte
            throw new IOException(count + " values claimed with " + (data.length - pos) + " bytes left");
        }
        for (long i = 0; i < count; i++) {
            value(depth + 1);
        }
    }

    private String str(long length) throws IOException {
        need(length);
        String s = new String(data, pos, (int) length, StandardCharsets.UTF_8);
        pos += (int) length;
        return s;
    }

    private void skip(long length) throws IOException {
        need(length);
        pos += (int) length;
    }

    private void need(long length) throws IOException {
        if (length < 0 || length > data.length - pos) {
            throw new IOException("truncated: " + length + " bytes claimed at " + pos + " of " + data.length);
        }
    }

    private int u8() throws IOException {
        need(1);
        return data[pos++] & 0xff;
    }

    private int u16() throws IOException {
        return (u8() << 8) | u8();
    }

    private long u32() throws IOException {
        return ((long) u16() << 16) | u16();
    }

    private long s64() throws IOException {
        return (u32() << 32) | u32();
    }
}
