"""RocketMQ remoting requests carried out as ZNS/1 ops, answered as the Java NameServer answers.

`RemotingService.handle(command, connection, now)` takes one decoded request
and returns the reply to send (None for a one-way request or a stray
response) and the ZNS/1 event frames to publish. It never touches a socket.

Rules this module keeps:

- **One table.** `PROCESSORS` maps each request code to who may send it and
  its reader or its writer, as RocketMQ's processor map does. Every request
  that reads or changes state becomes the ZNS/1 request it corresponds to
  (`RegisterBroker` with `incremental=True` for REGISTER_BROKER, `Heartbeat`
  for QUERY_DATA_VERSION and BROKER_HEARTBEAT, ...), built with
  `msgspec.convert` so the schema's bounds apply: a reader's goes through
  `NameService.read`, a writer's through `NameService.write` to the state
  machine (zns.core.state) -- the same limits, the same events, the same
  revision rules as over ZeroMQ. A refusal changes nothing.
- **A writer answers from its outcome.** A writer turns the request into its
  one write (or answers it without one), and its replier builds the reply
  from the `Outcome` alone (the DataVersion a QUERY_DATA_VERSION replaced,
  the count a perm write answers, the ORDER_TOPIC_CONFIG table a
  registration is answered with), never by reading the state around the
  write: so a write forwarded elsewhere is answered the same, and its
  request (its body decoded once) is finished from the replier once the
  answer is here (zns.core.forwarding).
- **Who may write** is decided by the connection's source address (the
  listener has no CURVE): broker codes from `brokers` networks, admin codes
  from `admins` networks; reads are open, as in RocketMQ.
- **Replies** carry the codes, ext fields and bodies of the Java 5.3.3
  NameServer; a ZNS/1 refusal is SYSTEM_ERROR (1) with the ZNS/1 message as
  remark; a body or ext field that cannot be read is SYSTEM_ERROR too.
- **`disconnected`.** A REGISTER_BROKER ties its (cluster, address, name)
  to its connection, and nothing else does; when the connection closes,
  exactly what it registered goes, reason `disconnected`, unless registered
  since over another connection or over ZNS/1. A heartbeat (322, 904) never
  moves the tie, and refreshes only a broker registered over remoting
  (zns.core.state.Write).
- **Reads go through `NameService`** too: routes come from its one cache of
  encodings (each form encoded once per change, the JSON forms bounded), and
  every request is counted there by code and response code (metrics).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from zns.core.addresses import LOOPBACK, Network, in_networks, parse_networks
from zns.core.errors import ErrorReply, NoPermission, NotFound
from zns.core.forwarding import WriteInFlight
from zns.core.schema import (
    AddWritePerm,
    AnyRequest,
    DataVersion,
    DeleteTopic,
    Heartbeat,
    HeartbeatReply,
    KvDelete,
    KvGet,
    KvList,
    KvPut,
    RegisterBroker,
    RegisterBrokerReply,
    RegisterTopic,
    Topic,
    UnregisterBroker,
    WipeWritePerm,
    describe_decode_error,
    tag_of,
)
from zns.core.service import Frames, NameService
from zns.core.state import Outcome, WriteRequest

from .bodies import (
    JavaRouteJson,
    decode_data_version,
    decode_topic_route_data,
    encode_broker_member_group,
    encode_cluster_info,
    encode_data_version,
    encode_kv_table,
    encode_topic_list,
    wants_standard_json,
)
from .bodies import DataVersion as WireDataVersion
from .command import RemotingCommand
from .javaorder import BROKER_TABLE, CLUSTER_TABLE, TOPIC_TABLE, chm_order, hashmap_order
from .constants import NAMESERVER_REQUEST_CODES, SERIALIZE_JSON, RequestCode, ResponseCode
from zns.core.errors import RemotingBodyError
from .ext import optional, parse_bool, parse_long, require
from .register import check_body_crc32, decode_register_broker_body, may_serve_topics

log = logging.getLogger("zns")

TOPIC_LISTS_KEPT = 16  # encoded topic lists kept, one per list (and cluster) asked for

R = RequestCode
FLAG_UNIT, FLAG_UNIT_SUB = 1, 2


class Access(enum.Enum):
    """Who may send a request code: the networks of one option (§12)."""

    BROKER = "broker"  # --remoting-brokers
    ADMIN = "admin"  # --remoting-admins
    # --remoting-clients, or --remoting-admins when CURVE is on: ZNS/1 serves KV reads to
    # admin keys only then (§9).
    KV_READ = "kv_read"
    READ = "read"  # --remoting-clients


@dataclass(frozen=True)
class Connection:
    """Who sent a request: the listener's id for the TCP connection and its source address."""

    conn_id: int
    host: str


class RemotingService:
    def __init__(
        self,
        service: NameService,
        *,
        brokers: Iterable[Network] | None = None,
        admins: Iterable[Network] = LOOPBACK,
        readers: Iterable[Network] | None = None,
        kv_reads_admin: bool = False,
        properties: Mapping[str, str] | None = None,
        order_message_enable: bool = False,
        keyless: Callable[[AnyRequest], None] | None = None,
    ) -> None:
        """`brokers` None: broker codes from any address; `readers` None: every other code from
        any address; `kv_reads_admin`: KV reads are admin codes (as ZNS/1's under CURVE);
        `properties`: what GET_NAMESRV_CONFIG shows. `remoting_access` decides them.

        `order_message_enable`: Java's ``orderMessageEnable`` (default false). Only then does a
        route carry ``orderTopicConf`` (the topic's ORDER_TOPIC_CONFIG KV entry): Java and Go
        producers build an ordered topic's queues from it alone, ignoring perm, so a server that
        sends it unasked keeps them writing to a broker whose writes were wiped.

        `keyless`: under CURVE, raises NoPermission for a request that may not come with no
        key (`zns.core.keys.KeyPolicy.check_keyless`); every request built here has none.
        """
        self.service = service
        self.keyless = keyless
        # The route cache's JSON forms are this listener's (one cache, one rule).
        self.route_json = JavaRouteJson(
            lambda topic: list(service.topic_queue_table().get(topic, ())),
            order_conf=order_message_enable)
        service.encoded.json_encoder = self.route_json
        self.brokers = None if brokers is None else tuple(brokers)
        self.admins = tuple(admins)
        self.readers = None if readers is None else tuple(readers)
        self.kv_reads_admin = kv_reads_admin
        # Who may send each kind of code: the networks (None: any address) and their option.
        admin: tuple[tuple[Network, ...] | None, str] = (self.admins, "--remoting-admins")
        read: tuple[tuple[Network, ...] | None, str] = (self.readers, "--remoting-clients")
        self._networks = {Access.BROKER: (self.brokers, "--remoting-brokers"), Access.ADMIN: admin,
                          Access.KV_READ: admin if kv_reads_admin else read, Access.READ: read}
        self.properties = dict(properties or {})
        self._counts = service.remoting_counts
        # (which list, its argument) -> (table revision, TopicList body)
        self._topic_lists: dict[tuple[str, ...], tuple[int, bytes]] = {}
        self._topic_order_cache: tuple[int, list[str]] = (-1, [])

    # --- the boundary ---------------------------------------------------

    def handle(
        self, cmd: RemotingCommand, conn: Connection, now: int
    ) -> tuple[RemotingCommand | None, list[Frames]]:
        """The reply to `cmd` (None: send nothing) and the events to publish: its code's
        processor (PROCESSORS, below the class) if the connection's address may send it."""
        if cmd.is_response:
            return None, []  # a server sends no requests, so no response is awaited
        try:
            processor = PROCESSORS.get(cmd.code, UNSUPPORTED)
            networks, option = self._networks[processor.access]
            if networks is not None and not in_networks(conn.host, networks):
                raise self._refusal(conn, option, cmd.code)
            self.service.catch_up()  # before reading anything (a writer reads too)
            ext = cmd.ext_fields or {}
            if processor.write is None:
                assert processor.read is not None  # a processor has one or the other
                reply = processor.read(self, cmd, ext, conn)
            else:
                request = processor.write(self, cmd, ext, conn)
                if not isinstance(request, RemotingCommand):
                    return self._write(cmd, conn, request, processor.reply, now)
                reply = request  # answered without a write
        except Exception as exc:
            reply = self._refused(cmd, conn, exc)
        return self._answered(cmd, reply, ())

    def _write(self, cmd: RemotingCommand, conn: Connection, request: WriteRequest,
               replier: Replier, now: int) -> tuple[RemotingCommand | None, list[Frames]]:
        """`handle`'s end for a write: `request` applied over `conn` (zns.core.state.Write
        says what the connection does), the reply built by `replier` from its outcome. A
        write forwarded elsewhere (WriteInFlight) is finished the same way once its answer
        is here, from `cmd` and `replier`: its request is not kept, nor decoded again."""

        def finish(written: Callable[[], tuple[Outcome, Sequence[Frames]]]
                   ) -> tuple[RemotingCommand | None, list[Frames]]:
            frames: Sequence[Frames] = ()
            try:
                outcome, frames = written()
                reply = replier(self, cmd, outcome)
            except Exception as exc:
                reply = self._refused(cmd, conn, exc)
            return self._answered(cmd, reply, frames)

        try:
            return finish(lambda: self.service.write(request, now, conn.conn_id,
                                                     lambda: conn.host))
        except WriteInFlight as parked:
            parked.then(finish)
            raise

    def _refused(self, cmd: RemotingCommand, conn: Connection, exc: Exception
                 ) -> RemotingCommand:
        """The reply to a request refused (or that met a bug: logged) with `exc`."""
        if isinstance(exc, NoPermission):  # a network the operator did not list (or a key)
            return _error(cmd, ResponseCode.NO_PERMISSION, str(exc))
        if isinstance(exc, RemotingBodyError):
            return _error(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
        if isinstance(exc, ErrorReply):
            return _error(cmd, ResponseCode.SYSTEM_ERROR, f"{exc.code}: {exc}")
        log.error("bug while handling remoting request %d from %s", cmd.code, conn.host,
                  exc_info=exc)
        return _error(cmd, ResponseCode.SYSTEM_ERROR, "internal error; see the server log")

    def _answered(self, cmd: RemotingCommand, reply: RemotingCommand, frames: Sequence[Frames]
                  ) -> tuple[RemotingCommand | None, list[Frames]]:
        """What `handle` returns for `cmd` answered `reply`: counted by code and response
        code, the reply None for a one-way request."""
        # Unknown codes count as one (-1): a peer cannot grow the counts.
        self._counts[cmd.code if cmd.code in NAMESERVER_REQUEST_CODES else -1, reply.code] += 1
        events = list(frames)  # encoded now (a ZNS/1 request's are encoded as they are sent)
        if cmd.is_oneway:
            return None, events
        return reply, events

    def connection_closed(self, conn_id: int) -> list[Frames]:
        """Remove, with reason `disconnected`, what this connection registered (§12)."""
        return self.connections_closed([conn_id])

    def connections_closed(self, conn_ids: Iterable[int]) -> list[Frames]:
        """`connection_closed` for connections that closed together, as one step."""
        return list(self.service.connections_closed(conn_ids))

    # --- readers: the reply from the state as it is ------------------------------------

    def _route(self, cmd: RemotingCommand, ext: Mapping[str, str],
               conn: Connection) -> RemotingCommand:
        topic = optional(ext, "topic")
        if topic is None:  # as Java: no route for a null topic
            return _no_route(cmd, "null")
        legacy = not wants_standard_json(cmd.version, cmd.ext_fields)
        if parse_bool(ext, "__ZONE_MODE") and (zone := (optional(ext, "__ZONE_NAME") or "").strip()):
            route = self.service.zone_route(topic, zone)
            if route is None:
                return _no_route(cmd, topic)
            # Java filters in an RPC hook that decodes the reply and encodes it again with
            # plain encode(): the legacy form, whatever the requester's version.
            return _ok(cmd, body=self.route_json(route, True, reparsed_sorted=not legacy))
        # No name check on the hot path: a name the table holds was checked when it was
        # registered, and one it does not hold finds no route.
        body = self.service.route_json(topic, legacy)
        if body is None:
            return _no_route(cmd, _convert(topic, Topic, "topic"))
        return _ok(cmd, body=body)

    def _cluster_info_reply(self, cmd: RemotingCommand, ext: Mapping[str, str],
                            conn: Connection) -> RemotingCommand:
        return _ok(cmd, body=self._cluster_info())

    def _all_topics(self, cmd: RemotingCommand, ext: Mapping[str, str],
                    conn: Connection) -> RemotingCommand:
        return _ok(cmd, body=self._topic_list(("all",), lambda: chm_order(self._topic_order())))

    def _topics_by_cluster(self, cmd: RemotingCommand, ext: Mapping[str, str],
                           conn: Connection) -> RemotingCommand:
        cluster = optional(ext, "cluster")  # none: no cluster, no topics (as Java)
        if cluster is None:
            return _ok(cmd, body=encode_topic_list([]))
        named: str = cluster
        return _ok(cmd, body=self._topic_list(("cluster", named),
                                              lambda: self._cluster_topics(named)))

    def _unit_topics(self, cmd: RemotingCommand, ext: Mapping[str, str],
                     conn: Connection) -> RemotingCommand:
        return _ok(cmd, body=self._topic_list(
            ("unit",), lambda: self._flagged_topics(FLAG_UNIT, 0)))

    def _unit_sub_topics(self, cmd: RemotingCommand, ext: Mapping[str, str],
                         conn: Connection) -> RemotingCommand:
        return _ok(cmd, body=self._topic_list(
            ("unit_sub",), lambda: self._flagged_topics(FLAG_UNIT_SUB, 0)))

    def _unit_sub_ununit_topics(self, cmd: RemotingCommand, ext: Mapping[str, str],
                                conn: Connection) -> RemotingCommand:
        return _ok(cmd, body=encode_topic_list(self._flagged_topics(FLAG_UNIT_SUB, FLAG_UNIT)))

    def _system_topics_reply(self, cmd: RemotingCommand, ext: Mapping[str, str],
                             conn: Connection) -> RemotingCommand:
        return _ok(cmd, body=self._system_topics())

    def _broker_member_group(self, cmd: RemotingCommand, ext: Mapping[str, str],
                             conn: Connection) -> RemotingCommand:
        cluster, name = optional(ext, "clusterName"), optional(ext, "brokerName")
        data = self.service.broker_table().get(name) if name is not None else None
        addrs = data.addrs if data is not None else {}
        # Java sets the code and never clears the remark its fresh reply starts with.
        return _reply(cmd, ResponseCode.SUCCESS, "not set any response code", None,
                      encode_broker_member_group(cluster, name, addrs))

    def _kv_get(self, cmd: RemotingCommand, ext: Mapping[str, str],
                conn: Connection) -> RemotingCommand:
        namespace, key = optional(ext, "namespace"), optional(ext, "key")
        try:
            if namespace is None or key is None:  # as Java: nothing is found
                raise NotFound("no such entry")
            reply = self._read(KvGet, namespace=namespace, key=key)
        except NotFound:
            namespace, key = _java_str(namespace), _java_str(key)
            return _error(cmd, ResponseCode.QUERY_NOT_FOUND,
                          f"No config item, Namespace: {namespace} Key: {key}", ext_fields={})
        return _ok(cmd, ext_fields={"value": reply.value})

    def _kv_list(self, cmd: RemotingCommand, ext: Mapping[str, str],
                 conn: Connection) -> RemotingCommand:
        namespace = optional(ext, "namespace")
        if namespace is None:  # as Java: nothing is found
            return _error(cmd, ResponseCode.QUERY_NOT_FOUND, "No config item, Namespace: null")
        entries = self._read(KvList, namespace=namespace).entries
        if not entries and self.service.state.emptied(namespace):
            return _ok(cmd, body=encode_kv_table({}))
        if not entries:
            return _error(cmd, ResponseCode.QUERY_NOT_FOUND,
                          f"No config item, Namespace: {namespace}")
        return _ok(cmd, body=encode_kv_table(_java_kv_order(entries)))

    def _update_config(self, cmd: RemotingCommand, ext: Mapping[str, str],
                       conn: Connection) -> RemotingCommand:
        log.warning("refused UPDATE_NAMESRV_CONFIG from %s: zns changes no configuration "
                    "at run time", conn.host)
        return _error(cmd, ResponseCode.NO_PERMISSION,
                      "zns changes no configuration at run time: UPDATE_NAMESRV_CONFIG "
                      "is refused; use the command line or the config file")

    def _config(self, cmd: RemotingCommand, ext: Mapping[str, str],
                conn: Connection) -> RemotingCommand:
        text = "".join(f"{k}={v}\n" for k, v in self.properties.items())
        return _ok(cmd, body=text.encode())

    def _unsupported(self, cmd: RemotingCommand, ext: Mapping[str, str],
                     conn: Connection) -> RemotingCommand:
        return _error(cmd, ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                      f" request type {cmd.code} not supported")

    # --- writers: the request's one write; repliers: the reply from its outcome alone ---

    def _register(self, cmd: RemotingCommand, ext: Mapping[str, str],
                  conn: Connection) -> WriteRequest | RemotingCommand:
        cluster, addr = require(ext, "clusterName"), require(ext, "brokerAddr")
        fields: dict[str, Any] = dict(
            cluster=cluster, broker_name=require(ext, "brokerName"),
            broker_id=parse_long(ext, "brokerId"), broker_addr=addr,
            ha_addr=require(ext, "haServerAddr"), zone=optional(ext, "__ZONE_NAME") or "",
            heartbeat_timeout_ms=parse_long(ext, "heartbeatTimeoutMillis", required=False,
                                            default=120_000),
            incremental=True,
        )
        try:
            check_body_crc32(cmd.body, ext)
        except RemotingBodyError as exc:  # Java's reply has its (empty) response header
            return _error(cmd, ResponseCode.SYSTEM_ERROR, str(exc), ext_fields={})
        body = decode_register_broker_body(
            cmd.body, compressed=parse_bool(ext, "compressed"), version=cmd.version,
            max_topics=self.service.limits.max_topics_per_request)
        wrapper = body.topic_config_serialize_wrapper
        fields["data_version"] = _zns_version(wrapper.data_version)
        fields["topics"] = {
            name: {"read_queues": t.read_queue_nums, "write_queues": t.write_queue_nums,
                   "perm": t.perm, "sys_flag": t.topic_sys_flag, "order": t.order}
            for name, t in wrapper.topic_config_table.items()
        } if may_serve_topics(ext, fields["broker_id"]) else {}
        fields["filter_servers"] = body.filter_server_list
        return self._request(RegisterBroker, **fields)

    def _registered(self, cmd: RemotingCommand, outcome: Outcome) -> RemotingCommand:
        reply = outcome.reply
        assert isinstance(reply, RegisterBrokerReply)
        reply_ext: dict[str, str] = {}
        if reply.ha_addr:
            reply_ext["haServerAddr"] = reply.ha_addr
        if reply.master_addr:
            reply_ext["masterAddr"] = reply.master_addr
        order = outcome.order_conf  # None: Java holds no such table (an emptied one is {})
        kv_body = b"" if order is None else encode_kv_table(_java_kv_order(order))
        return _ok(cmd, ext_fields=reply_ext, body=kv_body)

    def _heartbeat(self, cmd: RemotingCommand, ext: Mapping[str, str],
                   conn: Connection) -> WriteRequest | RemotingCommand:
        cluster, addr = require(ext, "clusterName"), require(ext, "brokerAddr")
        name = require(ext, "brokerName")
        if cmd.code == R.QUERY_DATA_VERSION:
            broker_id = parse_long(ext, "brokerId")
            version = _zns_version(decode_data_version(cmd.body)) if cmd.body else DataVersion()
        else:  # 904 carries no DataVersion (its `changed` is not answered) and needs no id (§12)
            broker_id = parse_long(ext, "brokerId", required=False, default=0)
            version = DataVersion()
        # Through the connection: it refreshes only a broker registered over remoting,
        # and never moves which connection that was (zns.core.state).
        return self._request(Heartbeat, cluster=cluster, broker_name=name, broker_id=broker_id,
                             broker_addr=addr, data_version=version)

    def _heartbeat_reply(self, cmd: RemotingCommand, outcome: Outcome) -> RemotingCommand:
        if cmd.code != R.QUERY_DATA_VERSION:
            return _ok(cmd)
        body = b""
        if (stored := outcome.data_version) is not None:  # the version before this heartbeat
            body = encode_data_version(WireDataVersion(
                state_version=stored.state, timestamp=stored.timestamp, counter=stored.counter))
        assert isinstance(outcome.reply, HeartbeatReply)
        changed = "true" if outcome.reply.changed else "false"
        return _ok(cmd, ext_fields={"changed": changed}, body=body)

    def _unregister(self, cmd: RemotingCommand, ext: Mapping[str, str],
                    conn: Connection) -> WriteRequest | RemotingCommand:
        return self._request(UnregisterBroker, cluster=require(ext, "clusterName"),
                             broker_name=require(ext, "brokerName"),
                             broker_id=parse_long(ext, "brokerId"),
                             broker_addr=require(ext, "brokerAddr"))

    def _wipe_write_perm(self, cmd: RemotingCommand, ext: Mapping[str, str],
                         conn: Connection) -> WriteRequest | RemotingCommand:
        return self._request(WipeWritePerm, broker_name=require(ext, "brokerName"))

    def _wiped(self, cmd: RemotingCommand, outcome: Outcome) -> RemotingCommand:
        # Java's count: every topic with queue data of the broker, changed or not (ZNS/1's
        # `changed` counts only changed ones).
        return _ok(cmd, ext_fields={"wipeTopicCount": str(outcome.broker_topics)})

    def _add_write_perm(self, cmd: RemotingCommand, ext: Mapping[str, str],
                        conn: Connection) -> WriteRequest | RemotingCommand:
        return self._request(AddWritePerm, broker_name=require(ext, "brokerName"))

    def _added(self, cmd: RemotingCommand, outcome: Outcome) -> RemotingCommand:
        return _ok(cmd, ext_fields={"addTopicCount": str(outcome.broker_topics)})

    def _delete_topic(self, cmd: RemotingCommand, ext: Mapping[str, str],
                      conn: Connection) -> WriteRequest | RemotingCommand:
        return self._request(DeleteTopic, topic=require(ext, "topic"),
                             cluster=optional(ext, "clusterName") or "")

    def _register_topic(self, cmd: RemotingCommand, ext: Mapping[str, str],
                        conn: Connection) -> WriteRequest | RemotingCommand:
        topic = require(ext, "topic")
        if not cmd.body:
            return _ok(cmd)  # Java registers nothing without a body
        data = decode_topic_route_data(cmd.body, max_brokers=self.service.limits.max_brokers)
        queues = [{"broker_name": q.broker_name, "read_queues": q.read_queues,
                   "write_queues": q.write_queues, "perm": q.perm, "sys_flag": q.sys_flag}
                  for q in data.queues]
        return self._request(RegisterTopic, topic=topic, queues=queues)

    def _kv_put(self, cmd: RemotingCommand, ext: Mapping[str, str],
                conn: Connection) -> WriteRequest | RemotingCommand:
        return self._request(KvPut, namespace=require(ext, "namespace"),
                             key=require(ext, "key"), value=require(ext, "value"))

    def _kv_delete(self, cmd: RemotingCommand, ext: Mapping[str, str],
                   conn: Connection) -> WriteRequest | RemotingCommand:
        # Over a connection: a delete that empties the namespace is remembered (Java keeps
        # the emptied table; GET_KVLIST_BY_NAMESPACE answers it {"table":{}}).
        return self._request(KvDelete, namespace=require(ext, "namespace"),
                             key=require(ext, "key"))

    def _done(self, cmd: RemotingCommand, outcome: Outcome) -> RemotingCommand:
        """The reply of a write that answers nothing but success."""
        return _ok(cmd)

    # --- helpers ------------------------------------------------------------

    def _read(self, kind: type[AnyRequest], **fields: Any) -> Any:
        """Build the ZNS/1 read request (the schema's bounds apply) and answer it."""
        request = _convert(fields, kind, tag_of(kind))
        if self.keyless is not None:
            self.keyless(request)
        return self.service.read(request, 0)

    def _request(self, kind: type[WriteRequest], **fields: Any) -> WriteRequest:
        """Build the ZNS/1 write request (the schema's bounds apply), which `handle` makes."""
        request: WriteRequest = _convert(fields, kind, tag_of(kind))
        if self.keyless is not None:
            self.keyless(request)
        return request

    @staticmethod
    def _refusal(conn: Connection, option: str, code: int) -> NoPermission:
        log.warning("remoting request %d from %s refused: not in %s", code, conn.host, option)
        return NoPermission(f"request code {code} is not allowed from {conn.host}: "
                            f"the server's {option} lists the networks that may send it")

    # --- bodies in the Java NameServer's order (zns.core.remoting.javaorder) ----------
    # RouteInfoManager's tables are ConcurrentHashMaps (topics 2048 buckets, broker names
    # 256, clusters 64) holding HashMaps/HashSets; a TopicList is a ConcurrentHashMap key
    # set filled as the tables are walked. mqadmin and the Dashboard print the first of
    # each list, so the order is part of what they show.

    def _topic_order(self) -> list[str]:
        """topicQueueTable's iteration order (kept while the table's revision stands)."""
        revision = self.service.revision
        if self._topic_order_cache[0] != revision:
            self._topic_order_cache = (revision, chm_order(self.service.topic_queue_table(),
                                                           TOPIC_TABLE))
        return self._topic_order_cache[1]

    def _cluster_names(self) -> list[tuple[str, list[str]]]:
        """clusterAddrTable's order, each cluster's names in its HashSet's order."""
        members = self.service.cluster_members()
        return [(c, hashmap_order(members[c])) for c in chm_order(members, CLUSTER_TABLE)]

    def _cluster_info(self) -> bytes:
        table = self.service.broker_table()
        brokers = {n: table[n] for n in chm_order(self.service.broker_names(), BROKER_TABLE)}
        return encode_cluster_info(brokers, dict(self._cluster_names()))

    def _cluster_topics(self, cluster: str) -> list[str]:
        queues = self.service.topic_queue_table()
        names = hashmap_order(self.service.cluster_members().get(cluster, ()))
        order = self._topic_order()
        return chm_order(t for n in names for t in order if n in queues[t])

    def _flagged_topics(self, wanted: int, unwanted: int) -> list[str]:
        """Topics whose first QueueData (in its HashMap's order) has every `wanted` flag
        and no `unwanted` one."""
        queues = self.service.topic_queue_table()
        out = []
        for topic in self._topic_order():
            by_name = queues[topic]
            first = by_name[next(iter(by_name))] if len(by_name) == 1 else \
                by_name[hashmap_order(by_name)[0]]
            if first.sys_flag & wanted == wanted and not first.sys_flag & unwanted:
                out.append(topic)
        return chm_order(out)

    def _topic_list(self, key: tuple[str, ...], topics: Callable[[], list[str]]) -> bytes:
        """A TopicList body, encoded once per table revision: GET_ALL_TOPIC_LIST over 5,000
        topics cost ~5-17 ms of CPU each, and clients pipelining it held the loop."""
        revision = self.service.revision
        cached = self._topic_lists.get(key)
        if cached is None or cached[0] != revision:
            if len(self._topic_lists) >= TOPIC_LISTS_KEPT:
                self._topic_lists.clear()  # cluster names come from the peer: keep few
            cached = self._topic_lists[key] = (revision, encode_topic_list(topics()))
        return cached[1]

    def _system_topics(self) -> bytes:
        names: list[str] = []
        for cluster, brokers in self._cluster_names():
            names.append(cluster)
            names.extend(brokers)
        broker_addr = None
        table = self.service.broker_table()
        for name in chm_order(self.service.broker_names(), BROKER_TABLE):
            addrs = table[name].addrs
            if addrs:  # the first id of its HashMap<Long, String>
                broker_addr = addrs[hashmap_order(sorted(addrs))[0]]
                break
        return encode_topic_list(chm_order(names), broker_addr)


Reader = Callable[[RemotingService, RemotingCommand, Mapping[str, str], Connection],
                  RemotingCommand]
# A writer's request (or, answered without a write, its reply), and its replier: the reply
# from the outcome of that write alone.
Writer = Callable[[RemotingService, RemotingCommand, Mapping[str, str], Connection],
                  WriteRequest | RemotingCommand]
Replier = Callable[[RemotingService, RemotingCommand, Outcome], RemotingCommand]


@dataclass(frozen=True)
class Processor:
    """What answers one request code: who may send it, and the reader (the reply from the
    state as it is) or the writer (its one write) and its replier (the reply from the
    outcome of that write)."""

    access: Access
    read: Reader | None = None
    write: Writer | None = None
    reply: Replier = RemotingService._done


RS = RemotingService
# Request code -> its processor, as RocketMQ's DefaultRequestProcessor maps them. A code not
# listed is a read no NameServer answers (REQUEST_CODE_NOT_SUPPORTED).
PROCESSORS: dict[int, Processor] = {
    R.GET_ROUTEINFO_BY_TOPIC: Processor(Access.READ, read=RS._route),
    R.REGISTER_BROKER: Processor(Access.BROKER, write=RS._register, reply=RS._registered),
    R.QUERY_DATA_VERSION: Processor(Access.BROKER, write=RS._heartbeat,
                                    reply=RS._heartbeat_reply),
    R.BROKER_HEARTBEAT: Processor(Access.BROKER, write=RS._heartbeat, reply=RS._heartbeat_reply),
    R.UNREGISTER_BROKER: Processor(Access.BROKER, write=RS._unregister),
    R.REGISTER_TOPIC_IN_NAMESRV: Processor(Access.BROKER, write=RS._register_topic),
    R.GET_BROKER_CLUSTER_INFO: Processor(Access.READ, read=RS._cluster_info_reply),
    R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: Processor(Access.READ, read=RS._all_topics),
    R.GET_TOPICS_BY_CLUSTER: Processor(Access.READ, read=RS._topics_by_cluster),
    R.GET_UNIT_TOPIC_LIST: Processor(Access.READ, read=RS._unit_topics),
    R.GET_HAS_UNIT_SUB_TOPIC_LIST: Processor(Access.READ, read=RS._unit_sub_topics),
    R.GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST: Processor(Access.READ, read=RS._unit_sub_ununit_topics),
    R.GET_SYSTEM_TOPIC_LIST_FROM_NS: Processor(Access.READ, read=RS._system_topics_reply),
    R.GET_BROKER_MEMBER_GROUP: Processor(Access.READ, read=RS._broker_member_group),
    R.WIPE_WRITE_PERM_OF_BROKER: Processor(Access.ADMIN, write=RS._wipe_write_perm,
                                           reply=RS._wiped),
    R.ADD_WRITE_PERM_OF_BROKER: Processor(Access.ADMIN, write=RS._add_write_perm,
                                          reply=RS._added),
    R.DELETE_TOPIC_IN_NAMESRV: Processor(Access.ADMIN, write=RS._delete_topic),
    R.PUT_KV_CONFIG: Processor(Access.ADMIN, write=RS._kv_put),
    R.DELETE_KV_CONFIG: Processor(Access.ADMIN, write=RS._kv_delete),
    R.GET_KV_CONFIG: Processor(Access.KV_READ, read=RS._kv_get),
    R.GET_KVLIST_BY_NAMESPACE: Processor(Access.KV_READ, read=RS._kv_list),
    R.UPDATE_NAMESRV_CONFIG: Processor(Access.READ, read=RS._update_config),
    R.GET_NAMESRV_CONFIG: Processor(Access.READ, read=RS._config),
}
UNSUPPORTED = Processor(Access.READ, read=RS._unsupported)


def _java_str(value: str | None) -> str:
    """How Java's string concatenation writes a value that may be null."""
    return "null" if value is None else value


def _java_kv_order(entries: dict[str, str]) -> dict[str, str]:
    """A KV namespace as the Java NameServer's HashMap iterates it (entries in insertion order)."""
    return {k: entries[k] for k in hashmap_order(entries)}


def _convert(value: Any, kind: Any, what: str) -> Any:
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        raise RemotingBodyError(f"{what}: {describe_decode_error(exc)}") from None


def _zns_version(v: Any) -> DataVersion:
    return DataVersion(state=v.state_version, timestamp=v.timestamp, counter=v.counter)


def remoting_access(brokers: Sequence[str], admins: Sequence[str], readers: Sequence[str], *,
                    curve: bool, clients_listed: bool) -> tuple[dict[str, Any], str | None]:
    """RemotingService's networks for --remoting-brokers/-admins/-clients (empty: not given),
    and the one line to log when CURVE narrowed a default.

    The listener has no CURVE, so with CURVE on it must never grant a connection more than
    ZNS/1 grants a peer with no listed key (§9, §12): broker codes default to loopback
    instead of any address, KV reads are admin codes, and with `--clients listed` reads
    default to loopback too. Naming the networks in the options is the operator's say-so.
    ValueError names a bad network.
    """
    access: dict[str, Any] = {
        "brokers": parse_networks(brokers) if brokers else None,
        "admins": parse_networks(admins) if admins else LOOPBACK,
        "readers": parse_networks(readers) if readers else None,
        "kv_reads_admin": curve,
    }
    if not curve:
        return access, None
    narrowed = []
    if not brokers:
        access["brokers"] = LOOPBACK
        narrowed.append("broker requests (--remoting-brokers CIDR)")
    if clients_listed and not readers:
        access["readers"] = LOOPBACK
        narrowed.append("reads (--remoting-clients CIDR)")
    if not narrowed:
        return access, None
    return access, ("CURVE is on but the remoting listener has no keys: it accepts "
                    + " and ".join(narrowed) + " from loopback only; name the networks to allow more")


def describe_access(brokers: tuple[Network, ...] | None, admins: tuple[Network, ...],
                    readers: tuple[Network, ...] | None) -> str:
    """Who may do what over the listener, in words (the start-up warning)."""
    def networks(value: tuple[Network, ...] | None) -> str:
        return "any address" if value is None else ", ".join(map(str, value)) or "nowhere"

    return (f"reads from {networks(readers)} (--remoting-clients), broker requests from "
            f"{networks(brokers)} (--remoting-brokers), admin requests from "
            f"{networks(admins)} (--remoting-admins)")


def _ok(cmd: RemotingCommand, *, ext_fields: dict[str, str] | None = None,
        body: bytes = b"") -> RemotingCommand:
    return _reply(cmd, ResponseCode.SUCCESS, None, ext_fields, body)


def _error(cmd: RemotingCommand, code: int, remark: str,
           ext_fields: dict[str, str] | None = None) -> RemotingCommand:
    return _reply(cmd, code, remark, ext_fields, b"")


def _no_route(cmd: RemotingCommand, topic: str) -> RemotingCommand:
    return _error(cmd, ResponseCode.TOPIC_NOT_EXIST,
                  f"No topic route info in name server for the topic: {topic}")


def _reply(cmd: RemotingCommand, code: int, remark: str | None,
           ext_fields: dict[str, str] | None, body: bytes) -> RemotingCommand:
    reply = cmd.make_response(code, remark=remark, ext_fields=ext_fields, body=body)
    reply.serialize_type = SERIALIZE_JSON  # the Java NameServer answers in its own type, JSON
    return reply
