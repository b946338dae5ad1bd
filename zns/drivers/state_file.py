"""The state dump's file (`--state-path`): loaded at start, written after changes and at stop.

What is in a dump and what a restore does is decided in zns.core.warm; this module
moves its bytes. The file is replaced atomically (a temporary file beside it,
fsynced, renamed over it, the directory fsynced), so a crash at any point leaves
the previous dump or the new one, never a mix.

`StateWriter` is a source of the server's loop. When the core's `DumpSchedule` says a
dump is due (the state machine's `changes` moved: the table's or the emptied
namespaces'), it reads the table in steps of DUMP_STEP_WORK queue entries, each inside
the loop's slice, and starts over later if the table changed between two steps (after
MAX_DUMP_RESTARTS of those it reads the table in one pass, so that a steady stream of
changes cannot keep every dump from ending); the emptied namespaces are read with the
last step. The finished state (a copy: nothing in
it is the table's) is encoded and written by a thread. The thread's end wakes the loop;
what it raised is raised again in the loop, as itself: an OSError (a full disk, a removed directory) is logged in one line and the
dump is tried again after the next interval; anything else is a bug and reaches the
loop's boundary with its traceback. A worker the loop forks while the thread writes
closes its copies of the descriptors the thread holds open (`_writing_fds`). At a clean stop the server writes one last dump
in full (`write_now`), after any write under way.

One zns per dump: the writer holds the dump's lock (zns.drivers.file_lock, as the KV
store holds its file's) from before the dump is read at start, or, when its directory
does not exist yet, from the first write, which makes it. Two instances given the same
`--state-path` (and each its own `--kv-path`) would each restore the other's routes and
rename their dumps over each other's; the second is refused at start in one line naming
the first's pid, or, when the directory came later, its writes fail, logged as any
failed write is.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from zns.core import warm
from zns.core.errors import ConfigError, KvFileError
from zns.core.routes import DUMP_STEP_WORK
from zns.core.service import NameService
from zns.core.state import MAX_DUMP_RESTARTS
from zns.core.table_state import TableState
from zns.drivers import file_lock
from zns.drivers.kv_file import existing_ancestor
from zns.drivers.loop import PollSet, Ready

log = logging.getLogger("zns")

# The default dump is the KV file's path with this appended: named after its KV file, so that
# NameServers that keep their KV files in one directory each get a dump of their own.
DEFAULT_SUFFIX = ".state"
LOCKED_OPTION = "--state-path"  # named by the refusal of a dump another zns holds


def state_path_for(state_path: str, kv_path: str | None) -> Path | None:
    """The dump's real path (file_lock.real_file): `state_path`, or the KV file's name with
    DEFAULT_SUFFIX when it is ""; None (no dump) when the KV store is held in memory and no
    path is given. ConfigError when it is the KV file: each dump would be renamed over
    the KV log, whose acknowledged writes would then go to a file no longer there."""
    if state_path:
        path = Path(state_path).expanduser()
    elif kv_path is None:
        return None
    else:
        kv = Path(kv_path).expanduser()
        path = kv.with_name(kv.name + DEFAULT_SUFFIX)
    if kv_path is not None and _same_file(path, Path(kv_path).expanduser()):
        raise ConfigError(f"state dump {path} is the KV file (--kv-path); give the state dump "
                          "a file of its own (--state-path)")
    return file_lock.real_file(path)  # its lock and its renames act on the file, not a symlink


def _same_file(one: Path, other: Path) -> bool:
    try:
        return os.path.samefile(one, other)
    except OSError:  # one is not there (yet), or cannot be reached: what it would be
        # realpath, not Path.resolve: that raises RuntimeError on a symlink loop, which the
        # later checks refuse in one line
        return os.path.realpath(one) == os.path.realpath(other)


def check_writable(path: Path) -> None:
    """Refuse at start a path the first write would fail on (one line: ConfigError). Missing
    directories are made at the first write, as the KV file's are."""
    if path.is_dir():
        raise ConfigError(f"state dump {path} is a directory; give a file path (--state-path)")
    if path.exists() and not path.is_file():
        # /dev/null (a way to say "no dump" that looks right) reads as an empty dump, and the
        # first write would rename a regular file over the device; a FIFO blocks the start.
        raise ConfigError(f"state dump {path} is not a regular file; give a file path "
                          "(--state-path)")
    existing = existing_ancestor(path)
    if not existing.is_dir():
        raise ConfigError(f"state dump {path} cannot be written: {existing} is a file, not a "
                          "directory (--state-path)")
    try:  # a real file, not os.access: root passes that everywhere, /proc included
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as exc:
        raise ConfigError(f"state dump {path} cannot be written: directory {existing} does "
                          f"not take new files ({exc.strerror}) (--state-path)") from None
    if path.exists() and not os.access(path, os.R_OK):
        raise ConfigError(f"state dump {path} is not readable (--state-path)")


def load(path: Path) -> warm.StateDump | None:
    """The dump at `path`; None when there is none or it cannot be used (logged in one line).
    A dump of a newer format, or a file that is no dump at all (a wrong path: the KV log,
    a file of something else), stops the start (ConfigError): starting empty would
    replace it with the first dump."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"state dump {path} cannot be read: {exc.strerror} (--state-path)")
    if not warm.begins_as_dump(data):
        raise ConfigError(f"state dump {path} is not a zns state dump (it begins "
                          f"{bytes(data[:16])!r}); zns will not replace it: give another "
                          "--state-path, or move the file away")
    try:
        return warm.decode_dump(data)
    except warm.NewerDump as exc:
        raise ConfigError(f"state dump {path} was {exc}; run that zns, or delete the file to "
                          "start with no routes (--state-path)") from None
    except warm.CorruptDump as exc:
        log.error("state dump %s ignored, starting with no routes: %s", path, exc)
        return None


def restored_writer(path: Path, service: NameService, *, now: int, wall_ms: Callable[[], int],
                    wake: Callable[[], None],
                    clock: Callable[[], int]) -> tuple[StateWriter, warm.StateDump | None]:
    """The dump at `path` loaded into the fresh `service`, and the StateWriter that keeps it
    from then on, holding the dump's lock (taken before the dump is read; when the directory
    does not exist yet, at the first write). Refused, in one line: an unusable `path`
    (ConfigError), one another zns holds (KvFileError, naming its pid). The dump restored is
    None when there is none, or it is corrupt (said in one line, starting empty)."""
    check_writable(path)  # before the lock: a directory given as the path gets no lock file
    lock = file_lock.hold(path, LOCKED_OPTION) if path.parent.is_dir() else None
    try:
        dump = _restore(path, service, now, wall_ms())
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return StateWriter(path, service, wake=wake, clock=clock, wall_ms=wall_ms, restored=dump,
                       lock=lock), dump


def _restore(path: Path, service: NameService, now: int, wall_ms: int) -> warm.StateDump | None:
    dump = load(path)
    if dump is None:
        return None
    try:
        warm.restore(service, dump, now)
    except warm.CorruptDump as exc:
        log.error("state dump %s ignored, starting with no routes: %s", path, exc)
        return None
    table = service.table
    log.info("restored %d broker names and %d topics from %s (written %.1f s ago); each broker "
             "is removed unless it registers again (reason not_confirmed)", table.broker_count(),
             table.topic_count(), path, max(0, wall_ms - dump.written_ms) / 1000)
    return dump


def write_file(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically and durably."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    try:
        # Readable by its owner only, as the KV file: it lists every broker and topic.
        fd = _open_while_writing(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with memoryview(data) as left:
                while left:
                    left = left[os.write(fd, left):]
            os.fsync(fd)
        finally:
            _close_written(fd)
        os.replace(temporary, path)
    except BaseException:
        # A write that failed (a full disk) leaves no partial copy behind: it would hold
        # the space the KV log's next put needs until a write succeeds, for ever after a
        # failed one at stop.
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    directory = _open_while_writing(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        _close_written(directory)


# The descriptors a dump's writing holds open now (the temporary file, the directory it
# fsyncs), by the writer's thread while the loop's may fork a worker (a replacement:
# zns.drivers.replication_link.fork_worker). A fork copies every descriptor, O_CLOEXEC or
# not, and nothing in the child closes it (the thread that would is not there, and the
# file object it used is never freed): the worker kept the dump it had copied open for its
# whole life, a deleted file once the next dump was renamed over it, its disk space (a
# whole dump) taken until that worker ended. So a forked child closes them at once.
_writing_fds: set[int] = set()
# Held from a descriptor's opening to its entry in the set, and from its removal to its
# closing, and across every fork (register_at_fork below): so a child never copies a
# descriptor missing from the set, nor closes a number the parent's other thread has
# reused since the writer closed it.
_writing_fds_guard = threading.Lock()


def _open_while_writing(path: Path, flags: int, mode: int = 0o777) -> int:
    with _writing_fds_guard:
        fd = os.open(path, flags, mode)
        _writing_fds.add(fd)
    return fd


def _close_written(fd: int) -> None:
    with _writing_fds_guard:
        _writing_fds.discard(fd)
        os.close(fd)


def _close_in_child() -> None:
    for fd in _writing_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    _writing_fds.clear()
    _writing_fds_guard.release()  # taken by the forking thread, this one in the child


os.register_at_fork(before=_writing_fds_guard.acquire,
                    after_in_parent=_writing_fds_guard.release,
                    after_in_child=_close_in_child)


class StateWriter:
    """The loop's source that keeps the dump file up to date (see the module docstring)."""

    what = "writing the state dump"

    def __init__(self, path: Path, service: NameService, *, wake: Callable[[], None],
                 clock: Callable[[], int], wall_ms: Callable[[], int],
                 interval_ms: int = warm.DEFAULT_DUMP_INTERVAL_MS,
                 write: Callable[[Path, bytes], None] = write_file,
                 step_work: int = DUMP_STEP_WORK,
                 restored: warm.StateDump | None = None,
                 lock: file_lock.FileLock | None = None) -> None:
        """`clock`: the loop's (monotonic ms); `wake`: wakes the loop (from the thread);
        `step_work`: queue entries per step (RouteTable.dump_in_steps); `restored`: the
        dump the service was restored from (warm.dump's `restored_remoting`); `lock`: the
        dump's lock, taken by `restored_writer` (else taken before the first write)."""
        self.path, self._service, self._wake, self._wall_ms = path, service, wake, wall_ms
        self._lock = lock
        self._restored_remoting = frozenset(restored.remoting) if restored else frozenset()
        self._clock, self._step_work = clock, step_work
        self._write = write
        self.schedule = warm.DumpSchedule(interval_ms, written=service.state.changes)
        self._steps: Iterator[TableState | None] | None = None
        self._steps_of = 0  # the table's change count when the steps began
        self._restarts = 0  # times the steps started over for a change (MAX_DUMP_RESTARTS)
        self._thread: threading.Thread | None = None
        self._outcome: BaseException | None = None
        self.written = 0  # dumps written (metrics, tests)
        self.failed = 0  # writes that failed (metrics: a full or read-only disk shows here)
        self.last_bytes = 0  # the size of the last dump written

    @property
    def reading(self) -> bool:
        """A dump is being read from the table, in steps."""
        return self._steps is not None

    @property
    def writing(self) -> bool:
        """A dump is being written by the thread (or its end not yet taken by the loop)."""
        return self._thread is not None

    def attach(self, poll: PollSet) -> None:
        pass

    def next_deadline(self, now: int) -> int | None:
        if self._thread is not None:
            return now if not self._thread.is_alive() else None
        if self._steps is not None:
            return now
        return self.schedule.next_deadline(self._service.state.changes, now)

    def run(self, ready: Ready, now: int, until: int) -> None:
        if self._thread is not None:
            if not self._thread.is_alive():
                self._finish()
            return
        table = self._service.table
        if self._steps is None:
            if not self._held(now):
                return
            self._steps, self._steps_of = table.dump_in_steps(self._step_work), table.changes
            self._restarts = 0
        state: TableState | None
        while True:
            if table.changes != self._steps_of:  # changed between two steps: start over
                self._restarts += 1
                if self._restarts > MAX_DUMP_RESTARTS:
                    # Changes as frequent as the steps' passes would start them over for
                    # ever and no dump would be written at all: one pass, as a state
                    # transfer does (StateMachine.dump_in_steps); the loop pays the whole
                    # reading at once (12-17 ms of CPU at 10,000 topics), once.
                    state = table.dump()
                    break
                self._steps, self._steps_of = table.dump_in_steps(self._step_work), table.changes
            state = next(self._steps)
            if state is not None:
                break
            if self._clock() >= until:
                return
        self._steps = None
        # The table is as now (at _steps_of, or read in one pass); the emptied namespaces
        # are read now, with the count.
        dump = warm.dump(self._service, self._wall_ms(), state, self._restored_remoting)
        self.schedule.started(self._service.state.changes, now)
        self._thread = threading.Thread(target=self._write_in_thread, args=(dump,),
                                        name="zns-state-dump", daemon=True)
        self._thread.start()

    def write_now(self) -> None:
        """Write the dump as the table is now, after any write under way (a clean stop);
        nothing when the file already holds it."""
        if self._thread is not None:
            self._thread.join()
            self._finish()
        if self.schedule.written == self._service.state.changes:
            return
        if not self._held(0, at_stop=True):
            return
        dump = warm.dump(self._service, self._wall_ms(), restored_remoting=self._restored_remoting)
        self.schedule.started(self._service.state.changes, 0)
        try:
            data = warm.encode_dump(dump)
            self._write(self.path, data)
        except OSError as exc:
            self.schedule.finished(False)
            self.failed += 1
            log.error("cannot write the state dump %s at stop: %s", self.path, exc)
            return
        self.schedule.finished(True)
        self.written += 1
        self.last_bytes = len(data)

    def close(self) -> None:
        """Release the dump's lock (after `write_now`): another zns may take the file."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _held(self, now: int, *, at_stop: bool = False) -> bool:
        """Whether this process holds the dump's lock, taken now if it was not at start (the
        directory did not exist: made now, in the loop's thread, so that no worker forked
        meanwhile can copy a descriptor it is opening). Not held (another zns holds it, or
        the directory cannot be made): a failed write, tried again after the interval."""
        if self._lock is not None:
            return True
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock = file_lock.hold(self.path, LOCKED_OPTION)
        except (OSError, KvFileError) as exc:
            self.schedule.started(self._service.state.changes, now)
            self.schedule.finished(False)
            self.failed += 1
            if at_stop:
                log.error("cannot write the state dump %s at stop: %s", self.path, exc)
            else:
                log.error("cannot write the state dump %s (tried again in %d ms): %s",
                          self.path, self.schedule.interval_ms, exc)
            return False
        return True

    def _write_in_thread(self, dump: warm.StateDump) -> None:
        try:
            data = warm.encode_dump(dump)
            self._write(self.path, data)
            self.last_bytes = len(data)
        except BaseException as exc:  # handed to the loop, raised there as itself
            self._outcome = exc
        finally:
            self._wake()

    def _finish(self) -> None:
        assert self._thread is not None
        self._thread.join()
        self._thread = None
        outcome, self._outcome = self._outcome, None
        self.schedule.finished(outcome is None)
        if outcome is None:
            self.written += 1
        elif isinstance(outcome, OSError):
            self.failed += 1
            log.error("cannot write the state dump %s (tried again in %d ms): %s", self.path,
                      self.schedule.interval_ms, outcome)
        else:
            raise outcome
