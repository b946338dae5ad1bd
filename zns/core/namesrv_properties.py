"""The Java NameServer's properties file (`mqnamesrv -c namesrv.properties`), read by
`zns serve --namesrv-config FILE`.

RocketMQ 5.3.3's NamesrvStartup copies the file's keys onto NamesrvConfig and
NettyServerConfig by name. zns serves some of them, under its own settings;
the rest either do not apply to zns (thread pools, Netty buffers: zns has one
loop and no Netty) or ask for a behaviour zns does not have. Every key of the
file is accounted for: mapped to a zns setting, ignored (one line saying why),
or refused when its value asks for something zns would silently not do.
`KEYS` is the whole table; README.md shows it.

Sans-I/O: text in, settings and lines out (zns.cli.options reads the file).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable

from zns.core.addresses import url_host
from zns.core.errors import InvalidSetting

# Java key -> (the zns setting it becomes, or None; why, when it is not served as such).
KEYS: dict[str, tuple[str | None, str]] = {
    # NamesrvConfig
    "rocketmqHome": (None, "zns needs no RocketMQ installation"),
    "kvConfigPath": ("kv_path", "the KV store goes beside it, as DIR/zns-kv.log: zns keeps its "
                                "own append-only log and does not read the Java JSON file"),
    "configStorePath": (None, "zns does not write its configuration back to a file"),
    "productEnvName": (None, "used only by clusterTest, which zns does not have"),
    "clusterTest": (None, "zns has no cluster-test mode (asking another NameServer for "
                          "routes it lacks); refused when true"),
    "orderMessageEnable": ("order_message_enable", ""),
    "returnOrderTopicConfigToBroker": (None, "zns returns no order topic configuration to "
                                             "brokers"),
    "clientRequestThreadPoolNums": (None, "zns answers from one loop, without thread pools"),
    "defaultThreadPoolNums": (None, "zns answers from one loop, without thread pools"),
    "clientRequestThreadPoolQueueCapacity": (None, "zns bounds work per connection and in "
                                                   "bytes (--remoting-max-buffer-bytes)"),
    "defaultThreadPoolQueueCapacity": (None, "zns bounds work per connection and in bytes "
                                             "(--remoting-max-buffer-bytes)"),
    "scanNotActiveBrokerInterval": (None, "zns expires each broker at its own deadline, not by "
                                          "a periodic scan"),
    "unRegisterBrokerQueueCapacity": (None, "zns unregisters at once, without a queue"),
    "supportActingMaster": (None, "zns has no acting-master election; refused when true"),
    "enableAllTopicList": (None, "zns always answers GET_ALL_TOPIC_LIST_FROM_NAMESERVER"),
    "enableTopicList": (None, "zns always answers the topic list requests"),
    "notifyMinBrokerIdChanged": (None, "zns sends no min-broker-id notifications; refused when "
                                       "true"),
    "enableControllerInNamesrv": (None, "zns has no embedded DLedger controller; refused when "
                                        "true"),
    "needWaitForService": (None, "zns serves at once; /readyz (--ready-grace) says when routes "
                                 "are warm"),
    "waitSecondsForService": (None, "zns serves at once; /readyz (--ready-grace) says when "
                                    "routes are warm"),
    "deleteTopicWithBrokerRegistration": (None, "zns removes a topic when no registration "
                                                "lists it any longer; refused when true"),
    "configBlackList": (None, "zns's UPDATE_NAMESRV_CONFIG changes nothing"),
    # NettyServerConfig
    "bindAddress": ("remoting", "with listenPort: the remoting listener's address"),
    "listenPort": ("remoting", "the remoting listener's port (RocketMQ's protocol)"),
    "serverWorkerThreads": (None, "zns has no Netty worker threads"),
    "serverCallbackExecutorThreads": (None, "zns has no Netty executor"),
    "serverSelectorThreads": (None, "zns has no Netty selector threads"),
    "serverOnewaySemaphoreValue": (None, "zns sends no one-way requests"),
    "serverAsyncSemaphoreValue": (None, "zns sends no asynchronous requests"),
    "serverChannelMaxIdleTimeSeconds": (None, "zns closes no idle remoting connection by "
                                              "time; it bounds connections by count"),
    "serverSocketSndBufSize": (None, "zns leaves socket buffers to the kernel"),
    "serverSocketRcvBufSize": (None, "zns leaves socket buffers to the kernel"),
    "writeBufferHighWaterMark": (None, "zns bounds unsent replies in bytes "
                                       "(--remoting-max-buffer-bytes)"),
    "writeBufferLowWaterMark": (None, "zns bounds unsent replies in bytes "
                                      "(--remoting-max-buffer-bytes)"),
    "serverSocketBacklog": (None, "zns listens with the system's maximum backlog"),
    "serverNettyWorkerGroupEnable": (None, "zns has no Netty worker group"),
    "serverPooledByteBufAllocatorEnable": (None, "zns has no Netty allocator"),
    "enableShutdownGracefully": (None, "zns always stops gracefully on SIGTERM"),
    "shutdownWaitTimeSeconds": (None, "zns stops within its own bounds on SIGTERM"),
    "useEpollNativeSelector": (None, "zns polls with the system's epoll already"),
}

# Keys whose `true` asks for a behaviour zns does not have: refused rather than ignored.
REFUSED_WHEN_TRUE = ("clusterTest", "supportActingMaster", "notifyMinBrokerIdChanged",
                     "enableControllerInNamesrv", "deleteTopicWithBrokerRegistration")
DEFAULT_LISTEN_PORT = 9876  # NettyServerConfig's, as mqnamesrv listens without the key
DEFAULT_BIND_ADDRESS = "0.0.0.0"


def parse_properties(text: str) -> dict[str, str]:
    """Java's `.properties` format as RocketMQ's files use it: `key=value` or `key: value` or
    `key value`, `#`/`!` comments, a trailing backslash continues the line."""
    found: dict[str, str] = {}
    logical = ""
    for raw in text.splitlines():
        line = raw.lstrip()
        if not logical and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            logical += line[:-1]
            continue
        logical += line
        key, value = _split(logical)
        found[key] = value
        logical = ""
    if logical:
        key, value = _split(logical)
        found[key] = value
    return found


def _split(line: str) -> tuple[str, str]:
    for index, char in enumerate(line):
        if char in "=: \t":
            rest = line[index:].lstrip(" \t")
            if rest[:1] in ("=", ":"):
                rest = rest[1:]
            return line[:index], rest.strip()
    return line, ""


def translate(properties: dict[str, str], *, warn: Callable[[str], None]
              ) -> dict[str, object]:
    """zns settings by name from the Java keys; `warn(line)` once per key not served as such.
    InvalidSetting (naming the key) for a value zns cannot take or would not honour."""
    settings: dict[str, object] = {}
    for key, value in properties.items():
        if key not in KEYS:
            warn(f"{key}: ignored: not a key of RocketMQ 5.3.3's NamesrvConfig or "
                 "NettyServerConfig")
            continue
        target, why = KEYS[key]
        if key in REFUSED_WHEN_TRUE and _boolean(key, value):
            raise InvalidSetting(key, f"{key}=true is refused: {why.split(';')[0]}")
        if target is None:
            warn(f"{key}: ignored: {why}")
        elif key == "kvConfigPath":
            settings["kv_path"] = posixpath.join(posixpath.dirname(value) or ".", "zns-kv.log")
            warn(f"{key}: {why}: {settings['kv_path']}")
        elif key == "orderMessageEnable":
            settings["order_message_enable"] = _boolean(key, value)
    # As mqnamesrv does with any file: RocketMQ's protocol on listenPort (9876 without it),
    # every address; ZNS/1 moves beside it (ServerConfig.rocketmq).
    port = properties.get("listenPort", str(DEFAULT_LISTEN_PORT))
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidSetting("listenPort", f"listenPort must be a port number, got {port!r}")
    host = properties.get("bindAddress", DEFAULT_BIND_ADDRESS)
    settings["remoting"] = f"{url_host(host)}:{port}"
    settings["rocketmq"] = True
    return settings


def _boolean(key: str, value: str) -> bool:
    """As Java's Boolean.parseBoolean, but a value that is neither true nor false is refused
    (Java would read it as false without a word)."""
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise InvalidSetting(key, f"{key} must be true or false, got {value!r}")
