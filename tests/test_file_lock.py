"""One zns per KV file (zns.drivers.file_lock): a second one is refused at start in one line
naming the first's pid; workers hold no copy of the lock, so it is free as soon as the
state process is gone."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ProcessServer, wait_for
from zns.core.errors import Internal, KvFileError
from zns.drivers import file_lock, state_file
from zns.drivers.kv_file import KvStore, read_kv_file

pytestmark = pytest.mark.timeout(120)

HOLD = """
import sys
from zns.drivers.kv_file import KvStore
store = KvStore(sys.argv[1])
print("held", flush=True)
"""
HOLD_DUMP = """
import sys
from pathlib import Path
from zns.drivers import file_lock
lock = file_lock.hold(Path(sys.argv[1]), "--state-path")  # as another zns's state process
print("held", flush=True)
"""
WAIT = "sys.stdin.read()\n"


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zns", "serve", "--router", "tcp://127.0.0.1:*", "--pub",
         "tcp://127.0.0.1:*", *args], capture_output=True, text=True, timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("ZNS_")})


def test_a_kv_file_held_by_another_process_is_refused_naming_its_pid(tmp_path: Path) -> None:
    kv = tmp_path / "kv.json"
    holder = subprocess.Popen([sys.executable, "-c", HOLD + WAIT, str(kv)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(KvFileError) as refused:
            KvStore(kv)
        assert str(refused.value) == (f"{kv} is in use by another zns (pid {holder.pid}): give "
                                      f"each NameServer a file of its own (--kv-path)")
    finally:
        holder.communicate("")  # its end releases the lock: the kernel's, with the process
    store = KvStore(kv)  # free once the holder is gone; the file it left blocks nothing
    assert (tmp_path / "kv.json.lock").read_text() == f"{os.getpid()}\n"
    store.put("ns", "k", "v")
    store.close()  # and with it the lock
    again = KvStore(kv)
    assert again.get("ns", "k") == "v"
    again.close()


def test_in_a_directory_made_at_the_first_write_the_lock_is_taken_then(tmp_path: Path) -> None:
    kv = tmp_path / "later" / "kv.json"
    store = KvStore(kv)  # no directory yet: nothing to lock at start
    assert not kv.parent.exists()
    other = subprocess.Popen([sys.executable, "-c", HOLD + "store.put('ns', 'k', 'v')\n"
                              "print('put', flush=True)\nsys.stdin.read()\n", str(kv)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline() == "held\n"
        assert other.stdout.readline() == "put\n"  # it made the directory, and took the lock
        # Refused as a disk that cannot take the write is (an internal error, its reason said).
        with pytest.raises(Internal, match=rf"{kv} is in use by another zns \(pid {other.pid}\)"):
            store.put("ns", "k", "w")
        assert store.get("ns", "k") is None  # refused, and nothing changed
    finally:
        other.communicate("")
        store.close()
    again = KvStore(kv)
    assert again.get("ns", "k") == "v"
    again.close()


@pytest.mark.parametrize("workers", ["0", "1"])
def test_a_second_zns_on_the_same_kv_file_is_refused_in_one_line(tmp_path: Path,
                                                                   workers: str) -> None:
    first = ProcessServer(tmp_path, "--workers", workers)
    try:
        second = serve("--workers", workers, "--kv-path", str(first.kv_path))
        assert second.returncode == 1 and not second.stdout, second
        [line] = second.stderr.strip().splitlines()
        assert line == (f"Error: {first.kv_path} is in use by another zns (pid {first.proc.pid}"
                        f"): give each NameServer a file of its own (--kv-path)")
    finally:
        assert first.stop() == 0


@pytest.mark.parametrize("workers", ["0", "1"])
def test_a_second_zns_on_the_same_state_dump_is_refused_in_one_line(tmp_path: Path,
                                                                     workers: str) -> None:
    # Before: each its own --kv-path, one --state-path: the second restored the first's
    # routes, and each renamed its dump over the other's from then on.
    dump = tmp_path / "shared" / "state.dump"
    dump.parent.mkdir()
    first = ProcessServer(tmp_path, "--workers", workers, "--state-path", str(dump))
    try:
        second = serve("--workers", workers, "--kv-path", str(tmp_path / "other-kv.log"),
                       "--state-path", str(dump))
        assert second.returncode == 1 and not second.stdout, second
        [line] = second.stderr.strip().splitlines()
        assert line == (f"Error: {dump} is in use by another zns (pid {first.proc.pid}): "
                        f"give each NameServer a file of its own (--state-path)")
    finally:
        assert first.stop() == 0
    third = ProcessServer(tmp_path, "--workers", workers, "--state-path", str(dump),
                          kv_path=tmp_path / "other-kv.log")  # free once the first is gone
    assert third.stop() == 0


def test_a_state_dump_whose_directory_came_later_is_locked_at_its_first_write(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # As the KV file's: no directory to lock in at start, so the lock comes with the first
    # write, which makes the directory; a write that finds it held fails, said in one line.
    import logging

    from helpers import register_fields, zns1_ok
    from test_warm import drive, writer_for
    from zns.core.service import NameService

    dump = tmp_path / "later" / "state.dump"
    service = NameService(KvStore(None), epoch="e", started_at_ms=0)
    writer = writer_for(service, dump)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_DUMP + WAIT, str(dump)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        dump.parent.mkdir()  # made meanwhile; another zns took the lock in it
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        zns1_ok(service, "register_broker", 2000, id=1, **register_fields())
        with caplog.at_level(logging.ERROR, logger="zns"):
            drive(writer)
        assert (writer.written, writer.failed) == (0, 1) and not dump.exists()
        assert f"{dump} is in use by another zns (pid {holder.pid})" in caplog.text
    finally:
        holder.communicate("")
    drive(writer, now=writer.schedule.interval_ms)  # tried again: free now
    assert (writer.written, writer.failed) == (1, 1) and dump.exists()
    writer.close()


def test_workers_hold_no_copy_of_the_lock(tmp_path: Path) -> None:
    server = ProcessServer(tmp_path, "--workers", "2")
    try:
        wait_for(lambda: server.output().count("serving requests on") == 2)
        pids = [int(p) for p in re.findall(r"loaded the state at seq \d+ \(pid (\d+)\)",
                                           server.output())]
        lock = str(server.kv_path.parent.resolve() / "kv.json.lock")

        def holds(pid: int) -> bool:
            return any(os.readlink(fd) == lock for fd in Path(f"/proc/{pid}/fd").iterdir()
                       if fd.is_symlink())

        assert holds(server.proc.pid) and len(pids) == 2
        assert not any(holds(pid) for pid in pids)
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("link", ["file", "directory"])
@pytest.mark.parametrize("option", ["--kv-path", "--state-path"])
def test_a_second_zns_on_the_same_file_through_another_name_is_refused_in_one_line(
        tmp_path: Path, option: str, link: str) -> None:
    # The lock sat beside the name given: a symlink to the first one's file, in a directory
    # of its own, locked a file of its own, and both wrote one file.
    first_dir, second_dir = tmp_path / "a", tmp_path / "b"
    first_dir.mkdir()
    if link == "directory":
        second_dir.symlink_to(first_dir)
    else:
        second_dir.mkdir()
        for name in ("kv.log", "state.dump"):
            (second_dir / name).symlink_to(first_dir / name)  # neither exists yet
    first = ProcessServer(tmp_path, "--workers", "0", "--state-path",
                          str(first_dir / "state.dump"), kv_path=first_dir / "kv.log")
    try:
        own = {"--kv-path": str(tmp_path / "own-kv.log"),
               "--state-path": str(tmp_path / "own-state.dump")}
        own[option] = str(second_dir / ("kv.log" if option == "--kv-path" else "state.dump"))
        second = serve("--workers", "0", *(word for item in own.items() for word in item))
        assert second.returncode == 1 and not second.stdout, second
        [line] = second.stderr.strip().splitlines()
        held = first_dir / ("kv.log" if option == "--kv-path" else "state.dump")
        assert line == (f"Error: {held} is in use by another zns (pid {first.proc.pid}): give "
                        f"each NameServer a file of its own ({option})")
    finally:
        assert first.stop() == 0


def test_a_symlinked_kv_file_stays_a_symlink_and_its_target_holds_the_writes(
        tmp_path: Path) -> None:
    # The first write and each compaction rename a new file into place: over the name given,
    # they replaced the operator's symlink with a file of their own.
    target, link = tmp_path / "a" / "kv.log", tmp_path / "b" / "kv.log"
    target.parent.mkdir()
    link.parent.mkdir()
    link.symlink_to(target)  # the file does not exist yet: the first write makes it
    store = KvStore(link, compact_min_bytes=256)
    for n in range(40):
        store.put("ns", "k", f"value {n}")
    store.close()
    assert (target.parent / "kv.log.bak").exists()  # compacted: renamed over the file
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert read_kv_file(target) == {"ns": {"k": "value 39"}}
    assert [p.name for p in link.parent.iterdir()] == ["kv.log"]  # the lock is beside target


def test_a_symlinked_state_dump_stays_a_symlink_and_its_target_holds_the_dump(
        tmp_path: Path) -> None:
    from helpers import register_fields, zns1_ok
    from zns.core import warm
    from zns.core.service import NameService

    target, link = tmp_path / "a" / "state.dump", tmp_path / "b" / "state.dump"
    target.parent.mkdir()
    link.parent.mkdir()
    link.symlink_to(target)
    path = state_file.state_path_for(str(link), None)  # as the server reads --state-path
    assert path is not None
    service = NameService(KvStore(None), epoch="e", started_at_ms=0)
    writer, _ = state_file.restored_writer(path, service, now=0, wall_ms=lambda: 0,
                                           wake=lambda: None, clock=lambda: 0)
    for n in range(2):  # made, then replaced
        zns1_ok(service, "register_broker", 2000, id=1,
                **register_fields(broker_name=f"broker-{n}"))
        writer.write_now()
    writer.close()
    assert writer.written == 2
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert warm.decode_dump(target.read_bytes()).table == service.table.dump()
    assert [p.name for p in link.parent.iterdir()] == ["state.dump"]
