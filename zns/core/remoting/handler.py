"""RocketMQ remoting requests carried out as ZNS/1 ops, answered as the Java NameServer answers.

`RemotingService.handle(command, connection, now)` takes one decoded request
and returns the reply to send (None for a one-way request or a stray
response) and the ZNS/1 event frames to publish. It never touches a socket.

Rules this module keeps:

- **One table.** Every request that reads or changes state becomes the ZNS/1
  request it corresponds to (`RegisterBroker` with `incremental=True` for
  REGISTER_BROKER, `Heartbeat` for QUERY_DATA_VERSION and BROKER_HEARTBEAT,
  ...), built with `msgspec.convert` so the schema's bounds apply, and goes
  through `NameService.execute`: the same limits, the same events, the same
  revision rules as over ZeroMQ. A refusal changes nothing.
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
  (`NameService.execute`).
- **Reads go through `NameService`** too: routes come from its one cache of
  encodings (each form encoded once per change, the JSON forms bounded), and
  every request is counted there by code and response code (metrics).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from zns.core.addresses import LOOPBACK, Network, in_networks, parse_networks
from zns.core.errors import ErrorReply, NoPermission, NotFound
from zns.core.routes import filter_zone
from zns.core.schema import (
    MASTER_ID,
    ORDER_TOPIC_CONFIG,
    AddWritePerm,
    AnyRequest,
    DataVersion,
    DeleteTopic,
    Heartbeat,
    KvDelete,
    KvGet,
    KvList,
    KvPut,
    RegisterBroker,
    RegisterTopic,
    Topic,
    UnregisterBroker,
    WipeWritePerm,
    describe_decode_error,
    tag_of,
)
from zns.core.service import Frames, NameService

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
BROKER_CODES = frozenset({R.REGISTER_BROKER, R.UNREGISTER_BROKER, R.QUERY_DATA_VERSION,
                          R.BROKER_HEARTBEAT, R.REGISTER_TOPIC_IN_NAMESRV})
ADMIN_CODES = frozenset({R.PUT_KV_CONFIG, R.DELETE_KV_CONFIG, R.WIPE_WRITE_PERM_OF_BROKER,
                         R.DELETE_TOPIC_IN_NAMESRV, R.ADD_WRITE_PERM_OF_BROKER})
# Admin codes too when CURVE is on: ZNS/1 serves KV reads to admin keys only then (§9).
KV_READ_CODES = frozenset({R.GET_KV_CONFIG, R.GET_KVLIST_BY_NAMESPACE})
FLAG_UNIT, FLAG_UNIT_SUB = 1, 2


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
        self.order_message_enable = order_message_enable
        # The route cache's JSON forms are this listener's (one cache, one rule).
        self.route_json = JavaRouteJson(
            lambda topic: list(service.topic_queue_table().get(topic, ())),
            order_conf=order_message_enable)
        service.encoded.json_encoder = self.route_json
        self.brokers = None if brokers is None else tuple(brokers)
        self.admins = tuple(admins)
        self.readers = None if readers is None else tuple(readers)
        self.kv_reads_admin = kv_reads_admin
        self.properties = dict(properties or {})
        self._counts = service.remoting_counts
        # (which list, its argument) -> (table revision, TopicList body)
        self._topic_lists: dict[tuple[str, ...], tuple[int, bytes]] = {}
        # Namespaces a remoting DELETE_KV_CONFIG left empty, oldest first: Java keeps an
        # emptied namespace's table, so GET_KVLIST_BY_NAMESPACE answers it with {"table":{}}.
        self._emptied: dict[str, None] = {}
        self._topic_order_cache: tuple[int, list[str]] = (-1, [])

    # --- the boundary ---------------------------------------------------

    def handle(
        self, cmd: RemotingCommand, conn: Connection, now: int
    ) -> tuple[RemotingCommand | None, list[Frames]]:
        """The reply to `cmd` (None: send nothing) and the events to publish."""
        if cmd.is_response:
            return None, []  # a server sends no requests, so no response is awaited
        frames: list[Frames] = []
        try:
            reply = self._dispatch(cmd, conn, now, frames)
        except NoPermission as exc:  # a network the operator did not list (or a key)
            reply = _error(cmd, ResponseCode.NO_PERMISSION, str(exc))
        except RemotingBodyError as exc:
            reply = _error(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
        except ErrorReply as exc:
            reply = _error(cmd, ResponseCode.SYSTEM_ERROR, f"{exc.code}: {exc}")
        except Exception:
            log.exception("bug while handling remoting request %d from %s", cmd.code, conn.host)
            reply = _error(cmd, ResponseCode.SYSTEM_ERROR, "internal error; see the server log")
        # Unknown codes count as one (-1): a peer cannot grow the counts.
        self._counts[cmd.code if cmd.code in NAMESERVER_REQUEST_CODES else -1, reply.code] += 1
        if cmd.is_oneway:
            return None, frames
        return reply, frames

    def connection_closed(self, conn_id: int, now: int) -> list[Frames]:
        """Remove, with reason `disconnected`, what this connection registered (§12)."""
        return self.connections_closed([conn_id], now)

    def connections_closed(self, conn_ids: Iterable[int], now: int) -> list[Frames]:
        """`connection_closed` for connections that closed together, as one step."""
        return list(self.service.connections_closed(conn_ids))

    # --- dispatch -------------------------------------------------------

    def _dispatch(
        self, cmd: RemotingCommand, conn: Connection, now: int, frames: list[Frames]
    ) -> RemotingCommand:
        code, ext = cmd.code, cmd.ext_fields or {}
        if code in BROKER_CODES:
            self._allow(conn, self.brokers, "--remoting-brokers", code)
        elif code in ADMIN_CODES or (self.kv_reads_admin and code in KV_READ_CODES):
            self._allow(conn, self.admins, "--remoting-admins", code)
        elif self.readers is not None:
            self._allow(conn, self.readers, "--remoting-clients", code)
        match code:
            case R.GET_ROUTEINFO_BY_TOPIC:
                return self._route(cmd, ext)
            case R.REGISTER_BROKER:
                return self._register(cmd, ext, conn, now, frames)
            case R.QUERY_DATA_VERSION | R.BROKER_HEARTBEAT:
                return self._heartbeat(cmd, ext, conn, now, frames)
            case R.UNREGISTER_BROKER:
                self._run(UnregisterBroker, now, frames, cluster=require(ext, "clusterName"),
                          broker_name=require(ext, "brokerName"),
                          broker_id=parse_long(ext, "brokerId"),
                          broker_addr=require(ext, "brokerAddr"))
                return _ok(cmd)
            case R.GET_BROKER_CLUSTER_INFO:
                return _ok(cmd, body=self._cluster_info())
            case R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER:
                return _ok(cmd, body=self._topic_list(
                    ("all",), lambda: chm_order(self._topic_order())))
            case R.GET_TOPICS_BY_CLUSTER:
                cluster = optional(ext, "cluster")  # none: no cluster, no topics (as Java)
                if cluster is None:
                    return _ok(cmd, body=encode_topic_list([]))
                named: str = cluster
                return _ok(cmd, body=self._topic_list(
                    ("cluster", named), lambda: self._cluster_topics(named)))
            case R.GET_UNIT_TOPIC_LIST:
                return _ok(cmd, body=self._topic_list(
                    ("unit",), lambda: self._flagged_topics(FLAG_UNIT, 0)))
            case R.GET_HAS_UNIT_SUB_TOPIC_LIST:
                return _ok(cmd, body=self._topic_list(
                    ("unit_sub",), lambda: self._flagged_topics(FLAG_UNIT_SUB, 0)))
            case R.GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST:
                return _ok(cmd, body=encode_topic_list(self._flagged_topics(FLAG_UNIT_SUB, FLAG_UNIT)))
            case R.GET_SYSTEM_TOPIC_LIST_FROM_NS:
                return _ok(cmd, body=self._system_topics())
            case R.GET_BROKER_MEMBER_GROUP:
                cluster, name = optional(ext, "clusterName"), optional(ext, "brokerName")
                data = self.service.broker_table().get(name) if name is not None else None
                addrs = data.addrs if data is not None else {}
                # Java sets the code and never clears the remark its fresh reply starts with.
                return _reply(cmd, ResponseCode.SUCCESS, "not set any response code", None,
                              encode_broker_member_group(cluster, name, addrs))
            case R.WIPE_WRITE_PERM_OF_BROKER:
                name = require(ext, "brokerName")
                self._run(WipeWritePerm, now, frames, broker_name=name)
                return _ok(cmd, ext_fields={"wipeTopicCount": self._perm_count(name)})
            case R.ADD_WRITE_PERM_OF_BROKER:
                name = require(ext, "brokerName")
                self._run(AddWritePerm, now, frames, broker_name=name)
                return _ok(cmd, ext_fields={"addTopicCount": self._perm_count(name)})
            case R.DELETE_TOPIC_IN_NAMESRV:
                self._run(DeleteTopic, now, frames, topic=require(ext, "topic"),
                          cluster=optional(ext, "clusterName") or "")
                return _ok(cmd)
            case R.REGISTER_TOPIC_IN_NAMESRV:
                return self._register_topic(cmd, ext, now, frames)
            case R.PUT_KV_CONFIG:
                self._run(KvPut, now, frames, namespace=require(ext, "namespace"),
                          key=require(ext, "key"), value=require(ext, "value"))
                return _ok(cmd)
            case R.GET_KV_CONFIG:
                namespace, key = optional(ext, "namespace"), optional(ext, "key")
                try:
                    if namespace is None or key is None:  # as Java: nothing is found
                        raise NotFound("no such entry")
                    reply = self._run(KvGet, now, frames, namespace=namespace, key=key)
                except NotFound:
                    namespace, key = _java_str(namespace), _java_str(key)
                    return _error(cmd, ResponseCode.QUERY_NOT_FOUND,
                                  f"No config item, Namespace: {namespace} Key: {key}",
                                  ext_fields={})
                return _ok(cmd, ext_fields={"value": reply.value})
            case R.DELETE_KV_CONFIG:
                namespace = require(ext, "namespace")
                had = self.service.kv.count(namespace) > 0
                self._run(KvDelete, now, frames, namespace=namespace, key=require(ext, "key"))
                if had and not self.service.kv.count(namespace):
                    self._remember_namespace(namespace)
                return _ok(cmd)
            case R.GET_KVLIST_BY_NAMESPACE:
                namespace = optional(ext, "namespace")
                if namespace is None:  # as Java: nothing is found
                    return _error(cmd, ResponseCode.QUERY_NOT_FOUND, "No config item, Namespace: null")
                entries = self._run(KvList, now, frames, namespace=namespace).entries
                if not entries and namespace in self._emptied:
                    return _ok(cmd, body=encode_kv_table({}))
                if not entries:
                    return _error(cmd, ResponseCode.QUERY_NOT_FOUND,
                                  f"No config item, Namespace: {namespace}")
                return _ok(cmd, body=encode_kv_table(_java_kv_order(entries)))
            case R.UPDATE_NAMESRV_CONFIG:
                log.warning("refused UPDATE_NAMESRV_CONFIG from %s: zns changes no configuration "
                            "at run time", conn.host)
                return _error(cmd, ResponseCode.NO_PERMISSION,
                              "zns changes no configuration at run time: UPDATE_NAMESRV_CONFIG "
                              "is refused; use the command line or the config file")
            case R.GET_NAMESRV_CONFIG:
                text = "".join(f"{k}={v}\n" for k, v in self.properties.items())
                return _ok(cmd, body=text.encode())
        return _error(cmd, ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                      f" request type {code} not supported")

    # --- requests ---------------------------------------------------------

    def _route(self, cmd: RemotingCommand, ext: Mapping[str, str]) -> RemotingCommand:
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

    def _register(self, cmd: RemotingCommand, ext: Mapping[str, str], conn: Connection,
                  now: int, frames: list[Frames]) -> RemotingCommand:
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
        reply = self._run(RegisterBroker, now, frames, conn, **fields)
        reply_ext: dict[str, str] = {}
        if reply.ha_addr:
            reply_ext["haServerAddr"] = reply.ha_addr
        if reply.master_addr:
            reply_ext["masterAddr"] = reply.master_addr
        order = self.service.kv.list(ORDER_TOPIC_CONFIG)
        known = order or ORDER_TOPIC_CONFIG in self._emptied  # Java: an emptied table is {}
        kv_body = encode_kv_table(_java_kv_order(order)) if known else b""
        return _ok(cmd, ext_fields=reply_ext, body=kv_body)

    def _heartbeat(self, cmd: RemotingCommand, ext: Mapping[str, str], conn: Connection,
                   now: int, frames: list[Frames]) -> RemotingCommand:
        cluster, addr = require(ext, "clusterName"), require(ext, "brokerAddr")
        name = require(ext, "brokerName")
        query = cmd.code == R.QUERY_DATA_VERSION
        stored = self.service.data_version(cluster, addr)
        if query:
            broker_id = parse_long(ext, "brokerId")
            version = _zns_version(decode_data_version(cmd.body)) if cmd.body else DataVersion()
        else:  # 904 carries no DataVersion and needs no broker id (§12)
            broker_id = parse_long(ext, "brokerId", required=False, default=0)
            version = stored if stored is not None else DataVersion()
        # Through the connection: it refreshes only a broker registered over remoting,
        # and never moves which connection that was (NameService.execute).
        reply = self._run(Heartbeat, now, frames, conn, cluster=cluster, broker_name=name,
                          broker_id=broker_id, broker_addr=addr, data_version=version)
        if not query:
            return _ok(cmd)
        body = b""
        if stored is not None:
            v = stored
            body = encode_data_version(
                WireDataVersion(state_version=v.state, timestamp=v.timestamp, counter=v.counter))
        return _ok(cmd, ext_fields={"changed": "true" if reply.changed else "false"}, body=body)

    def _register_topic(self, cmd: RemotingCommand, ext: Mapping[str, str], now: int,
                        frames: list[Frames]) -> RemotingCommand:
        topic = require(ext, "topic")
        if not cmd.body:
            return _ok(cmd)  # Java registers nothing without a body
        data = decode_topic_route_data(cmd.body, max_brokers=self.service.limits.max_brokers)
        queues = [{"broker_name": q.broker_name, "read_queues": q.read_queues,
                   "write_queues": q.write_queues, "perm": q.perm, "sys_flag": q.sys_flag}
                  for q in data.queues]
        self._run(RegisterTopic, now, frames, topic=topic, queues=queues)
        return _ok(cmd)

    # --- helpers ------------------------------------------------------------

    def _run(self, kind: type[AnyRequest], now: int, frames: list[Frames],
             conn: Connection | None = None, **fields: Any) -> Any:
        """Build the ZNS/1 request (the schema's bounds apply) and execute it; `conn`, for
        broker requests, ties them to the connection (NameService.execute)."""
        request = _convert(fields, kind, tag_of(kind))
        if self.keyless is not None:
            self.keyless(request)
        reply, events = self.service.execute(request, now,
                                             None if conn is None else conn.conn_id)
        frames.extend(events)
        return reply

    def _allow(self, conn: Connection, networks: tuple[Network, ...] | None, option: str,
               code: int) -> None:
        if networks is None or in_networks(conn.host, networks):
            return
        log.warning("remoting request %d from %s refused: not in %s", code, conn.host, option)
        raise NoPermission(f"request code {code} is not allowed from {conn.host}: "
                           f"the server's {option} lists the networks that may send it")

    def _remember_namespace(self, namespace: str) -> None:
        self._emptied.pop(namespace, None)
        self._emptied[namespace] = None
        if len(self._emptied) > self.service.limits.max_kv_namespaces:
            del self._emptied[next(iter(self._emptied))]

    def _perm_count(self, name: str) -> str:
        """The count 205/327 answer: like Java, every topic with queue data of broker `name`,
        whether or not its perm changed (ZNS/1's `changed` counts only changed ones)."""
        return str(self.service.broker_topic_count(name))

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
