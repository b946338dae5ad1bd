package zns.agent;

import java.util.concurrent.atomic.AtomicLong;

import zmq.Msg;
import zmq.msg.MsgAllocator;

/**
 * The byte account of one SUB socket: JeroMQ's I/O thread allocates every frame it receives
 * for the socket through this allocator, which counts the bytes given out since the agent
 * last read a message from the socket.
 *
 * <p>The socket's maximum message size bounds one frame and its receive high-water mark
 * bounds the number of whole messages queued, but neither bounds a message that never
 * ends (frames flagged MORE, without end: the queue counts only complete messages), nor
 * a queue of large messages that the agent reads rarely (the hb socket is read every
 * third heartbeat). This account bounds both: past its limit nothing more is kept (see
 * {@link #allocate}) and the agent closes the socket, which frees everything it held. A
 * read resets the count, so a stream that the agent keeps up with never reaches the limit,
 * whatever its total volume.
 *
 * <p>Frames are heap arrays, never direct buffers (JeroMQ's default allocator puts frames
 * over 1 MiB in direct memory, whose exhaustion is an OutOfMemoryError in its I/O thread).
 */
final class FrameBudget implements MsgAllocator {
    private final long limit;
    private final Runnable wake;
    private final AtomicLong sinceRead = new AtomicLong();
    private volatile boolean exceeded;

    /** `wake` is run (on JeroMQ's I/O thread, once) when the limit is passed; it must not block. */
    FrameBudget(long limit, Runnable wake) {
        this.limit = limit;
        this.wake = wake;
    }

    /**
     * A frame of `size` bytes; past the limit, an empty one. Closing the socket takes a
     * moment (JeroMQ's I/O thread tears its connection down later), and a peer on loopback
     * sends tens of MB meanwhile: from the limit on, nothing more is kept. The decoder reads
     * an empty frame as complete and parses what follows as frames again, which for the
     * rest of a hostile frame means garbage, also kept as empty frames or refused (a claimed
     * size beyond the maximum closes the connection). The stream is being dropped anyway.
     */
    @Override
    public Msg allocate(int size) {
        if (sinceRead.addAndGet(size) <= limit) {
            return new Msg(size);
        }
        if (!exceeded) {
            exceeded = true;
            try {
                wake.run();
            } catch (Throwable ignored) {
                // the agent sees the flag at its next wake anyway
            }
        }
        return new Msg(0);
    }

    /** The agent read a whole message from the socket. */
    void read() {
        sinceRead.set(0);
    }

    boolean exceeded() {
        return exceeded;
    }

    long limit() {
        return limit;
    }
}
