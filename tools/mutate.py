"""Mutation testing of zns/core, zns/drivers and zns/cli, one module at a time, with its tests.

    python tools/mutate.py                 # every module in MODULES, in order
    python tools/mutate.py routes service  # some modules (names as in MODULES)
    python tools/mutate.py --list          # the module -> tests map

`make mutate` installs the tool (mutmut 3, the optional extra `mutate`) and runs this under
`nice`. Why per module: the whole suite takes minutes and opens sockets; a mutant of
routes.py only needs the route table's own fast tests. For each module this script makes a
scratch copy of the project in `.mutate/<module>/` (git ignores it), writes a mutmut config
that mutates only that file and selects only its tests, runs mutmut there with one worker,
then prints a table (module, mutants, killed, survived, timeout, score) and rewrites the
module's row in docs/mutation-scores.md. Modules not run keep their previous row.

Under mutation testing ZNS_MUTATION=1 is set: tests/conftest.py then loads the `mutation`
hypothesis profile (few, derandomized examples) and deselects tests that start a server.
A module of zns/drivers or zns/cli (named `drivers/x`, `cli/x`) is about sockets: for it
ZNS_MUTATION_SOCKETS=1 keeps the server tests, and its map picks the in-process ones (a test
that runs `zns` in a subprocess exercises nothing mutmut can attribute to it).

An equivalent mutant (one no test can tell from the original) is listed in EQUIVALENT with a
one-line reason; it is left out of the score's denominator and shown in the scores file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutate"
SCORES = ROOT / "docs" / "mutation-scores.md"

# module (relative to zns/core, without .py) -> pytest arguments selecting its fast tests.
# mutmut further narrows these per mutant to the tests that call the mutated function.
MODULES: dict[str, list[str]] = {
    "routes": ["tests/test_routes.py", "tests/test_routes_properties.py", "tests/test_routes_scale.py",
               "tests/test_limits.py"],
    # routes.py's seams (issue 20): each runs with the route table's tests.
    "liveness": ["tests/test_routes.py", "tests/test_routes_properties.py", "tests/test_routes_scale.py",
                 "tests/test_service.py"],
    "weights": ["tests/test_routes.py", "tests/test_routes_properties.py", "tests/test_limits.py"],
    "revisions": ["tests/test_routes.py", "tests/test_routes_properties.py", "tests/test_routes_scale.py"],
    "service": ["tests/test_service.py", "tests/test_limits.py", "tests/test_kv_service.py",
                "tests/test_remoting_service.py"],
    "route_cache": ["tests/test_route_cache.py", "tests/test_client.py", "tests/test_client_session.py",
                    "-k", "not test_no_nameserver_answers"],
    "client_session": ["tests/test_client_session.py", "tests/test_client.py",
                       "-k", "not test_no_nameserver_answers"],
    "limits": ["tests/test_limits.py", "tests/test_kv_service.py", "tests/test_service.py",
               "tests/test_routes.py"],
    "encoded_routes": ["tests/test_encoded_routes.py", "tests/test_service.py",
                       "tests/test_remoting_service.py"],
    "peer_link": ["tests/test_peers_core.py"],
    "timers": ["tests/test_timers.py"],
    "queues": ["tests/test_queues.py"],
    "kv": ["tests/test_kv_service.py", "tests/test_limits.py", "tests/test_service.py"],
    "broker_session": ["tests/test_broker_session.py"],
    "budget": ["tests/test_budget.py"],
    "errors": ["tests/test_errors.py", "tests/test_service.py", "tests/test_routes.py", "tests/test_broker_session.py",
               "tests/test_remoting_codec.py"],
    "keys": ["tests/test_keys_backoff.py", "tests/test_security.py", "tests/test_service.py"],
    "addresses": ["tests/test_addresses_text.py", "tests/test_client.py", "tests/test_broker_session.py", "tests/test_peers_core.py",
                  "-k", "not test_no_nameserver_answers"],
    "backoff": ["tests/test_keys_backoff.py", "tests/test_broker_session.py", "tests/test_client.py",
                "-k", "not test_no_nameserver_answers"],
    "text": ["tests/test_addresses_text.py", "tests/test_service.py", "tests/test_peers_core.py"],
    "schema": ["tests/test_schema.py", "tests/test_service.py", "tests/test_routes.py", "tests/test_bounds_wire.py"],
    "config": ["tests/test_config_unit.py", "tests/test_config.py", "tests/test_cli_validation.py"],
    # The accounting; the same file's live-server tests are deselected in a core run.
    "subscriptions": ["tests/test_subscriptions.py"],
    "remoting/command": ["tests/test_remoting_codec.py"],
    "remoting/fastjson": ["tests/test_remoting_codec.py", "tests/test_remoting_service.py"],
    "remoting/bodies": ["tests/test_remoting_codec.py", "tests/test_remoting_service.py"],
    "remoting/register": ["tests/test_remoting_codec.py", "tests/test_remoting_service.py"],
    "remoting/handler": ["tests/test_remoting_service.py"],
    "remoting/ext": ["tests/test_remoting_codec.py", "tests/test_remoting_service.py"],
    # Java's hash orders: fixed vectors, then (with a JDK) a few hundred key sets against a JVM.
    "remoting/javaorder": ["tests/test_javaorder.py", "tests/test_remoting_codec.py",
                           "tests/test_encoded_routes.py", "tests/test_remoting_service.py"],
    # Bytes in and out; tests/test_remoting_listener.py runs it live (sockets: not here).
    "remoting/zmtp": ["tests/test_zmtp.py"],
    # The listener's decisions (admission, byte budget, shed, deadlines), with `now` injected.
    "remoting/connections": ["tests/test_remoting_policy.py", "tests/test_zmtp.py"],
    # The KV log's record format, compaction and space rules, without files.
    "kv_log": ["tests/test_kv_policy.py"],
    # The split's log, fences and worker supervision, under random schedules (no processes).
    # The primary also in process against forked workers (tests/test_replication_link.py, about
    # a second): mutmut sees the primary's side there; a replica in a forked child it does not.
    # tests/test_figures.py: the lag `zns status` shows (Primary.unapplied_since).
    "replication": ["tests/test_replication.py", "tests/test_replication_link.py",
                    "tests/test_figures.py"],
    "workers": ["tests/test_workers.py"],
    # A worker's writes at the state process: in flight, answered, timed out (no sockets).
    # tests/test_worker_writes.py runs the same bounds in a live server (not here: processes).
    "forwarding": ["tests/test_forwarding.py"],
    # The state machine: its own log, dump and transfer tests, then the boundary that feeds it
    # every write (the services' tests, the audit trail's changes) and the warm restart's
    # Restore (seconds in all).
    "state": ["tests/test_state.py", "tests/test_state_transfer.py", "tests/test_state_process.py",
              "tests/test_warm.py", "tests/test_service.py", "tests/test_remoting_service.py",
              "tests/test_kv_service.py", "tests/test_limits.py", "tests/test_audit.py"],
    # A state dump's formats: the lists encoded in steps, then the dumps that hold them.
    "state_dump": ["tests/test_state_transfer.py", "tests/test_state.py"],
    # The warm restart's dump, its checks and its schedule, without files.
    "warm": ["tests/test_warm.py", "tests/test_state.py"],
    # The descriptor guard's pause and its retry, without sockets.
    "accept_pause": ["tests/test_accept_pause.py"],
    # The drivers and the CLI: in-process socket tests (seconds each; see the module docstring).
    # The 3,000-write compaction walk (about 45 s) is left out: the other compaction tests kill
    # what it would, at a fraction of the time per surviving mutant.
    "drivers/kv_file": ["tests/test_kv_log.py", "-k", "not test_compaction_keeps_every_entry_and_bounds_the_file"],
    "drivers/metrics": ["tests/test_metrics.py", "-k", "not serve_logs_json_lines"],
    "drivers/event_relay": ["tests/test_relay_watch.py::test_relay_carries_changes_and_a_restart_is_repaired",
                            "tests/test_relay_watch.py::test_async_client_through_a_relay",
                            "tests/test_relay_watch.py::test_relay_replaces_a_wildcard_host_in_the_events_endpoint",
                            "tests/test_relay_watch.py::test_relay_drops_for_a_subscriber_behind_by_its_high_water_mark",
                            "tests/test_relay_watch.py::test_relay_takes_the_first_nameserver_of_a_list_and_two_relays_run_side_by_side",
                            "tests/test_relay_watch.py::test_relay_refusals_say_what_and_keep_their_timeout",
                            "tests/test_relay_watch.py::test_relay_carries_a_subscription_as_long_as_the_nameserver_takes"],
    "drivers/route_client": ["tests/test_client.py", "tests/test_background_failure.py",
                             "tests/test_idle_cpu.py::test_route_client_idles_after_route_watch_events_and_unwatch",
                             "tests/test_relay_watch.py::test_relay_carries_changes_and_a_restart_is_repaired",
                             "-k", "not zns_watch and not zns_broker"],
    "drivers/broker_agent": ["tests/test_broker_agent.py", "tests/test_background_failure.py",
                             "tests/test_idle_cpu.py::test_broker_agent_idles_after_topics_change",
                             "-k", "not zns_watch and not zns_broker"],
    "drivers/server": ["tests/test_server_wiring.py", "tests/test_server.py",
                       "tests/test_remoting_listener.py::test_closing_the_server_closes_the_listener_and_its_connections",
                       "tests/test_remoting_listener.py::test_namesrv_config_shows_booleans_as_java_does",
                       "tests/test_remoting_listener.py::test_a_star_endpoint_listens_on_every_interface",
                       "-k", "not stall_of_the_process"],
    # The 15 MB slow-reader test outlasts its budget under mutmut's trampolines: left out.
    "drivers/remoting_listener": ["tests/test_remoting_listener.py", "tests/test_remoting_buffers.py",
                                  "-k", "not cli_ and not slow_reader"],
    # The driver against a fake peer with `now` injected: seconds. tests/test_peers.py runs the
    # same code between real servers, waiting out real expiries (minutes per mutant under load).
    "drivers/peers": ["tests/test_peer_links.py",
                      "tests/test_peers.py::test_a_bad_peer_endpoint_stops_start_up_with_a_clear_error"],
    # Key files, policy, reload and ZAP's decision without a server (seconds); then live CURVE.
    "drivers/security": ["tests/test_security_keys.py", "tests/test_security.py",
                         "-k", "not sighup and not tools_take"],
    "drivers/loop": ["tests/test_loop.py"],
    "drivers/heap": ["tests/test_heap.py", "tests/test_server_wiring.py"],
    "drivers/logs": ["tests/test_logs.py",
                     "tests/test_server_hardening.py::test_repeated_warnings_are_rate_limited_with_a_count_of_what_was_held_back"],
    # An XPUB and SUBs in process, handle() called by the test (seconds); tests/test_subscriptions.py
    # runs the same code inside a server, a subscriber of 2,000 KiB subscriptions at a time.
    "drivers/subscribers": ["tests/test_subscribers.py"],
    # The guard in process with `now` passed in, its monitor fed by the test, a real forked
    # shedding child (seconds). tests/test_server_hardening.py runs a server out of descriptors
    # in a subprocess, which mutmut cannot see.
    "drivers/descriptors": ["tests/test_descriptors.py", "tests/test_server_wiring.py"],
    # The router against DEALERs on inproc, a fake service and clock (seconds); then a Server
    # made and closed. tests/test_server_hardening.py runs the same bounds against live servers.
    "drivers/request_router": ["tests/test_request_router.py", "tests/test_server_wiring.py"],
    # One-shot calls against fake NameServers in process (seconds).
    "drivers/requests": ["tests/test_requests.py"],
    # The helpers in process (seconds); then the peer links, which open and read their sockets.
    "drivers/sockets": ["tests/test_sockets.py", "tests/test_peer_links.py"],
    # The driver half in process with a fake clock and session hooks (seconds); then the threaded
    # client against in-process servers (the 30 s no-answer case left out: slow, and the
    # unit file covers its message).
    "drivers/client_base": ["tests/test_client_base.py", "tests/test_client.py",
                            "-k", "not zns_watch and not zns_broker and not test_no_nameserver_answers"],
    "drivers/async_client": ["tests/test_async_client.py", "tests/test_background_failure.py"],
    "drivers/io_errors": ["tests/test_io_errors.py"],
    # The supervisor's decisions with the fork and the clock faked, and _fork itself (seconds);
    # then real children that abort. A forked child runs the mutant too, but mutmut records
    # no test for a function only a child calls: those are called in process as well.
    "drivers/supervisor": ["tests/test_supervisor_unit.py", "tests/test_supervisor.py"],
    "cli/options": ["tests/test_config.py", "tests/test_cli_validation.py", "tests/test_cli_options.py"],
    "cli/tools": ["tests/test_cli_tools.py", "tests/test_cli_output.py",
                  "tests/test_background_failure.py::test_zns_broker_exits_with_one_line_when_its_agent_thread_dies",
                  "-k", "not broker_command_registers"],
    "cli/watch": ["tests/test_cli_watch.py", "tests/test_cli_tools.py::test_watch_prints_events",
                  "tests/test_background_failure.py::test_zns_watch_exits_with_one_line_when_its_client_thread_dies",
                  "tests/test_relay_watch.py::test_watch_starts_with_every_topics_route_each_line_stamped",
                  "tests/test_relay_watch.py::test_watch_says_gone_for_a_topic_deleted_before_it_was_followed_and_notes_a_new_epoch"],
    # A click command is not mutated (mutmut cannot wrap a decorated function): `serve` and
    # `relay` only name their options and call _serve / _relay, whose tests fake the driver.
    "cli/serve": ["tests/test_cli_serve_unit.py", "tests/test_cli_serve.py",
                  "-k", "not real_server and not signals and not loopback_bind and not one_log_line "
                        "and not in_use"],
    "cli/relay": ["tests/test_cli_relay.py"],
    "cli/params": ["tests/test_cli_validation.py", "tests/test_cli_commands.py"],
    "cli/app": ["tests/test_cli_serve.py", "tests/test_cli_tools.py", "tests/test_cli_commands.py",
                "-k", "not real_server and not signals and not loopback_bind and not one_log_line and not in_use and not broker_command_registers"],
}


def source(module: str) -> str:
    """The file a module name stands for: `drivers/x` and `cli/x` under zns/, the rest under zns/core/."""
    return f"zns/{module}.py" if module.startswith(("drivers/", "cli/")) else f"zns/core/{module}.py"

# mutmut mutant name -> why no test can kill it (the code behaves the same either way).
EQUIVALENT: dict[str, str] = {
    "zns.drivers.metrics.xǁMetricsServerǁclose__mutmut_1":
        "join(None) for join(5): serve_forever returns at once after shutdown(); the bound is for a hang",
    "zns.drivers.metrics.xǁMetricsServerǁclose__mutmut_2": "join(6) for join(5): as close__mutmut_1",
    "zns.drivers.metrics.xǁMetricsServerǁ_health__mutmut_10":
        "'content-type' for 'Content-Type': HTTP header names are case-insensitive (RFC 9110 5.1)",
    "zns.drivers.metrics.xǁMetricsServerǁ_health__mutmut_11": "'CONTENT-TYPE': as _health__mutmut_10",
    "zns.drivers.metrics.xǁMetricsServerǁ_health__mutmut_24": "the 503's header in lower case: as _health__mutmut_10",
    "zns.drivers.metrics.xǁMetricsServerǁ_health__mutmut_25": "the 503's header in upper case: as _health__mutmut_10",
    "zns.drivers.broker_agent.xǁBrokerAgentǁclose__mutmut_5":
        "join(None) for join(timeout + 2): the thread ends by the session's own close deadline; the bound is for a hang",
    "zns.drivers.broker_agent.xǁBrokerAgentǁclose__mutmut_7": "join(timeout + 3): as close__mutmut_5",
    "zns.drivers.broker_agent.xǁBrokerAgentǁ_run__mutmut_5": "closing = None for False: only ever read as a truth value",
    "zns.drivers.broker_agent.xǁBrokerAgentǁ_run__mutmut_12":
        "closing = None for True: close() is asked again each turn, and BrokerSession.close ignores a second call",
    "zns.drivers.broker_agent.xǁBrokerAgentǁ_run__mutmut_20": "_changed = None for False: only ever read as a truth value",
    "zns.drivers.broker_agent.xǁBrokerAgentǁ_run__mutmut_39":
        "`return` for `break` out of the loop: the `finally` that drops the sockets runs either way",
    "zns.drivers.broker_agent.xǁBrokerAgentǁ_run__mutmut_24":
        "reading every socket each turn, not only the ready ones: recv_all never blocks, so a socket "
        "with nothing to read yields nothing (a cost, not a behaviour)",
    "zns.drivers.server.xǁServerǁ_listen_remoting__mutmut_63":
        "log.warning(narrowed) for log.warning('%s', narrowed): the narrowing text is fixed and holds no '%'",
    "zns.drivers.server.xǁServerǁ__init____mutmut_90":
        "loop = '' before it is made: read only by run() and last_pass_ms, after __init__ made it "
        "(a refused start raises, and close() does not read it)",
    "zns.drivers.server.xǁServerǁ_send_event__mutmut_13":
        "the body's send without DONTWAIT (flags 0): an XPUB never blocks on send (past SNDHWM it drops, no XPUB_NODROP)",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁ_where_zns1_is__mutmut_3":
        "properties.get('router', None) for '': `if not router` reads None and '' alike",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁ_where_zns1_is__mutmut_5":
        "as _where_zns1_is__mutmut_3 (no default: None)",
    # `_close(entry, now)` does not read `now`; _shed and _flush_and_close pass theirs only to it.
    **{f"zns.drivers.remoting_listener.xǁRemotingListenerǁ{name}":
       "now=None handed to _close (directly or through _shed/_flush_and_close), which does not read it"
       for name in ("run__mutmut_43", "_read__mutmut_24", "_read__mutmut_29", "_read__mutmut_69", "_read__mutmut_101", "_answer__mutmut_36", "_answer__mutmut_46", "_write__mutmut_14", "_flush_and_close__mutmut_3", "_close_idle__mutmut_33", "_shed__mutmut_28", "_close_late__mutmut_41")},
    "zns.drivers.broker_agent.xǁBrokerAgentǁ_run__mutmut_13": "closing = False once closing: as _run__mutmut_12",
    "zns.drivers.broker_agent.xǁBrokerAgentǁ_carry_out__mutmut_16":
        "send without DONTWAIT: a session has one request in flight and the DEALER queues to a peer "
        "still connecting (ZMQ_IMMEDIATE off), so a send never meets the high-water mark and never blocks",
    "zns.drivers.broker_agent.xǁBrokerAgentǁ_drop_socket__mutmut_3":
        "close(1) for close(0): a dropped socket's unsent request may leave within 1 ms; the session "
        "already counts it lost, and a late reply's id matches nothing",
    "zns.drivers.broker_agent.xǁBrokerAgentǁ__init____mutmut_38": "DataVersion without counter=0: 0 is its default",
    "zns.drivers.broker_agent.xǁBrokerAgentǁ__init____mutmut_60": "_stopping = None for False: only ever read as a truth value",
    "zns.drivers.broker_agent.xǁBrokerAgentǁ__init____mutmut_63": "_changed = None for False: only ever read as a truth value",
    "zns.drivers.broker_agent.xǁBrokerAgentǁ__init____mutmut_65":
        "initial _close_timeout: read only once stopping, and close() sets it before it stops the loop",
    "zns.drivers.broker_agent.xǁBrokerAgentǁ__init____mutmut_66": "as __init____mutmut_65",
    "zns.drivers.broker_agent.xǁBrokerAgentǁ_run__mutmut_59":
        "a deadline already due polls for 1 ms instead of 0: the same turn, 1 ms later (a latency)",
    "zns.drivers.server.xǁServerǁ__init____mutmut_23": "_stopping = None for False: only ever read as a truth value",
    "zns.drivers.server.xǁServerǁ__init____mutmut_25": "_reload_keys = None for False: only ever read as a truth value",
    "zns.drivers.server.xǁServerǁ__init____mutmut_169": "Loop(poll=None): the loop makes the same PollSet() itself",
    "zns.drivers.server.xǁServerǁ__init____mutmut_174": "as __init____mutmut_169 (poll left out)",
    "zns.drivers.server.x_is_loopback__mutmut_8":
        "strip(None) for strip('[]'): urlsplit's hostname has no brackets (nor spaces) to strip",
    "zns.drivers.server.x_is_loopback__mutmut_10":
        "`or 'XXXX'` for `or ''` when a tcp endpoint has no host: neither is a loopback name",
    "zns.drivers.server.xǁServerǁclose__mutmut_4":
        "router.close(linger=None): the socket's own LINGER is the same 500 ms (RequestRouter.configure)",
    "zns.drivers.server.xǁServerǁclose__mutmut_6": "pub.close(linger=None): as close__mutmut_4 (LINGER 500 set)",
    "zns.drivers.server.xǁServerǁclose__mutmut_5":
        "router.close(linger=501): unsent replies may take 1 ms longer to leave at shutdown",
    "zns.drivers.server.xǁServerǁclose__mutmut_7": "pub.close(linger=501): as close__mutmut_5 (unsent events)",
    "zns.drivers.server.xǁServerǁclose__mutmut_11":
        "own context destroyed with linger=None: every socket made in it (router, pub, peers, ZAP) "
        "is closed before, so the linger applies to none",
    "zns.drivers.server.xǁServerǁclose__mutmut_12": "as close__mutmut_11 (linger=1)",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁrun__mutmut_17":
        "a read tried when epoll reports the connection only writable: recv would block and "
        "_read returns at once (a cost); readable data sets EPOLLIN anyway",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁrun__mutmut_18": "flags | (...) is always true: as run__mutmut_17 (a read that would block)",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁrun__mutmut_19":
        "EPOLLHUP & EPOLLERR is 0, so only EPOLLIN leads to a read: Linux's tcp_poll sets EPOLLIN "
        "with every EPOLLHUP (a reset or timed-out connection is shut down both ways, readable at "
        "EOF), and sets EPOLLERR only then (no IP_RECVERR, no error queue)",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁrun__mutmut_21":
        "a connection not being read (requests waiting, or replies at the mark) read anyway when "
        "epoll reports it: without EPOLLIN in its mask that is EPOLLHUP/EPOLLERR, a reset, and the "
        "read fails as the write would, closing it with the same 'failed' line",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁrun__mutmut_42":
        "_shed at held == max_buffer_bytes: it returns at once while held <= the budget",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁ_read__mutmut_100": "as run__mutmut_42 (_shed at the budget exactly returns at once)",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁ_read__mutmut_86":
        "pending_bytes = for +=: a connection is read only while no decoded request waits "
        "(interest has EPOLLIN only then), so pending_bytes is 0 before a read adds to it",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁ_answer_backlog__mutmut_4": "queued = None for False: only ever read as a truth value",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁ_close_idle__mutmut_30":
        "timeout / 1000 for // 1000 in a %d: %d truncates the (positive) float as // does",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁ_close_late__mutmut_37":
        "(now - started) / 1000 for // 1000 in a %d: as _close_idle__mutmut_30",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁ__init____mutmut_4":
        "the default Outbox's send None: a listener made without an outbox is never given to a "
        "loop, so nothing runs that outbox and its send is never called",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁ__init____mutmut_5": "as __init____mutmut_4 (a send returning 0, never called)",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁ_accept__mutmut_42": "TCP_NODELAY 2 for 1: Linux reads the option as a truth value",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁ__init____mutmut_66":
        "the listening socket registered with epoll's default mask (IN|PRI|OUT): a listening TCP "
        "socket reports only EPOLLIN (tcp_poll of a LISTEN socket)",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁ__init____mutmut_75": "connection ids from 2, not 1: they only need to be distinct",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁ__init____mutmut_79":
        "_now = None before the first turn: only what run() calls reads it, after run() set it",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁ_read__mutmut_34":
        "fresh = None for False: only ever read as a truth value",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁ_read__mutmut_38":
        "looks_like_zmtp given 17 bytes for 16: it reads only the first",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁ_write__mutmut_3":
        "sent = None for 0 when the socket would block: only ever read as a truth value",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁrun__mutmut_8":
        "epoll.poll without EVENTS_PER_TURN: more events listed, but the turn still stops at the "
        "end of its slice and the rest stays ready (level-triggered)",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁrun__mutmut_9":
        "epoll.poll(1) for poll(0): a turn with nothing ready waits 1 ms (a latency)",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁrun__mutmut_12":
        "`break` for `continue` after accepting: the events not looked at stay ready "
        "(level-triggered) and the loop runs the listener again at once (a latency)",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁrun__mutmut_16": "as run__mutmut_12 (after a closed entry)",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁ_queue__mutmut_2":
        "queued = None for True: a connection may sit twice in the backlog, and its second turn "
        "finds nothing more to answer (replies, their order and bounds are the same; a cost)",
    "zns.drivers.broker_agent.xǁBrokerAgentǁ__init____mutmut_64":
        "_changed = True at first: it asks only for the registration start() already sent, whose "
        "reply sets the next one a period later (the version is current)",
    "zns.drivers.broker_agent.xǁBrokerAgentǁ_run__mutmut_54":
        "`if wakes or True`: a started session has a deadline until it is done, and once all are "
        "done the loop has ended, so wakes is never empty there",
    "zns.drivers.server.xǁServerǁrun__mutmut_23":
        "'%d' of descriptor_limit / 2 - 32 for // 2: '%d' truncates, the same integer for any limit "
        "above 64 (raise_descriptor_limit asks for thousands)",
    "zns.drivers.server.xǁServerǁ_install_signal_handlers__mutmut_2":
        "an undo returning 0 for None off the main thread: run() ignores what the undos return",
    "zns.drivers.server.xǁServerǁ_install_signal_handlers__mutmut_3": "as _install_signal_handlers__mutmut_2",
    "zns.drivers.server.xǁServerǁ_bind__mutmut_1":
        "events=1 (EVENT_CONNECTED) by default: a bound socket never connects, and a bind without "
        "on_event reads no event",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁ_accept__mutmut_11":
        "the host taken as address[0] whatever the address: a TCP listener's peer address is always a tuple",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁ_accept__mutmut_13": "as _accept__mutmut_11 (the other branch is never taken)",
    "zns.drivers.server.x_is_loopback__mutmut_11":
        "strip('XX[]XX') for strip('[]'): urlsplit's hostname is lower case, so it never ends in 'X'",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁ_close__mutmut_7":
        "a closed connection's held = None for 0: never read again (it has left `connections`, "
        "and the backlog skips it)",
    "zns.drivers.remoting_listener.xǁRemotingListenerǁ_close__mutmut_8": "as _close__mutmut_7 (held = 1)",
    "zns.drivers.peers.xǁPeerLinksǁ_receive__mutmut_4":
        "no max_bytes on the DEALER: the socket's MAXMSGSIZE (the same bound) refuses a frame over it, "
        "and max_frames=1 drops any longer message",
    "zns.drivers.peers.xǁPeerLinksǁ_receive__mutmut_7": "as _receive__mutmut_4",
    "zns.drivers.peers.xǁPeerLinksǁhandle__mutmut_3": "as broker_agent _run__mutmut_24 (recv_all never blocks)",
    "zns.drivers.peers.xǁPeerLinksǁrun__mutmut_11":
        "carry_out's now reaches only a failed FollowEvents, which only a reply (handle) produces, never a timer",
    "zns.drivers.peers.xǁPeerLinksǁ_do__mutmut_50":
        "`break` for `continue`: every action list holds one action (on_timer: AskStatus, on_reply: FollowEvents)",
    "zns.drivers.peers.xǁPeerLinksǁ_replace__mutmut_8":
        "close(linger=None): the socket's own LINGER is 0 (open_socket)",
    "zns.drivers.peers.xǁPeerLinksǁ_replace__mutmut_9":
        "close(linger=1): closing may wait 1 ms for unsent messages; a dropped status or SUB has none that matter",
    "zns.drivers.peers.x__checked__mutmut_9":
        "the probe closed with the context's LINGER (-1) for 0: it only connects and never sends, so "
        "nothing is left to linger on",
    "zns.drivers.peers.x__checked__mutmut_10": "the probe closed with linger=1: as _checked__mutmut_9",
    "zns.drivers.peers.xǁPeerLinksǁ_do__mutmut_22":
        "the status sent without DONTWAIT: a fresh DEALER connected without ZMQ_IMMEDIATE (open_socket) "
        "has its pipe at once, so its one message is queued and the send never blocks",
    "zns.drivers.peers.xǁPeerLinksǁcarry_out__mutmut_2": "as run__mutmut_11, one call further in",
    "zns.drivers.peers.xǁPeerLinksǁhandle__mutmut_30": "as handle__mutmut_3, for the SUB",
    "zns.drivers.peers.xǁPeerLinksǁrun__mutmut_6":
        "on_timer for a link not due: it tests the same conditions as next_deadline, so does nothing; and "
        "a PeerLink's next_deadline is never None (it is asking, or its silence clock runs)",
    "zns.drivers.kv_file.x__valid_record_after__mutmut_25":
        "searching from at + 2: the marker b'\\xffKV1' cannot start one byte into itself",
    "zns.drivers.kv_file.x__unlink_quietly__mutmut_1":
        "missing_ok=None: a missing file then raises FileNotFoundError, an OSError the function swallows",
    "zns.drivers.kv_file.x__unlink_quietly__mutmut_2": "as x__unlink_quietly__mutmut_1 (missing_ok=False)",
    "zns.drivers.kv_file.xǁKvStoreǁ_cut__mutmut_8":
        "log.error(msg) for log.error('%s', msg): without arguments logging does not format, same text",
    "zns.drivers.kv_file.xǁKvStoreǁ_start_compaction__mutmut_55": "as _cut__mutmut_8",
    "zns.drivers.kv_file.xǁKvStoreǁ_start_compaction__mutmut_1": "`or` in an assert that always holds there",
    "zns.drivers.kv_file.x__parse_at__mutmut_2":
        "refusing exactly 12 bytes left: a record needs a payload of length > 0 after its 12-byte "
        "header, so the length check refuses those 12 bytes anyway",
    "zns.drivers.kv_file.x__parse_at__mutmut_15":
        "refusing length 1: one byte is never a msgpack array of three strings, so decoding "
        "refuses it anyway (None either way)",
    "zns.drivers.kv_file.x__parse_at__mutmut_16":
        "accepting length 0: an empty payload fails decoding (DecodeError), so None either way",
    "zns.drivers.kv_file.x__replay_file__mutmut_27":
        "(True, 0) for (False, 0) from a continuation: its only caller (_open) ignores what "
        "replaying `<path>.next` returns",
    "zns.drivers.kv_file.x__replay_file__mutmut_28": "as _replay_file__mutmut_27 ((False, 1))",
    "zns.drivers.kv_file.x__replay_file__mutmut_35":
        "`pos <= len(raw)`: at pos == len(raw) _parse_at finds no record and nothing follows, so "
        "the loop returns (False, pos) as its end does",
    "zns.drivers.kv_file.x_encode_record__mutmut_9":
        "struct '<i' for '<I': the same four bytes for every length below 2**31; payloads are "
        "bounded far below (values <= 64 KiB)",
    "zns.drivers.kv_file.x_read_kv_file__mutmut_4": "continuation=None for False: only ever read as a truth value",
    "zns.drivers.kv_file.xǁKvStoreǁ_open__mutmut_26": "as read_kv_file__mutmut_4",
    "zns.drivers.kv_file.xǁKvStoreǁ__init____mutmut_18":
        "_broken = None for '': only ever read as a truth value (`if self._broken`)",
    "zns.drivers.kv_file.xǁKvStoreǁput__mutmut_35":
        "record_size None: _account falls back to len(encode_record(...)) of the same entry, "
        "which is len(record)",
    "zns.drivers.kv_file.xǁKvStoreǁput__mutmut_40": "as put__mutmut_35 (record_size left out: 0)",
    "zns.drivers.kv_file.xǁ_Compactionǁtake__mutmut_14":
        "`key_index == 0 or not keys`: the cursor's key list is empty exactly when its key index "
        "is 0 (a list is kept only after at least one of its keys was taken)",
    "zns.drivers.server.xǁ_Controlǁrun__mutmut_3": "_reload_keys = None for False: only ever read as a truth value",
    "zns.drivers.security.xǁSecurityǁcallback__mutmut_4": "codec name 'ASCII' for 'ascii': Python's codec names ignore case",
    "zns.drivers.security.x__key_text__mutmut_6": "codec name 'ASCII' for 'ascii': as callback__mutmut_4",
    "zns.drivers.security.x_read_certificate__mutmut_13": "codec name 'UTF-8' for 'utf-8': as callback__mutmut_4",
    "zns.drivers.security.x_write_keypair__mutmut_38": "as read_certificate__mutmut_13",
    "zns.drivers.security.x_read_certificate__mutmut_8":
        "section = None for '' before the first section: only ever compared with 'metadata'",
    "zns.drivers.security.x_read_certificate__mutmut_9": "section = 'XXXX': as read_certificate__mutmut_8",
    "zns.drivers.security.x_write_keypair__mutmut_17":
        "the public file read in the locale's encoding: zmq.auth writes it ASCII only (banner, date, "
        "z85 key), which every locale reads alike",
    "zns.drivers.security.x_write_keypair__mutmut_20": "as write_keypair__mutmut_17",
    "zns.drivers.security.x_write_keypair__mutmut_32":
        "every 'metadata\\n' replaced, not the first: the public file zmq.auth writes holds it once",
    "zns.drivers.security.x_write_keypair__mutmut_40": "as write_keypair__mutmut_32 (2 for 1)",
    "zns.drivers.route_client.xǁRouteClientǁclose__mutmut_3":
        "join(None) for join(5): the thread ends at once once stopping; the bound is for a hang",
    "zns.drivers.route_client.xǁRouteClientǁclose__mutmut_4": "join(6) for join(5): as close__mutmut_3",
    "zns.drivers.route_client.xǁRouteClientǁ__init____mutmut_37":
        "_stopping = None for False: the flag is only ever read as a truth value",
    "zns.drivers.event_relay.xǁRelayǁ__init____mutmut_31":
        "LINGER 1 ms for 0: closing may wait 1 ms for unsent messages, nothing a subscriber can tell",
    "zns.drivers.event_relay.xǁRelayǁ_run__mutmut_8": "close(None) for close(0): the socket's own LINGER is 0",
    "zns.drivers.event_relay.xǁRelayǁ_run__mutmut_9": "close(1) for close(0): as __init____mutmut_31",
    "zns.drivers.event_relay.xǁRelayǁclose__mutmut_6": "as _run__mutmut_8",
    "zns.drivers.event_relay.xǁRelayǁclose__mutmut_7": "as _run__mutmut_9",
    "zns.drivers.event_relay.xǁRelayǁclose__mutmut_4":
        "join(None) for join(5): the proxy ends at once on TERMINATE; the bound is for a libzmq hang",
    "zns.drivers.event_relay.xǁRelayǁclose__mutmut_5": "join(6) for join(5): as close__mutmut_4",
    "zns.drivers.event_relay.xǁRelayǁ_close_sockets__mutmut_1":
        "close(None) for close(0) when __init__ fails: every socket's own LINGER is already 0 (set before the try)",
    "zns.drivers.event_relay.xǁRelayǁ_close_sockets__mutmut_2":
        "close(1) for close(0) when __init__ fails: no socket holds a message yet (no subscriber, no steer sent)",
    "zns.drivers.logs.x_configure_logging__mutmut_1":
        "default log format 'XXtextXX' for 'text': every format but 'json' is the plain one",
    "zns.drivers.logs.x_configure_logging__mutmut_2": "as configure_logging__mutmut_1 ('TEXT')",
    "zns.drivers.logs.x_configure_logging__mutmut_4":
        "StreamHandler(None) for StreamHandler(sys.stderr): logging's own default stream is sys.stderr",
    "zns.drivers.logs.xǁJsonFormatterǁformat__mutmut_36": "ensure_ascii=None for False: read only as a truth value",
    "zns.drivers.logs.xǁRepeatFilterǁfilter__mutmut_5":
        "getattr default None for False: both falsy, read only as a truth value",
    "zns.drivers.sockets.x_open_socket__mutmut_26":
        "close(linger=None) of a socket whose connect failed: it never had a peer nor a message to wait for",
    "zns.drivers.sockets.x_open_socket__mutmut_27": "as open_socket__mutmut_26 (linger=1)",
    "zns.drivers.sockets.x_recv_all__mutmut_8":
        "recv(copy=None) for copy=False: pyzmq reads copy only as a truth value (a Frame either way)",
    "zns.drivers.sockets.x_recv_all__mutmut_15": "as recv_all__mutmut_8",
    "zns.drivers.sockets.x_recv_all__mutmut_25":
        "frames = None for []: both falsy, and frames is then only read as a truth value",
    "zns.drivers.sockets.xǁWakerǁdrain_if_woken__mutmut_4":
        "reading 4097 bytes at a time for 4096: the loop reads until nothing is left either way",
    "zns.drivers.sockets.xǁWakerǁwake__mutmut_2":
        "a 5-byte wake-up for 1 byte: any byte wakes the poller, and drain reads them all",
    "zns.drivers.requests.x_call__mutmut_17":
        "waiting timeout x 1.001: a millisecond more per second waited, nothing a caller can tell",
    "zns.drivers.requests.x_call_all__mutmut_32": "as call__mutmut_17",
    "zns.drivers.requests.x_call__mutmut_25":
        "close(None) for close(0): the socket's own LINGER is 0 (open_socket)",
    "zns.drivers.requests.x_call__mutmut_26":
        "close(1) for close(0): closing may wait 1 ms for an unsent request, nothing a caller can tell",
    "zns.drivers.requests.x_call_all__mutmut_48": "as call__mutmut_25",
    "zns.drivers.requests.x_call_all__mutmut_49": "as call__mutmut_26",
    "zns.drivers.requests.x_call_any__mutmut_39": "as call__mutmut_25",
    "zns.drivers.requests.x_call_any__mutmut_40": "as call__mutmut_26",
    "zns.drivers.requests.x_call_all__mutmut_23":
        "`<=` for `<`: once every NameServer answered, every socket is unregistered, and a "
        "poller with none returns at once: the loop ends the same",
    "zns.drivers.subscribers.xǁSubscribersǁ__init____mutmut_10":
        "XPUB_VERBOSE 2 for 1: libzmq reads the option as a truth value",
    "zns.drivers.subscribers.xǁSubscribersǁ__init____mutmut_15": "as __init____mutmut_10 (XPUB_VERBOSER)",
    "zns.drivers.subscribers.xǁSubscribersǁhandle__mutmut_14":
        "peer -2 for -1 when libzmq names no descriptor: any negative one is skipped",
    "zns.drivers.subscribers.xǁSubscribersǁhandle__mutmut_5":
        "recv(copy=None) for copy=False: pyzmq reads copy only as a truth value (a Frame either way)",
    "zns.drivers.loop.xǁLoopǁ_run_one__mutmut_1": "more = None for False (a source that raised): only ever read as a truth value",
    "zns.drivers.request_router.xǁRequestRouterǁ__init____mutmut_12": "_draining = None for False: only ever read as a truth value",
    "zns.drivers.request_router.xǁRequestRouterǁ_drain__mutmut_15":
        "count -= 1: -n % 1024 == 0 exactly when n % 1024 == 0, so the clock is read at the same frames",
    # run's numbers as of bb50c43 (the hand-back after a request that made events).
    "zns.drivers.request_router.xǁRequestRouterǁrun__mutmut_100": "served -= 1: as _drain__mutmut_15 (every 16 requests either way)",
    "zns.drivers.request_router.xǁRequestRouterǁ_drain__mutmut_8":
        "recv(copy=None) for copy=False: pyzmq reads copy only as a truth value (a Frame either way)",
    "zns.drivers.request_router.xǁRequestRouterǁrun__mutmut_17": "as _drain__mutmut_8",
    "zns.drivers.request_router.xǁRequestRouterǁrun__mutmut_43": "as _drain__mutmut_8",
    "zns.drivers.request_router.xǁRequestRouterǁconfigure__mutmut_5": "ROUTER_MANDATORY 2 for 1: libzmq reads the option as a truth value",
    "zns.drivers.request_router.xǁRequestRouterǁconfigure__mutmut_10": "ROUTER_HANDOVER 2 for 1: as configure__mutmut_5",
    "zns.drivers.request_router.xǁRequestRouterǁrun__mutmut_40":
        "envelope = None for [] after a drop: both falsy, and envelope is then only read as a truth value",
    "zns.drivers.request_router.xǁRequestRouterǁrun__mutmut_55": "as run__mutmut_40",
    "zns.drivers.request_router.xǁRequestRouterǁrun__mutmut_82":
        "_send(copy=None) for copy=False: a frame sent copied or not, the same bytes leave",
    "zns.drivers.request_router.xǁRequestRouterǁrun__mutmut_86": "as run__mutmut_82 (copy left at its default, True)",
    "zns.drivers.request_router.xǁRequestRouterǁrun__mutmut_87": "as run__mutmut_82 (copy=True)",
    "zns.drivers.request_router.xǁRequestRouterǁrun__mutmut_93":
        "the reply's last frame sent without DONTWAIT: libzmq checks a peer's high-water mark at "
        "a message's first frame (sent with DONTWAIT); once that is taken the rest of the message is too",
    "zns.drivers.descriptors.x__close_all_but__mutmut_15":
        "closing up to the hard limit, not the soft one: raise_descriptor_limit set the soft "
        "limit to the hard one at start, and no descriptor above the soft limit can be open",
    "zns.drivers.descriptors.x__set_drop_filter__mutmut_13": "SO_DETACH_FILTER's value 1 for 0: Linux ignores it",
    "zns.drivers.descriptors.x_listen_tcp__mutmut_7":
        "'0.0.0.0' left to gethostbyname: it resolves to itself, the same family and address",
    "zns.drivers.descriptors.xǁDescriptorGuardǁ__init____mutmut_7":
        "initial _retry_at None: read only while paused, and pausing sets it first",
    "zns.drivers.descriptors.xǁDescriptorGuardǁ__init____mutmut_8": "as DescriptorGuard.__init____mutmut_7 (1)",
    "zns.drivers.descriptors.xǁDescriptorGuardǁ_shed__mutmut_29":
        "the count packed signed ('q') for unsigned: the same 8 bytes for any count below 2**63",
    "zns.drivers.descriptors.xǁDescriptorGuardǁ_shed__mutmut_68": "as _shed__mutmut_29 (unpacked signed)",
    "zns.drivers.descriptors.xǁDescriptorGuardǁ_shed__mutmut_62":
        "polling the child every 1 s, not 1 ms: how soon the count is read, not the count",
    "zns.drivers.descriptors.xǁDescriptorGuardǁ_shed__mutmut_7":
        "every warning ignored around the fork, not only DeprecationWarning: the fork raises no other",
    "zns.drivers.descriptors.xǁDescriptorGuardǁ_shed__mutmut_9": "as _shed__mutmut_7",
    "zns.drivers.descriptors.xǁDescriptorGuardǁ_waiting__mutmut_6":
        "poll's default mask (POLLIN, POLLPRI, POLLOUT): a listening socket is never writable or urgent",
    "zns.drivers.descriptors.xǁDescriptorGuardǁ_waiting__mutmut_8": "poll(1) for poll(0): a millisecond's wait, the same sockets",
    "zns.drivers.descriptors.xǁDescriptorGuardǁbind__mutmut_1":
        "default extra monitor events 1 (CONNECTED) for 0: a bound socket never connects",
    "zns.drivers.descriptors.xǁListenerǁ__init____mutmut_1": "as DescriptorGuard.bind__mutmut_1",
    "zns.drivers.descriptors.xǁDescriptorGuardǁhandle__mutmut_3": "out_of_descriptors = None for False: only ever read as a truth value",
    "zns.drivers.descriptors.xǁListenerǁ__init____mutmut_26": "port 'XX0XX' not taken for any: int('0') is 0, any port too",
    "zns.drivers.descriptors.xǁListenerǁ__init____mutmut_7":
        "rpartition('://') for partition: an endpoint holds '://' once",
    "zns.drivers.descriptors.xǁListenerǁ__init____mutmut_35":
        "the host shown to libzmq's bind without brackets: libzmq parses an IPv6 address either way, "
        "and the endpoint kept is libzmq's own LAST_ENDPOINT",
    "zns.drivers.descriptors.xǁListenerǁ__init____mutmut_36": "as Listener.__init____mutmut_35 (brackets around an IPv4 address, also accepted)",
    "zns.drivers.descriptors.xǁListenerǁ__init____mutmut_37": "as Listener.__init____mutmut_35",
    "zns.drivers.descriptors.xǁListenerǁ__init____mutmut_38": "as Listener.__init____mutmut_35",
    "zns.drivers.descriptors.xǁListenerǁclose__mutmut_1": "the monitor's close(linger=None) for 0: an inproc PAIR with nothing unsent",
    "zns.drivers.descriptors.xǁListenerǁclose__mutmut_2": "as Listener.close__mutmut_1 (linger=1)",
    "zns.drivers.supervisor.x_supervise__mutmut_3":
        "pid = None for 0 before the first child: only ever read as a truth value",
    "zns.drivers.descriptors.xǁListenerǁ__init____mutmut_45":
        "every monitor event for ACCEPT_FAILED and the ones asked for: the one callback "
        "(Subscribers.on_monitor_event) acts on ACCEPTED and DISCONNECTED only",
    "zns.drivers.async_client.xǁ_Latestǁ__init____mutmut_1":
        "initial value None for _EMPTY: the value is read only after put() set the event, and "
        "put() writes it first",
    "zns.drivers.async_client.xǁ_Latestǁget__mutmut_3":
        "as _Latest.__init____mutmut_1 (the value after a get: the event is cleared with it)",
    "zns.drivers.async_client.xǁAsyncRouteClientǁroute__mutmut_12":
        "known = None for False after a timeout: only ever read as a truth value",
    "zns.drivers.async_client.xǁAsyncRouteClientǁ_run__mutmut_1":
        "the first turn's ready set None for empty: no socket is open before the first turn "
        "carries out the session's actions, so `in ready` is never reached",
    "zns.drivers.client_base.xǁSessionSocketsǁ_close__mutmut_4":
        "pop without a default: every socket closed here was opened by _open, which registered it",
    "zns.drivers.client_base.xǁSessionSocketsǁ_close__mutmut_5": "close(None) for close(0): the socket's own LINGER is 0 (open_socket)",
    "zns.drivers.client_base.xǁSessionSocketsǁ_close__mutmut_6":
        "close(1) for close(0): closing may wait 1 ms for an unsent request the session times out anyway",
    "zns.drivers.client_base.xǁSessionSocketsǁ_close_sub__mutmut_4": "as _close__mutmut_4 (ConnectEvents registered the monitor)",
    "zns.drivers.client_base.xǁSessionSocketsǁ_close_sub__mutmut_5": "the monitor's close(None) for 0: an inproc PAIR with nothing unsent",
    "zns.drivers.client_base.xǁSessionSocketsǁ_close_sub__mutmut_6": "as _close_sub__mutmut_5 (close(1))",
    "zns.cli.options.x__option__mutmut_19":
        "a flag's attribute not named: click derives the same name from `--order-message-enable`",
    "zns.cli.options.x__option__mutmut_22":
        "a flag's default not given to click: click's own is False, the one flag's default too",
    "zns.cli.options.x__option__mutmut_27":
        "a required option's click default '' for None: not shown either way, and a value click "
        "did not read from the line or the environment is never used",
    "zns.cli.options.x__option__mutmut_46":
        "a list default given to click as a list, not a tuple: shown the same, never used",
    "zns.cli.options.x__read_toml__mutmut_17":
        "an option's spelling kept with dashes: only options spelled as their field have dashes, "
        "so the field's own key covers it (lookups replace dashes first), and for a suggestion "
        "the underscored twin is always the closer",
    "zns.cli.options.x__read_toml__mutmut_18": "as _read_toml__mutmut_17",
    "zns.cli.options.x__read_toml__mutmut_35":
        "suggestions n=3 for n=1: only the closest one is shown",
    "zns.cli.options.x__read_toml__mutmut_42": "as _read_toml__mutmut_35 (n=2)",
    "zns.cli.options.x_config_options__mutmut_37":
        "click.Path(dir_okay=None) for False: read only as a truth value",
    "zns.cli.tools.x_make_target__mutmut_3":
        "a NameServer list (already checked by its option type) parsed again: the same list; "
        "None still means the default",
    "zns.cli.tools.x__print_json__mutmut_4": "sort_keys=None for False: read only as a truth value",
    "zns.cli.tools.x__print_json__mutmut_7": "sort_keys dropped: False is json.dumps's default",
    "zns.cli.tools.x_table__mutmut_6":
        "a short row padded past the headers: zip() with the column widths drops the extra cells",
    "zns.cli.tools.x_route_table__mutmut_7": "a header in capitals: table() shows every header in capitals",
    "zns.cli.tools.x_route_table__mutmut_9": "as route_table__mutmut_7",
    "zns.cli.tools.x_route_table__mutmut_11": "as route_table__mutmut_7",
    "zns.cli.tools.x_route_table__mutmut_13": "as route_table__mutmut_7",
    "zns.cli.tools.x_route_table__mutmut_15": "as route_table__mutmut_7",
    "zns.cli.tools.x_route_table__mutmut_25": "as route_table__mutmut_7",
    "zns.cli.tools.x_route_table__mutmut_27": "as route_table__mutmut_7",
    "zns.cli.tools.x_route_table__mutmut_29": "as route_table__mutmut_7",
    "zns.cli.tools.x_route_table__mutmut_31": "as route_table__mutmut_7",
    "zns.cli.tools.x_route_table__mutmut_33": "as route_table__mutmut_7",
    **{f"zns.cli.tools.x__status__mutmut_{n}": "as route_table__mutmut_7 (the status table)"
       for n in range(45, 64, 2)},
    **{f"zns.cli.tools.x__clusters__mutmut_{n}": "as route_table__mutmut_7 (the clusters table)"
       for n in range(34, 47, 2)},
    "zns.cli.tools.x__broker__mutmut_8": "as_json None for False: read only as a truth value",
    "zns.cli.tools.x__broker__mutmut_54": "announced = None for False: read only as a truth value",
    "zns.cli.watch.x__watch__mutmut_51": "connected = None for False: read only as a truth value",
    "zns.cli.watch.x__watch__mutmut_20":
        "RouteClient(timeout=None): a client's `timeout` is only route()'s default wait, and "
        "`zns watch` never calls route() (its requests are bounded by request_timeout)",
    "zns.cli.watch.x__watch__mutmut_26": "RouteClient's default timeout (5 s): as _watch__mutmut_20",
    "zns.cli.watch.xǁ_Printerǁ__init____mutmut_8":
        "client '' for None: `watch` sets the client before the route client can call back",
    "zns.cli.watch.x_state_json__mutmut_13": "to_builtins(None) is None: the same null",
    "zns.cli.params.xǁEndpointǁconvert__mutmut_4":
        "fail() without the parameter: click fills in the parameter and context of a "
        "BadParameter raised while it converts (click.core.augment_usage_errors)",
    "zns.cli.params.xǁEndpointǁconvert__mutmut_5": "as Endpoint.convert__mutmut_4 (the context)",
    "zns.cli.params.xǁEndpointǁconvert__mutmut_8": "as Endpoint.convert__mutmut_4 (the context)",
    "zns.cli.params.xǁNameServersǁconvert__mutmut_4": "as Endpoint.convert__mutmut_4",
    "zns.cli.params.xǁNameServersǁconvert__mutmut_5": "as Endpoint.convert__mutmut_4 (the context)",
    "zns.cli.params.xǁNameServersǁconvert__mutmut_8": "as Endpoint.convert__mutmut_4 (the context)",
    "zns.cli.app.xǁ_Groupǁformat_commands__mutmut_3":
        "list_commands(None) for (ctx): it lists COMMANDS whatever the context",
    "zns.cli.app.xǁ_Groupǁmain__mutmut_20":
        "standalone_mode None for False: click reads it only as a truth value",
    "zns.cli.app.xǁ_Groupǁmain__mutmut_45":
        "sys.exit(None) after a command that returned: its code is None (a command returns nothing) "
        "or 0 (click's Exit for --help and --version), both exit status 0",
    "zns.cli.app.xǁ_Groupǁmain__mutmut_46": "as main__mutmut_45 (always 0)",
    "zns.cli.app.xǁ_Groupǁmain__mutmut_47": "as main__mutmut_45 (the code, None or 0, as it is)",
    "zns.core.timers.xǁServerTimersǁnext_deadline__mutmut_7":
        "`<=` for `<`: at deadline + 1 == wake both branches plan the same time",
    "zns.core.queues.xǁLatencyFaultsǁleast_bad__mutmut_29":
        "`half <= 1`: with half == 1, ranked[turn % 1] is ranked[0] either way",
    "zns.core.routes.xǁRouteTableǁ_broker_event__mutmut_2":
        "an event's first revision: the step's commit (RouteRevisions.commit) stamps every broker "
        "event with the step's revision before it leaves the table",
    "zns.core.routes.xǁRouteTableǁ_broker_event__mutmut_17": "as _broker_event__mutmut_2 (revision=1)",
    "zns.core.routes.xǁRouteTableǁ_join_cluster__mutmut_12":
        "ch.structural for a new broker name: the same step records its first address "
        "(_record_address: a `registered` event and _touch_broker(structural=True))",
    "zns.core.routes.xǁRouteTableǁ_join_cluster__mutmut_13": "as _join_cluster__mutmut_12 (False)",
    "zns.core.routes.xǁRouteTableǁ_record_address__mutmut_11":
        "ch.structural for a name new to a cluster: its address is then new to the name (one "
        "changing cluster was removed first), so the step also emits `registered` and touches it structurally",
    "zns.core.routes.xǁRouteTableǁ_record_address__mutmut_12": "as _record_address__mutmut_11 (False)",
    "zns.core.routes.xǁRouteTableǁ_remove_addr__mutmut_59":
        "ch.structural: _touch_broker(structural=True) at the top of _remove_addr set it already",
    "zns.core.routes.xǁRouteTableǁ_remove_addr__mutmut_60": "as _remove_addr__mutmut_59",
    "zns.core.routes.xǁRouteTableǁ_remove_addr__mutmut_69": "as _remove_addr__mutmut_59",
    "zns.core.routes.xǁRouteTableǁ_remove_addr__mutmut_70": "as _remove_addr__mutmut_59",
    "zns.core.routes.xǁRouteTableǁ_remove_addr__mutmut_43":
        "the touch after an address's filter servers go, or not: the first _touch_broker already "
        "reweighed the name without that address (gone from rec.addrs) and listed its topics; a "
        "second touch changes nothing",
    "zns.core.routes.xǁRouteTableǁ_remove_addr__mutmut_52":
        "members.pop(name) without a default: a name is a member of every cluster it holds an "
        "address in (check_invariants: cluster membership), so the key is there",
    "zns.core.routes.xǁRouteTableǁ_drop_liveness__mutmut_10":
        "the last remove: each _remove_addr removed the liveness once its last name went (a live "
        "address lists at least one name), and remove() of an absent key does nothing",
    "zns.core.routes.xǁRouteTableǁ_drop_liveness__mutmut_11": "as _drop_liveness__mutmut_10",
    "zns.core.routes.xǁRouteTableǁ_master_of__mutmut_13":
        "master_live is never None: every address a name holds is live (check_invariants: "
        "'... not live')",
    "zns.core.routes.xǁRouteTableǁ_master_of__mutmut_14": "as _master_of__mutmut_13 (the '' branch is never taken)",
    "zns.core.routes.xǁRouteTableǁ_touch_broker__mutmut_9":
        "_broker_topics.get(name, None): _touch_broker is called only for a held name, and every "
        "held name has its topic index (check_invariants: topic index and brokers)",
    "zns.core.routes.xǁRouteTableǁ_touch_broker__mutmut_11": "as _touch_broker__mutmut_9 (no default)",
    "zns.core.budget.x__refill__mutmut_1":
        "refill also at now == at: it adds 0 tokens and sets `at` to itself (tokens never exceed "
        "the burst, so the min changes nothing either)",
    "zns.core.peer_link.xǁPeerLinkǁon_subscribe_failed__mutmut_18":
        "shift cap 17 for 16: RETRY_MIN_MS << 16 is already far above RETRY_MAX_MS",
    "zns.core.peer_link.xǁPeerLinkǁ__init____mutmut_12":
        "initial _renew_subscription: read only when the reply names the endpoint already "
        "subscribed to, which no reply can before the first subscription (pub starts None)",
    "zns.core.peer_link.xǁPeerLinkǁ__init____mutmut_13": "as __init____mutmut_12",
    "zns.core.peer_link.xǁPeerLinkǁ_on_hb__mutmut_9":
        "_renew_subscription = None for False: the flag is only ever read as a truth value",
    "zns.core.peer_link.xǁPeerLinkǁon_reply__mutmut_45": "as _on_hb__mutmut_9",
    "zns.core.peer_link.xǁPeerLinkǁon_reply__mutmut_16":
        "asking = None for False: only ever read as a truth value (here and by PeerLinks.handle)",
    "zns.core.peer_link.xǁPeerLinkǁnext_deadline__mutmut_10":
        "min(wakes) without default=None: wakes is never empty, as a link is asking or has "
        "_last_heard set (a reply that ends asking sets it, or finds it set since that subscription: "
        "only silence clears it, and silence makes the next reply subscribe afresh)",
    "zns.core.route_cache.xǁRouteCacheǁ_lose_proof__mutmut_1":
        "proven = None for False: the flag is only ever read as a truth value",
    "zns.core.route_cache.xǁRouteCacheǁreset__mutmut_3": "as _lose_proof__mutmut_1",
    "zns.core.route_cache.xǁRouteCacheǁreset__mutmut_5":
        "pull_again = None for False: the flag is only ever read as a truth value",
    "zns.core.route_cache.xǁRouteCacheǁapply_pull__mutmut_41": "as reset__mutmut_5",
    "zns.core.broker_session.xǁBrokerSessionǁ__init____mutmut_32":
        "_started = None for False: the flag is only ever read as a truth value",
    "zns.core.broker_session.xǁBrokerSessionǁ__init____mutmut_34":
        "_connected = None for False: the flag is only ever read as a truth value",
    "zns.core.broker_session.xǁBrokerSessionǁ__init____mutmut_36":
        "initial _reconnect_at: start sets it to now; close marks the connection open, so it is never read",
    "zns.core.broker_session.xǁBrokerSessionǁ__init____mutmut_37": "as __init____mutmut_36",
    "zns.core.broker_session.xǁBrokerSessionǁ__init____mutmut_39":
        "initial _next_register: start sets it to now; close skips every path that reads it",
    "zns.core.broker_session.xǁBrokerSessionǁ__init____mutmut_40": "as __init____mutmut_39",
    "zns.core.broker_session.xǁBrokerSessionǁ__init____mutmut_41":
        "initial _next_heartbeat: read only while registered, and a confirmed registration sets it",
    "zns.core.broker_session.xǁBrokerSessionǁ__init____mutmut_42": "as __init____mutmut_41",
    "zns.core.broker_session.xǁBrokerSessionǁ_fail__mutmut_17":
        "_connected = None for False: the flag is only ever read as a truth value",
    "zns.core.broker_session.xǁBrokerSessionǁ_step__mutmut_19":
        "`=` for `+=`: actions is still empty when a timed-out request is failed",
    "zns.core.broker_session.xǁBrokerSessionǁstart__mutmut_4":
        "`=` for `+=`: nothing can be pending before start (inputs before it add nothing; close marks it started, so start returns early)",
    "zns.core.broker_session.xǁBrokerSessionǁclose__mutmut_11":
        "closing flight deadline None: while closing, next_deadline and _step read _close_deadline instead",
    "zns.core.schema.x_read_envelope__mutmut_10":
        "`> 0` for `>= 0`: an id of 0 is echoed as 0 by either branch",
    "zns.core.schema.x_read_envelope__mutmut_11": "as x_read_envelope__mutmut_10 (`>= 1`)",
    "zns.core.remoting.command.x_decode_frame__mutmut_10": "unpack_from without its offset: the default offset is 0",
    "zns.core.remoting.command.x_decode_rocketmq_header__mutmut_12": "as x_decode_frame__mutmut_10",
    "zns.core.remoting.command.xǁFrameDecoderǁ_consume__mutmut_86": "as x_decode_frame__mutmut_10",
    "zns.core.remoting.command.xǁFrameDecoderǁ_consume__mutmut_95": "as x_decode_frame__mutmut_10",
    "zns.core.remoting.command.xǁFrameDecoderǁ_consume__mutmut_114": "head[4:9] for head[4:8]: the head holds exactly 8 bytes there",
    "zns.core.remoting.command.xǁFrameDecoderǁ_consume__mutmut_26":
        "exactly 8 bytes left taken through the head copy instead: that is a whole frame of length "
        "4 (no header check on either path) or a frame begun and checked alike; the same commands and errors",
    "zns.core.remoting.command.xǁFrameDecoderǁ_consume__mutmut_27": "as _consume__mutmut_26",
    "zns.core.remoting.command.xǁFrameDecoderǁ_consume__mutmut_74":
        "take past the end of the chunk: the slice stops at its end, and i past n ends the loop as i == n does",
    "zns.core.remoting.command.xǁFrameDecoderǁ_consume__mutmut_117":
        "_complete(None) right after the head: a frame completes there only when it is 4 bytes long, "
        "and no 4-byte frame decodes (decode_frame raises before `out` is used)",
    "zns.core.remoting.command.xǁFrameDecoderǁ__init____mutmut_11":
        "_filled's value while no frame is begun: every read of it is guarded by `_frame is not "
        "None`, and _begin sets it to 0 with the frame",
    "zns.core.remoting.command.xǁFrameDecoderǁ__init____mutmut_12": "as __init____mutmut_11 (1)",
    "zns.core.remoting.command.xǁFrameDecoderǁfeed__mutmut_12": "as __init____mutmut_11 (reset to 1 after an error)",
    "zns.core.remoting.command.xǁFrameDecoderǁ_complete__mutmut_6": "as __init____mutmut_11 (1 after a frame completes)",
    "zns.core.remoting.command.x_decode_json_header__mutmut_9":
        "cut at 201 for 200: msgspec's messages for this header quote no input and stay far shorter",
    "zns.core.remoting.command.x_decode_json_header__mutmut_51": "codec name 'ASCII' for 'ascii': Python's codec names ignore case",
    "zns.core.remoting.command.x_decode_rocketmq_header__mutmut_34": "codec name 'UTF-8' for 'utf-8': Python's codec names ignore case",
    "zns.core.remoting.command.x_decode_rocketmq_header__mutmut_99": "as x_decode_rocketmq_header__mutmut_34",
    "zns.core.remoting.command.x_decode_rocketmq_header__mutmut_127": "as x_decode_rocketmq_header__mutmut_34",
    "zns.core.remoting.command.x_decode_json_header__mutmut_71": "serialize_type dropped: SERIALIZE_JSON is the field's default",
    "zns.core.remoting.command.x_decode_rocketmq_header__mutmut_51":
        "`ext_len <= 0` for `< 0`: the branch runs only for ext_len != 0",
    "zns.core.remoting.command.x_decode_rocketmq_header__mutmut_52": "as x_decode_rocketmq_header__mutmut_51 (`< 1`)",
    "zns.core.remoting.command.x_encode_json_header__mutmut_6":
        "`<` for `<=` in the int32 fast path: a value at the bound takes the slow path, which accepts it",
    "zns.core.remoting.command.x_encode_json_header__mutmut_7": "as x_encode_json_header__mutmut_6",
    "zns.core.remoting.command.x_encode_json_header__mutmut_8": "as x_encode_json_header__mutmut_6",
    "zns.core.remoting.command.x_encode_json_header__mutmut_9": "as x_encode_json_header__mutmut_6",
    "zns.core.remoting.command.x_encode_json_header__mutmut_10": "as x_encode_json_header__mutmut_6",
    "zns.core.remoting.command.x_encode_json_header__mutmut_11": "as x_encode_json_header__mutmut_6",
    "zns.core.remoting.command.x_encode_json_header__mutmut_12": "as x_encode_json_header__mutmut_6",
    "zns.core.remoting.command.x_encode_json_header__mutmut_13": "as x_encode_json_header__mutmut_6",
    "zns.core.remoting.command.x_encode_rocketmq_header__mutmut_57":
        "`or 'XXOTHERXX'`: an unknown name falls back to OTHER's code anyway",
    "zns.core.remoting.command.x_encode_rocketmq_header__mutmut_58": "as x_encode_rocketmq_header__mutmut_57 (`or 'other'`)",
    "zns.core.remoting.command.xǁRemotingCommandǁmake_response__mutmut_12": "language='JAVA' dropped: 'JAVA' is the field's default",
    "zns.core.remoting.fastjson.x_java_hashmap_order__mutmut_6":
        "`3 / 4` for `3 // 4`: the capacity is a power of two from 16 up, so both are the same integer",
    "zns.core.remoting.fastjson.x_java_string_hash__mutmut_5": "codec name 'ASCII' for 'ascii': Python's codec names ignore case",
    "zns.core.remoting.fastjson.x_java_string_hash__mutmut_18": "as x_java_string_hash__mutmut_5 ('UTF-16-BE')",
    "zns.core.remoting.fastjson.x_to_utf8__mutmut_6": "as x_java_string_hash__mutmut_5 ('UTF-8')",
    "zns.core.remoting.fastjson.x_count_values__mutmut_3":
        "bytes(data) for data already bytes: an equal copy, counted alike",
    "zns.core.remoting.bodies.x__broker_json__mutmut_24":
        "getattr default None for False: both are falsy, and only a missing attribute reaches it",
    "zns.core.remoting.bodies.x__escaper__mutmut_2":
        "legacy checked with the standard pattern: it matches a superset, and the legacy escaper "
        "still writes what it finds, so the bytes are the same (only the fast path is missed)",
    "zns.core.remoting.bodies.x__escaper__mutmut_6":
        "joining with 'XXXX': the pattern matches single special characters, and X is none",
    "zns.core.remoting.bodies.x__utf16_key__mutmut_6": "codec name 'UTF-16-BE' for 'utf-16-be': Python's codec names ignore case",
    "zns.core.remoting.bodies.x__broker_json__mutmut_2":
        "hashmap_order(sorted(ids)) for 0 or 1 broker ids too: the order of one key (or none) is that key",
    "zns.core.remoting.bodies.x__broker_json__mutmut_4": "as _broker_json__mutmut_2 (one id takes the longer path)",
    "zns.core.remoting.register.x__decode_topic_line__mutmut_8": "codec name 'UTF-8' for 'utf-8': Python's codec names ignore case",
    "zns.core.remoting.register.x__parse_java_int__mutmut_6":
        "lstrip('XX+-XX'): a text with an X left after the sign check still fails int() with the same error",
    "zns.core.remoting.register.x_inflate_bounded__mutmut_8":
        "inflating max + 2 bytes for max + 1: either is over the limit and refused alike",
    "zns.core.remoting.register.xǁ_Readerǁcount__mutmut_4":
        "`left / 4` for `left // 4`: for an integer count, n > x and n > floor(x) agree",
    "zns.core.remoting.register.x_check_body_crc32__mutmut_4": "required=None for False: read only as a truth value",
    "zns.core.remoting.register.x__decode_mappings__mutmut_9":
        "the joined array's fast path made undecodable (b'XX[XX'): it falls back to decoding each "
        "mapping alone, with the same bound, to the same mappings or the same error (a cost)",
    "zns.core.remoting.register.x__decode_mappings__mutmut_11": "as _decode_mappings__mutmut_9 (joined with b'XX,XX': one chunk decodes as before)",
    "zns.core.remoting.register.x__decode_mappings__mutmut_12": "as _decode_mappings__mutmut_9 (b'XX]XX')",
    "zns.core.remoting.register.x__decode_mappings__mutmut_5": "as _decode_mappings__mutmut_9 (quote_integer_keys(65536) is 65536 zero bytes)",
    "zns.core.remoting.register.x__decode_mappings__mutmut_19":
        "the one-chunk decode given 65536 zero bytes: it fails, and loads_lenient decodes the chunk "
        "with the same key bound, to the same mapping or the same error",
    "zns.core.limits.xǁLimitsǁcheck__mutmut_54":
        "`>=` for `>` in the max_topics pre-check: it only decides whether new topics are counted; the count's own `>` refuses",
    "zns.core.service.xǁNameServiceǁ__init____mutmut_26":
        "initial snapshot revision -2 for -1: the table's revision starts at 0, so both differ and the first snapshot builds",
    "zns.core.service.xǁNameServiceǁ__init____mutmut_28":
        "initial snapshot bytes: never served, the initial revision never matches the table's",
    "zns.core.service.xǁNameServiceǁexecute__mutmut_30":
        "publishing an empty event list: an empty EventFrames reads like [] (the test only skips an allocation)",
    "zns.core.service.xǁNameServiceǁconnections_closed__mutmut_18": "as execute__mutmut_30",
    "zns.core.service.xǁNameServiceǁ_route_map__mutmut_7":
        "msgpack(topic, None): it then looks the route up in the table, which returns the same "
        "route table.routes() just gave (_route_map's one caller passes the table's routes)",
    "zns.core.service.xǁNameServiceǁ_route_map__mutmut_9": "as _route_map__mutmut_7 (route left out: None)",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_86":
        "now=None for an op NameService carries out without the time (it reads `now` only for register, heartbeat, cluster info and status)",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_265": "as _dispatch__mutmut_86",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_289": "as _dispatch__mutmut_86",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_305": "as _dispatch__mutmut_86",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_339": "as _dispatch__mutmut_86",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_390": "as _dispatch__mutmut_86",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_428": "as _dispatch__mutmut_86",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_467": "as _dispatch__mutmut_86",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_register_topic__mutmut_27": "as _dispatch__mutmut_86",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_332": "as _dispatch__mutmut_86 (_register_topic hands `now` only to RegisterTopic)",
    "zns.core.remoting.handler.xǁRemotingServiceǁconnection_closed__mutmut_2": "connections_closed(..., None): it does not read `now`",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_topic_list__mutmut_8":
        "the encoded topic lists' cache cleared one entry later: what is kept, never what is replied",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_136":
        "another cache key for the 'all' topic list: keys are only compared with the other lists' "
        "keys, which it still differs from",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_140": "as _dispatch__mutmut_136",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_141": "as _dispatch__mutmut_136",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_166": "as _dispatch__mutmut_136",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_167": "as _dispatch__mutmut_136",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_174": "as _dispatch__mutmut_136",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_178": "as _dispatch__mutmut_136",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_179": "as _dispatch__mutmut_136",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_190": "as _dispatch__mutmut_136",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_194": "as _dispatch__mutmut_136",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_195": "as _dispatch__mutmut_136",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_register__mutmut_119":
        "the topic config's `order` under another key: the route table keeps no per-topic order flag",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_register__mutmut_120": "as _register__mutmut_119",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_register__mutmut_72": "required=None for False: read only as a truth value",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_385":
        "the text of GET_KV_CONFIG's NotFound for a missing namespace or key: caught on the spot, "
        "and the reply's remark is Java's 'No config item, ...' instead",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_386": "as _dispatch__mutmut_385",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_387": "as _dispatch__mutmut_385",
    "zns.core.remoting.handler.xǁRemotingServiceǁ__init____mutmut_27":
        "initial topic order cache revision -2 for -1: the table's revision starts at 0 and only grows, "
        "so neither ever matches",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_topic_order__mutmut_2":
        "the cached list compared with the revision: never equal, so the order is recomputed on "
        "every call (the same order; a cost)",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_remember_namespace__mutmut_4":
        "_emptied[namespace] = '' for None: an ordered set, only its keys are ever read",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_heartbeat__mutmut_47": "as _register__mutmut_72",
    "zns.core.remoting.handler.x_parse_networks__mutmut_4": "strict=None for False: read only as a truth value",
    "zns.core.remoting.handler.x__in_networks__mutmut_3":
        "the host not split at '%': Python parses an IPv6 zone index itself, and an IPv4 host has none",
    "zns.core.remoting.handler.x__in_networks__mutmut_4": "as x__in_networks__mutmut_3",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_heartbeat__mutmut_57":
        "default broker id 1 for a 904 without one: the table keys heartbeats by cluster and address, not id",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_heartbeat__mutmut_59":
        "a 904 heartbeat sent with a zero version: its reply ignores `changed`, and the table keeps no heartbeat's version",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_flagged_topics__mutmut_5":
        "a topic of one name also through hashmap_order: the order of one key is that key",
    "zns.core.remoting.handler.xǁRemotingServiceǁ_dispatch__mutmut_232":
        "broker_table().get(None) for a 901 without brokerName: the table is keyed by str names, "
        "so it is None, as the skipped branch",
    "zns.core.client_session.xǁClientSessionǁ_fail__mutmut_24":
        "_silence_deadline = '' for None: read only once connected, and _connect sets it to None first",
    "zns.core.client_session.xǁClientSessionǁ__init____mutmut_45":
        "initial _all_routes None for False: read only once pub_endpoint is set, and the status "
        "reply that sets pub_endpoint sets _all_routes too",
    "zns.core.client_session.xǁClientSessionǁ__init____mutmut_46": "as __init____mutmut_45 (True)",
    "zns.core.client_session.xǁClientSessionǁon_reply__mutmut_39":
        "`or 'XXXX'`: a status reply is pending only while an endpoint is followed (never None then)",
    "zns.core.remoting.zmtp.x__command__mutmut_16":
        "a property's length packed signed ('>i'): the one property sent (Socket-Type ROUTER) is 6 bytes, "
        "the same in both below 2**31",
    "zns.core.remoting.zmtp.x__message__mutmut_14":
        "a long reply's length packed signed ('>q'): a reply is far below 2**63 bytes, the same in both",
    "zns.core.remoting.zmtp.xǁZmtpRedirectǁ__init____mutmut_3": "_greeted = None for False: only ever read as a truth value",
    "zns.core.remoting.zmtp.xǁZmtpRedirectǁfeed__mutmut_24":
        "`out = READY` for `out += READY`: `out` is still empty there, and bytes take `+=` as the bytearray does",
    "zns.core.remoting.zmtp.xǁZmtpRedirectǁ_reply__mutmut_7":
        "a request without an id read as None, not 0: None is not an int, so the id becomes 0 the line after",
    "zns.core.remoting.zmtp.xǁZmtpRedirectǁ_reply__mutmut_9": "as _reply__mutmut_7 (get without a default: None)",
    "zns.core.remoting.zmtp.xǁZmtpRedirectǁ_reply__mutmut_14": "as _reply__mutmut_7 (not MessagePack: None, then 0)",
    "zns.core.remoting.zmtp.xǁZmtpRedirectǁ_reply__mutmut_19":
        "id 0 counted as out of range: it is then set to 0, the id it had",
    "zns.core.remoting.zmtp.xǁZmtpRedirectǁ_reply__mutmut_20": "as _reply__mutmut_19 (`0 <`)",
    "zns.core.remoting.zmtp.xǁZmtpRedirectǁ_reply__mutmut_21":
        "upper bound 2**64 let through: MessagePack holds no integer above 2**64 - 1, so no decoded id reaches it",
    "zns.core.remoting.zmtp.xǁZmtpRedirectǁ_reply__mutmut_23": "as _reply__mutmut_21 (bound 2**65)",
    "zns.core.remoting.zmtp.xǁZmtpRedirectǁ_reply__mutmut_24": "as _reply__mutmut_21 (bound 2**65)",
    "zns.core.liveness.xǁLivenessScheduleǁobserve__mutmut_1":
        "`>=` for `>`: when now equals latest_now it stores the same value again",
    "zns.core.liveness.xǁLivenessScheduleǁ_schedule__mutmut_4":
        "an entry pushed again at the deadline it already has: the duplicate is popped as stale "
        "like any superseded entry (a heap entry more, not a behaviour)",
    "zns.core.liveness.xǁLivenessScheduleǁ_schedule__mutmut_11":
        "memory bound only: when the lazy heap is rebuilt; a rebuild holds each address at its "
        "deadline, which next_deadline would have moved its entry to anyway",
    "zns.core.liveness.xǁLivenessScheduleǁ_schedule__mutmut_13": "as _schedule__mutmut_11 (5 per address)",
    "zns.core.liveness.xǁLivenessScheduleǁ_schedule__mutmut_14": "as _schedule__mutmut_11 (65 spare)",
    "zns.core.encoded_routes.xǁEncodedRoutesǁencode_json__mutmut_13":
        "a route of one queue and no filter servers put in Java's order too: one queue data and "
        "its one broker name, which any order leaves as they are",
    "zns.core.encoded_routes.xǁEncodedRoutesǁencode_json__mutmut_22":
        "one filter-server address re-sorted for a reparsed reply: a map of one key has one order",
    "zns.core.config.x__address__mutmut_3": "bind=None for False: parse_host_port reads it only as a truth value",
    "zns.core.config.x_load__mutmut_17":
        "msgspec.convert(strict=None) for strict=False: msgspec takes None as not strict (strings parsed alike)",
    "zns.core.config.x__naming_the_field__mutmut_15":
        "strip('XX[]XX') for strip('[]'): strip takes a set of characters, and an index `[1]` holds no X",
    "zns.core.config.x__naming_the_field__mutmut_18":
        "the item taken whatever its index: msgspec names an item of the very list it was given, "
        "so the index is always within it",
    "zns.core.config.x__naming_the_field__mutmut_19": "as _naming_the_field__mutmut_18 (`<=`)",
    "zns.core.remoting.javaorder.x__transfer__mutmut_4":
        "a resized table of 3n buckets for 2n: keys land only in the first 2n (masked by the new "
        "size), the rest stay empty and are skipped",
    "zns.core.remoting.javaorder.x__transfer__mutmut_11":
        "out[i - n] for out[i + n]: in a list of 2n buckets a negative index i - n is bucket i + n",
    "zns.core.remoting.javaorder.x__transfer__mutmut_54": "as _transfer__mutmut_11 (a list of several keys bound for the high half)",
    "zns.core.remoting.javaorder.x__transfer__mutmut_48":
        "a bucket of one key kept as a one-element list, not its bare index: iterated and moved "
        "alike (the bare index only saves a list)",
    "zns.core.remoting.javaorder.x__transfer__mutmut_57": "as _transfer__mutmut_48 (the high half)",
    "zns.core.remoting.javaorder.x_hashmap_capacity__mutmut_4":
        "`capacity * 3 / 4` for `// 4`: for an integer count, n > x and n > floor(x) agree",
    "zns.core.remoting.javaorder.x_hashset_copy_capacity__mutmut_10":
        "int(count / 0.75) + 2 for + 1: int(4c/3) + 1 is never a power of two of 16 or more "
        "(that needs c in [3*2**k/4 - 3/4, 3*2**k/4), which holds no integer), so table_size_for rounds both alike",
    "zns.core.remoting.javaorder.x_spread__mutmut_15": "the cache never read (cached = None): computed again, the same hash (a cost)",
    "zns.core.remoting.javaorder.x_spread__mutmut_16": "as x_spread__mutmut_15 (get(None): never a key)",
    "zns.core.remoting.javaorder.x_spread__mutmut_27": "None cached for a key: read as a miss, computed again, the same hash (a cost)",
    "zns.core.remoting.javaorder.x_spread__mutmut_26":
        "memory bound only: the cache cleared at 2**17 + 1 entries, not 2**17; the hashes are the same",
    "zns.core.revisions.xǁChangesǁ__init____mutmut_3": "structural = None for False: only ever read as a truth value",
    "zns.core.revisions.xǁRouteBuilderǁbuild__mutmut_20":
        "`old is None and ...`: a topic without a held route is always in ch.reshaped (its first "
        "queue data went in through _set_queue), so the old route is never read as None; a held "
        "route's broker list is derived again from the same cached BrokerData, equal (a cost)",
    "zns.core.revisions.xǁRouteBuilderǁbuild__mutmut_27":
        "the derived-list cache keyed 'None' for 'brokers': still apart from the 'filter_servers' "
        "entries of the same queue list, so each kind gets its own list",
    "zns.core.revisions.xǁRouteBuilderǁbuild__mutmut_33": "as build__mutmut_27 ('XXbrokersXX')",
    "zns.core.revisions.xǁRouteBuilderǁbuild__mutmut_34": "as build__mutmut_27 ('BROKERS')",
    "zns.core.revisions.xǁRouteBuilderǁbuild__mutmut_36": "as build__mutmut_27 (None for 'filter_servers')",
    "zns.core.revisions.xǁRouteBuilderǁbuild__mutmut_42": "as build__mutmut_27 ('XXfilter_serversXX')",
    "zns.core.revisions.xǁRouteBuilderǁbuild__mutmut_43": "as build__mutmut_27 ('FILTER_SERVERS')",
    "zns.core.revisions.xǁRouteBuilderǁ_filter_servers_of_route__mutmut_4":
        "`<=` for `<`: both walks list the route's names that have filter servers in name order "
        "(a route's queues are sorted by name); the comparison only picks the cheaper walk",
    "zns.core.revisions.xǁSharedListsǁqueues__mutmut_2":
        "a topic with a route and no edits gets its queue list built again, equal (a cost: "
        "same_route compares by value); a topic without a route always has an edit",
    "zns.core.revisions.xǁSharedListsǁqueues__mutmut_6":
        "`edited or True`: past the first return, `edited` is never empty (a topic without a "
        "route always has an edit), so the edits are read either way",
    "zns.core.revisions.xǁSharedListsǁderived__mutmut_8": "cast(None, ...) for cast(T, ...): typing.cast returns its value unchanged",
    # zns.core.replication (issue 30).
    **{f"zns.core.replication.xǁPrimaryǁ__init____mutmut_{n}":
       "the text of the error for a bound below 1: the one caller (zns.drivers.state_process) "
       "passes no bound, so it is a programming error's text, shown to no user"
       for n in (16, 17, 18, 19, 20)},
    "zns.core.replication.xǁPrimaryǁdumped__mutmut_15":
        "the text of the error for a dump past the last command: a driver's bug, shown to no user",
    "zns.core.replication.xǁPrimaryǁ__init____mutmut_35":
        "worker ids from 2, not 1: they only need to be distinct (the link keys its channels by "
        "them and logs them)",
    "zns.core.replication.xǁPrimaryǁjoin__mutmut_8": "ids 1, 0, -1, ...: as __init____mutmut_35, still distinct",
    "zns.core.replication.xǁPrimaryǁjoin__mutmut_9": "ids 1, 3, 5, ...: as __init____mutmut_35",
    "zns.core.replication.xǁReplicaǁ__init____mutmut_22":
        "tokens from 2, not 1: they only need to be distinct (the drivers key dicts by them and "
        "test them with `is not None`)",
    "zns.core.replication.xǁReplicaǁforward__mutmut_3": "tokens 1, 0, -1, ...: as __init____mutmut_22",
    "zns.core.replication.xǁReplicaǁforward__mutmut_4": "tokens 1, 3, 5, ...: as __init____mutmut_22",
    "zns.core.replication.xǁPrimaryǁjoin__mutmut_12":
        "a joining follower's sent = None: the _transfer join calls next sets it to the current seq",
    "zns.core.replication.xǁPrimaryǁ_drop__mutmut_6":
        "pop without a default: _drop is called only for a worker the primary holds (on_message "
        "looked it up, on_timer iterates the workers)",
    "zns.core.replication.xǁPrimaryǁ_pump__mutmut_19":
        "seq + 2 for seq + 1 when the tail is empty: `sent + 1 < first` holds for both, as the "
        "loop runs only while sent < seq",
    "zns.core.replication.xǁPrimaryǁ_send_parts__mutmut_3":
        "`or` in an assert that always holds there (dumped and Received call it with a transfer "
        "whose dump is set: a Received of a transfer not dumped yet has no size in 0 < size <= 0)",
    "zns.core.replication.xǁPrimaryǁunapplied_since__mutmut_23":
        "the clamp's upper end + 1: never reached, as the append times run without a gap up to "
        "the current seq and the worker's applied is below it",
    "zns.core.replication.xǁReplicaǁ__init____mutmut_5":
        "loaded = None for False: only ever read as a truth value",
    "zns.core.replication.xǁReplicaǁon_message__mutmut_53":
        "awaiting_state = None for False: only ever read as a truth value",
    "zns.core.replication.xǁReplicaǁ__init____mutmut_24":
        "_parts = '' before any part: read only for a part at offset > 0, which always follows "
        "its transfer's first part (offset 0, which sets _parts): the channel is ordered and "
        "loses nothing",
    "zns.core.replication.xǁReplicaǁ_assemble__mutmut_20":
        "_parts = '' once a state is whole: as __init____mutmut_24 (the next part is a new "
        "transfer's first)",
    "zns.core.replication.xǁReplicaǁon_message__mutmut_27":
        "`>=` for `>`: at an unchanged fence nothing new is released (every held event at or "
        "below it was released when the fence got there or as its command's events were produced)",
    "zns.core.replication.xǁReplicaǁon_message__mutmut_60": "as on_message__mutmut_27 (a Fence at the fence held)",
    "zns.core.replication.xǁReplicaǁon_message__mutmut_34":
        "an empty state (total 0: a forked worker's first) loaded without assembling it: the same "
        "LoadState; only its Received(n, 0) is not sent, which the primary ignores (the "
        "transfer ended as its one part was handed out), and no other assembly is under way",
    "zns.core.replication.xǁReplicaǁon_message__mutmut_35": "as on_message__mutmut_34 (total >= 1)",
    "zns.core.replication.xǁReplicaǁon_message__mutmut_38":
        "parts assembled without comparing their seq: every part of one transfer (its number) "
        "carries the same seq",
    "zns.core.replication.xǁReplicaǁproduced__mutmut_2":
        "`or` in the search for the command's place: commands are applied, and their events "
        "produced, in seq order, so the first place still waiting for events is its own",
    # zns.core.forwarding (issue 30).
    **{f"zns.core.forwarding.xǁForwardedWritesǁ__init____mutmut_{n}":
       "the text of the error for a bound below 1: the one caller (zns.drivers.worker) passes "
       "a constant, so it is a programming error's text, shown to no user"
       for n in (6, 7, 8)},
    "zns.core.forwarding.xǁForwardedWritesǁ_last_deadline__mutmut_6":
        "a first write's deadline max(now + timeout_ms, 1) for max(now + timeout_ms, 0): equal, as "
        "`now` (the loop's monotonic ms) is never negative and timeout_ms >= 1",
    "zns.core.forwarding.xǁWriteInFlightǁ__init____mutmut_1":
        "the exception's args None for the token: every boundary catches it by type and reads "
        "`.token`, none its args",
    # zns.core.workers (issue 30).
    **{f"zns.core.workers.xǁWorkerPoolǁ__init____mutmut_{n}":
       "the text of the error for a pool of no worker: `zns serve` makes a pool only for "
       "--workers >= 1 (0 runs one process), so it is a programming error's text, shown to no user"
       for n in (3, 4, 5)},
    "zns.core.workers.xǁWorkerPoolǁ__init____mutmut_7": "stopping = None for False: only ever read as a truth value",
    "zns.core.workers.xǁWorkerPoolǁstart_failed__mutmut_4":
        "deaths = 1 for += 1 after a failed start: deaths is read only by exited, after adding 1, "
        "as `deaths == 1`; it is >= 2 there after a failed start either way",
    "zns.core.workers.xǁWorkerPoolǁstart_failed__mutmut_6": "deaths += 2: as start_failed__mutmut_4 (>= 3 there)",
    # zns.core.state (issue 30).
    "zns.core.state.xǁStateMachineǁ__init____mutmut_10":
        "the change count 1 higher from the start: `changes` is only compared for equality with "
        "an earlier count of the same machine (DumpSchedule's `written` is read from it)",
    "zns.core.state.xǁStateMachineǁload__mutmut_26": "as __init____mutmut_10, for a loaded machine",
    "zns.core.state.xǁStateMachineǁload__mutmut_29": "as __init____mutmut_10, for a loaded machine",
    "zns.core.state.xǁStateMachineǁ_remember_emptied__mutmut_3":
        "the emptied namespaces counted 2 a change for 1: the count still only grows, and is only "
        "compared for equality with an earlier one",
    "zns.core.state.xǁStateMachineǁ_remember_emptied__mutmut_7":
        "'' for None as the value in _emptied: the dict is an ordered set, its values never read",
    "zns.core.state.xǁStateMachineǁ_dump_steps__mutmut_15":
        "the guard loop after the queue steps never has a revision step left: a queue step ends "
        "after at most `work` topics (each has a queue entry), so there are as many queue steps "
        "as revision steps or more",
    "zns.core.state.xǁStateMachineǁ_dump_steps__mutmut_11":
        "next(revision_steps, None) for [] once the revision steps ran out (topics on several "
        "brokers): EncodedList.extend ignores an empty (falsy) list, None alike",
    "zns.core.state.xǁStateMachineǁ_write__mutmut_165":
        "a wipe's audit `after` counted for the name None: after a wipe the name has no writable "
        "topic, 0 as for a name nobody holds",
    "zns.core.state.xǁStateMachineǁ_write__mutmut_75":
        "_displacement called for no events: it finds no displaced address and returns None, as "
        "the guard does",
    "zns.core.state.xǁStateMachineǁ_restore__mutmut_2":
        "the text of the error for a Restore with a window list of another length: "
        "zns.core.warm makes one window per address, so no user sees it",
    **{f"zns.core.state.xǁStateMachineǁ{name}":
       "the text of the Internal raised for a request or command outside the typed unions, "
       "which the decoders never produce (unreachable)"
       for name in ("_write__mutmut_315", "_write__mutmut_316", "apply__mutmut_39",
                    "apply__mutmut_40")},
    **{f"zns.core.state.xǁStateMachineǁ{name}":
       "the text of a programming error (the drivers load and move into a new, empty store), "
       "still matching what its test reads ('empty store')"
       for name in ("load__mutmut_4", "load__mutmut_5", "move_kv__mutmut_2")},
    # zns.core.state_dump (issue 30).
    "zns.core.state_dump.x_array_header__mutmut_15":
        "to_bytes(2) without 'big': its byteorder defaults to 'big' since Python 3.11, the "
        "oldest pyproject.toml allows",
    "zns.core.state_dump.x_array_header__mutmut_24": "as array_header__mutmut_15 (to_bytes(4))",
    # zns.core.warm (issue 30).
    **{f"zns.core.warm.{name}":
       "int.to_bytes / int.from_bytes without 'big': the byteorder defaults to 'big' since "
       "Python 3.11, the oldest pyproject.toml allows"
       for name in ("x_encode_dump__mutmut_9", "x_encode_dump__mutmut_16",
                    "x_decode_dump__mutmut_10", "x_decode_dump__mutmut_21")},
    "zns.core.warm.xǁDumpScheduleǁ__init____mutmut_1":
        "written=1 by default: the one caller (zns.drivers.state_file) passes the machine's count",
    "zns.core.warm.xǁDumpScheduleǁ__init____mutmut_4": "_writing = None for False: only ever read as a truth value",
    "zns.core.warm.xǁDumpScheduleǁfinished__mutmut_1": "as __init____mutmut_4",
    "zns.core.warm.xǁDumpScheduleǁ__init____mutmut_7":
        "_pending = None at first: read only by finished(), which the driver calls only after "
        "started() set it",
}

# A test process that aborts or segfaults did not pass: the mutant is caught (mutmut calls
# it suspicious). Seen: a listening descriptor closed twice, and libzmq's assertion (SIGABRT).
KILLED_CODES = {1, 3, -6, -11}
TIMEOUT_CODES = {36, 24, -24, 152, 255}


@dataclass
class Score:
    module: str
    mutants: int
    killed: int
    survived: int
    timeout: int
    equivalent: int
    seconds: int
    survivors: list[str]
    unchecked: int = 0  # mutants a run stopped before reaching (`--report` of a cut run)

    @property
    def score(self) -> float:
        counted = self.mutants - self.unchecked - self.equivalent
        return 100.0 * (self.killed + self.timeout) / counted if counted else 100.0

    def row(self) -> str:
        # A cut run scores the mutants it reached; mutmut runs the fastest first, so the rest
        # (those whose tests take longest, often the survivors) may score lower.
        partial = f" (partial: {self.unchecked} of {self.mutants} not run)" if self.unchecked else ""
        return (f"| {self.module} | {self.mutants} | {self.killed} | {self.survived} | {self.timeout} "
                f"| {self.equivalent} | {self.score:.1f} %{partial} | {self.seconds} s |")


def prepare(module: str) -> Path:
    """A fresh scratch project for one module: the package, the tests and a mutmut config."""
    work = WORK / module.replace("/", ".")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    shutil.copytree(ROOT / "zns", work / "zns", ignore=ignore)
    shutil.copytree(ROOT / "tests", work / "tests", ignore=ignore)
    shutil.copytree(ROOT / "tools", work / "tools", ignore=ignore)  # tests/interop imports tools/rocketmq
    # Tests of the CLI's options compare them with the tables in the README and the docs.
    shutil.copytree(ROOT / "docs", work / "docs", ignore=ignore)
    shutil.copy2(ROOT / "README.md", work / "README.md")
    config = {
        "source_paths": ["zns"],
        "only_mutate": [source(module)],
        "pytest_add_cli_args_test_selection": MODULES[module],
        "pytest_add_cli_args": ["-p", "no:cacheprovider", "--timeout=300"],
        "also_copy": ["tools", "docs", "README.md"],
        "use_git_change_detection": False,
    }
    lines = ["", "[tool.mutmut]"] + [f"{key} = {json.dumps(value)}" for key, value in config.items()]
    (work / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text() + "\n".join(lines) + "\n")
    return work


def run(module: str) -> Score:
    work = prepare(module)
    mutmut = Path(sys.executable).with_name("mutmut")
    env = dict(os.environ, ZNS_MUTATION="1")
    if source(module).startswith(("zns/drivers/", "zns/cli/")):
        env["ZNS_MUTATION_SOCKETS"] = "1"
    started = time.monotonic()
    log = work / "mutmut.log"
    with log.open("w") as out:
        done = subprocess.run([str(mutmut), "run", "--max-children", "1"], cwd=work, env=env,
                              stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{module}: mutmut failed; see {log}")
    return _timed(collect(module, int(time.monotonic() - started)))


def _timed(score: Score) -> Score:
    """Keep what a finished run measured, for `--report` (file times would count the idle
    time between a run and a later rerun)."""
    (WORK / score.module.replace("/", ".") / "seconds").write_text(f"{score.seconds}\n")
    return score


def rerun_survivors(module: str, seconds_before: int) -> Score:
    """Run again the mutants the last run of `module` left alive or did not reach (it was cut),
    against the current tests.

    For the loop of adding tests for survivors: the scratch copy and mutmut's results are kept,
    the tests are copied in afresh (mutmut collects stats for the new ones only), and the
    result of every killed mutant stands. The time recorded is both runs together.
    """
    work = WORK / module.replace("/", ".")
    before = collect(module, seconds_before)
    codes = json.loads((work / "mutants" / f"{source(module)}.meta").read_text())["exit_code_by_key"]
    names = before.survivors + sorted(name for name, code in codes.items() if code is None)
    if not names:
        return before
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    for target in (work / "tests", work / "mutants" / "tests"):
        shutil.copytree(ROOT / "tests", target, ignore=ignore, dirs_exist_ok=True)
    mutmut = Path(sys.executable).with_name("mutmut")
    env = dict(os.environ, ZNS_MUTATION="1", ZNS_MUTATION_SOCKETS="1")
    started = time.monotonic()
    with (work / "mutmut-rerun.log").open("w") as out:
        done = subprocess.run([str(mutmut), "run", "--max-children", "1", *names], cwd=work, env=env,
                              stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{module}: mutmut failed; see {work / 'mutmut-rerun.log'}")
    return _timed(collect(module, seconds_before + int(time.monotonic() - started)))


def run_seconds(module: str) -> int:
    """How long the last run of `module` has run: what a finished run (and its reruns)
    measured, else (a run cut short) from its scratch copy to its last result."""
    work = WORK / module.replace("/", ".")
    meta = work / "mutants" / f"{source(module)}.meta"
    config = work / "pyproject.toml"
    measured = work / "seconds"
    if not (meta.exists() and config.exists()):
        return 0
    if measured.exists() and measured.stat().st_mtime >= meta.stat().st_mtime:
        return int(measured.read_text())
    return int(meta.stat().st_mtime - config.stat().st_mtime)


def collect(module: str, seconds: int) -> Score:
    """The score of the last run of `module`, from mutmut's results in its scratch copy."""
    work = WORK / module.replace("/", ".")
    meta = work / "mutants" / f"{source(module)}.meta"
    if not meta.exists():
        raise SystemExit(f"{module}: no results; see {work / 'mutmut.log'}")
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    survivors = sorted(name for name, code in codes.items()
                       if code is not None and code not in KILLED_CODES | TIMEOUT_CODES
                       and name not in EQUIVALENT)
    return Score(
        module=module,
        mutants=len(codes),
        unchecked=sum(code is None for code in codes.values()),
        killed=sum(code in KILLED_CODES for code in codes.values()),
        survived=sum(code is not None and code not in KILLED_CODES | TIMEOUT_CODES
                     for code in codes.values()),
        timeout=sum(code in TIMEOUT_CODES for code in codes.values()),
        # Only a surviving mutant can be equivalent; one some test kills is simply killed.
        equivalent=sum(name in EQUIVALENT and code is not None
                       and code not in KILLED_CODES | TIMEOUT_CODES for name, code in codes.items()),
        seconds=seconds,
        survivors=survivors,
    )


HEADER = ("| module | mutants | killed | survived | timeout | equivalent | score | time |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|")


def previous_rows() -> dict[str, str]:
    if not SCORES.exists():
        return {}
    rows = {}
    for line in SCORES.read_text().splitlines():
        match = re.match(r"\| ([a-z_/]+) \| \d", line)
        if match:
            rows[match.group(1)] = line
    return rows


def previous_survivors() -> dict[str, list[str]]:
    if not SCORES.exists():
        return {}
    found: dict[str, list[str]] = {}
    for line in SCORES.read_text().splitlines():
        match = re.match(r"- `zns\.(core\.|drivers\.|cli\.)([a-z_.]+?)\.(x[^`]*)`$", line)
        if match:
            package = "" if match.group(1) == "core." else match.group(1).replace(".", "/")
            module = package + match.group(2).replace(".", "/")
            found.setdefault(module, []).append(line)
    return found


def write_scores(scores: list[Score]) -> None:
    rows = previous_rows()
    survivors = previous_survivors()
    for score in scores:
        rows[score.module] = score.row()
        survivors[score.module] = [f"- `{name}`" for name in score.survivors]
    lines = [
        "# Mutation scores of zns/core, zns/drivers and zns/cli",
        "",
        "Written by `tools/mutate.py` (`make mutate`); see docs/development.md. Score = (killed +",
        "timeout) / (mutants - equivalent). Each module is run with only its own fast tests",
        "(the map is `MODULES` in tools/mutate.py), hypothesis with the `mutation` profile.",
        "A module missing from the table has not been run yet, except zns/core/remoting/constants.py:",
        "it holds numbers and enums and no function, so mutmut makes no mutant of it (it is not in",
        "`MODULES`). `time`: the wall-clock seconds of the module's last run (`nice -n 19`, one",
        "worker; on a shared machine, load included).",
        "",
        "Time is one mutmut process per module under `nice -n 19` on a shared 2-core machine",
        "(the driver rows ran at load average 15-25, several at once); a row marked partial is",
        "a run cut at the deadline, scored over the mutants it reached. Run one after the other,",
        "every module takes most of a day: run several modules in parallel (docs/development.md).",
        "",
        HEADER,
    ]
    ordered = [rows[module] for module in MODULES if module in rows]
    lines += ordered
    lines += ["", "## Equivalent mutants", ""]
    lines += [f"- `{name}`: {reason}" for name, reason in sorted(EQUIVALENT.items())] or ["(none)"]
    lines += ["", "## Surviving mutants (a test is missing, or the mutant is equivalent and not listed yet)",
              ""]
    listed = [line for module in MODULES for line in survivors.get(module, [])]
    lines += listed or ["(none)"]
    SCORES.write_text("\n".join(lines) + "\n")
    quote_in_readme(ordered)


README = ROOT / "README.md"
QUOTE_START, QUOTE_END = "<!-- mutation-summary -->", "<!-- /mutation-summary -->"


def summary(rows: list[str]) -> list[str]:
    """The README's table: per package, the modules scored, their mutants, how many are
    neither killed nor listed equivalent, and the lowest score."""
    groups: dict[str, list[list[str]]] = {}
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        package = cells[0].split("/")[0] if cells[0].startswith(("drivers/", "cli/")) else "core"
        groups.setdefault(package, []).append(cells)
    lines = ["| package | modules scored | mutants | equivalent | not killed, not equivalent | "
             "lowest score |", "|---|---:|---:|---:|---:|---|"]
    for package, cells in groups.items():
        left = sum(int(c[3]) - int(c[5]) for c in cells)
        lowest = min(cells, key=lambda c: float(c[6].split(" %")[0]))
        lines.append(f"| `zns/{package}/` | {len(cells)} | {sum(int(c[1]) for c in cells):,} | "
                     f"{sum(int(c[5]) for c in cells)} | {left} | {lowest[6]} ({lowest[0]}) |")
    return lines


def quote_in_readme(rows: list[str]) -> None:
    """Rewrite the README's summary between its markers, so what it quotes is what was recorded."""
    text = README.read_text()
    start, end = text.find(QUOTE_START), text.find(QUOTE_END)
    if start < 0 or end < start:
        return
    body = "\n".join([QUOTE_START, *summary(rows), QUOTE_END])
    README.write_text(text[:start] + body + text[end + len(QUOTE_END):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("modules", nargs="*", help="modules to run (default: all)")
    parser.add_argument("--list", action="store_true", help="print the module -> tests map")
    parser.add_argument("--rerun-survivors", action="store_true",
                        help="run only the last run's surviving mutants again, with the current tests")
    parser.add_argument("--report", action="store_true",
                        help="re-score the last runs (e.g. after editing EQUIVALENT) without running")
    args = parser.parse_args()
    if args.list:
        for module, tests in MODULES.items():
            print(f"{source(module)}: {' '.join(tests)}")
        return
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown modules {unknown}; choose from {list(MODULES)}")
    scores = []
    print(HEADER)
    for module in args.modules or list(MODULES):
        match = re.search(r"\| (\d+) s \|$", previous_rows().get(module, ""))
        seconds_before = int(match.group(1)) if match else 0
        if args.report:
            score = collect(module, run_seconds(module) or seconds_before)
        elif args.rerun_survivors:
            score = rerun_survivors(module, run_seconds(module) or seconds_before)
        else:
            score = run(module)
        scores.append(score)
        print(score.row(), flush=True)
        write_scores(scores)
    for score in scores:
        for name in score.survivors:
            print(f"survived: {name}   (show it: cd .mutate/{score.module.replace('/', '.')} "
                  f"&& {Path(sys.executable).with_name('mutmut')} show {name})")


if __name__ == "__main__":
    main()
