"""zns.core: everything that decides, and nothing that waits.

This package is the NameServer, the clients and the broker agent with the I/O
taken out. A driver (`zns.drivers`) owns the sockets, the threads, the event
loop and the clock; it moves bytes into the core and carries out what the
core returns. The rules below keep it that way. A change that breaks one of
them is a design change: discuss it first.

1. **No I/O, no waiting, no clock.** Nothing under `zns.core` imports zmq,
   asyncio, threading, socket or selectors, opens a file or reads a clock
   (`tests/test_architecture.py` fails if importing the core loads zmq,
   asyncio or threading). Time comes in as an argument called `now`.
   Logging is allowed: it is how the core says what it decided.

2. **One time unit: integer milliseconds.** Every `now`, deadline, timeout
   and interval inside the core is an `int` of milliseconds, `now` from a
   monotonic clock. The wall clock appears only as a value the driver hands
   in to be published (`hb` events' `time_ms`).

3. **Inputs in, decisions out.** A core object is fed what happened
   (`respond(body, now)`, `on_reply`, `on_event`, `on_timer`, `woke(now)`)
   and answers with what to do: reply bytes and events to publish, or small
   action objects. The three sessions (client, broker, peer link) speak one
   vocabulary: their inputs return nothing, `actions()` hands out in order what
   to do since it was last called, `next_deadline()` says when `on_timer` is
   due. Each has its own action union with its own names (`ClientAction`:
   `FollowServer`, `SendBytes`, ...; `BrokerAction`: `Connect`, `SendRequest`,
   ...; `PeerAction`: `AskStatus`, `FollowEvents`, `Hint`). It never performs
   the action itself.

4. **It says when it next wants to run.** Every object with timers has a
   `next_deadline()` and an `on_timer(now)` (the same words in the client,
   broker and peer sessions and the server timers). A driver arms exactly
   one timer: the earliest of these. No hidden sleeps, no polling intervals
   in drivers (the server's loop: `zns.drivers.loop`).

5. **One schema.** Every ZNS/1 message is a tagged `msgspec.Struct` in
   `schema.py`; one typed decoder validates a whole message, bounds
   included, before any handler sees it; handlers `match` on the type.

6. **Errors say who is at fault** (`errors.py`). The peer's malformed input
   is an `ErrorReply` (BadRequest, ...), turned into a reply at one boundary
   per listener: `NameService.respond` (ZNS/1 `error`) and
   `RemotingService.handle` (a remoting response code); nothing else
   catches it to reply. The
   caller's own misuse is a `UsageError`; configuration problems are
   `ConfigError`s; a peer's failed connection is `ConnectionLost`. Library I/O
   errors (zmq, sockets, files) become this tree's at one boundary,
   `zns.drivers.io_errors`. A refused request changes nothing (all-or-nothing): check
   everything, then mutate.

7. **Imports point one way.** `zns.drivers` and `zns.cli` import the core;
   the core never imports them, nor the `zns` package above it (what it
   needs of it, the version, is handed in as the epoch is). Within the core,
   `remoting` is built on the rest and nothing outside `remoting` imports
   it: the route cache is handed its JSON encoder. No module imports another
   that imports it back (checked by the same test).

8. **State changes through one door.** The server's state (routes,
   liveness, the remoting ties, the KV entries) changes only by a typed
   command through `StateMachine.apply` (`state.py`, whose top says what a
   command must carry), a warm restart's dump included (`Restore`); no other
   module calls the route table's or the KV store's mutators (`restore`
   included: checked by the same test).

9. **Everything a peer can make the server hold has a bound** (`limits.py`
   and the schema's `Meta` bounds), and the bound is checked before the state
   grows.

Modules, by role (a flat package on purpose: docs/development.md says why):

| role | module | decides |
|---|---|---|
| shared | `schema` | every ZNS/1 message, bound and default; encode/decode |
| shared | `errors` | the error tree and its wire codes |
| shared | `config` | every setting of `zns serve`, `zns relay`, `zns broker`: type, bound, default |
| shared | `addresses` | NameServer address lists, the events endpoint a client connects to, the remoting listener's networks |
| shared | `backoff` | exponential backoff with jitter |
| shared | `text` | text from the network made safe for a log line or an error message |
| server | `state` | the state machine: every change of state as one command through `apply` |
| server | `state_dump` | the state machine's whole state as plain values (dump and load) |
| server | `service` | `NameService`: every request, either listener's, in; replies and events out |
| server | `routes` | the route table: §4 registration, §6 admin ops, §8 expiry, revisions and events |
| server | `liveness` | each broker address's deadline (§8), suspicion (§10), the stall shift |
| server | `weights` | the weight ledger: what routes carry, in queue entries (`--max-queues`) |
| server | `revisions` | route materialization, revisions and route events (§5, §7) |
| server | `encoded_routes` | every route's encodings (ZNS/1, RocketMQ's two JSON forms), cached once |
| server | `limits` | how much state requests may pile up |
| server | `budget` | how many bytes of large replies a peer that never reads may be sent |
| server | `subscriptions` | what the events port's subscriptions cost, and who is over |
| server | `timers` | the server's `hb` schedule, expiry wake-ups, the §8 stall rule |
| server | `kv` | what the core needs of the KV store (the file lives in `zns.drivers.kv_file`) |
| server | `kv_log` | the KV log's record format, when it is compacted, what each write copies, the full-disk rule |
| server | `table_state` | the route table's state as plain values, checked whole before a restore |
| server | `warm` | warm restarts: the state dump's format, restored brokers' confirmation period, when to write |
| server | `keys` | the CURVE key policy (§9): who may do what |
| server | `peer_link` | one peer NameServer (§10): when to ask, what its events hint |
| server | `replication` | numbered commands to read replicas: windows, tail, state transfers, the commit fence |
| server | `workers` | how many worker processes to keep alive, and when to start the next |
| server | `pairing` | `--cpus auto`: when the state process and worker 1 share a CPU, and when they are let go |
| remoting | `remoting` | RocketMQ's remoting protocol: codec and translation to ZNS/1 ops; the listener's connection policy |
| broker | `broker_session` | a broker's side of §4: when to register, heartbeat, reconnect, unregister |
| client | `client_session` | the client following one NameServer (§10): connect, subscribe, time out, move on |
| client | `route_cache` | the client's cache (§7): which events apply, when to pull again |
| client | `queues` | producer/consumer views of a route, queue selection with fault avoidance |
"""
