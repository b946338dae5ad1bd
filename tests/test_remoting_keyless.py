"""Issue 32 item 9 (a): under CURVE a broker name bound to a key changes only through that key.

Remoting requests carry no key; broker and admin codes default to loopback under CURVE, and
from 127.0.0.1 a keyless connection could unregister a key-bound broker, register an impostor
with a higher state version, or wipe its write permission. Now each is refused, from any
network.
"""

from __future__ import annotations

import pytest

from helpers import register_fields
from test_remoting_listener import Client, cluster_info, register_cmd  # noqa: F401
from test_security import CurvePeer, keys  # noqa: F401
from zns.core import schema
from zns.core.errors import NoPermission
from zns.core.keys import KeyPolicy, broker_names_written
from zns.core.remoting import RemotingCommand
from zns.core.remoting.constants import RequestCode as R
from zns.core.remoting.constants import ResponseCode

pytestmark = pytest.mark.timeout(60)


def test_keyless_writes_to_a_bound_name_are_refused_and_others_pass():
    policy = KeyPolicy(brokers={"k1": frozenset({"broker-a"}), "k2": None},
                       admins=frozenset(), clients=frozenset(), clients_any=True)
    assert policy.bound_names == frozenset({"broker-a"})
    queue = {"broker_name": "broker-a", "read_queues": 1, "write_queues": 1, "perm": 6,
             "sys_flag": 0}
    writes = [
        schema.RegisterBroker(**register_fields("broker-a")),
        schema.Heartbeat(cluster="c1", broker_name="broker-a", broker_id=0,
                         broker_addr="10.0.0.1:10911"),
        schema.UnregisterBroker(cluster="c1", broker_name="broker-a", broker_id=0,
                                broker_addr="10.0.0.1:10911"),
        schema.WipeWritePerm(broker_name="broker-a"),
        schema.AddWritePerm(broker_name="broker-a"),
        schema.RegisterTopic(topic="T", queues=[schema.QueueData(**queue)]),
    ]
    for request in writes:
        with pytest.raises(NoPermission, match="^.* for 'broker-a' without a CURVE key: that "
                                               "broker name is bound to a broker key"):
            policy.check_keyless(request)
    policy.check_keyless(schema.RegisterBroker(**register_fields("broker-b")))  # not bound
    policy.check_keyless(schema.KvPut(namespace="ns", key="k", value="v"))
    policy.check_keyless(schema.DeleteTopic(topic="T"))
    assert broker_names_written(schema.GetRoute(topic="T")) == frozenset()


def test_a_keyless_remoting_connection_on_loopback_cannot_touch_a_key_bound_broker(
        make_server, keys):
    bound = keys.make("brokers", "bound-a", broker_names="broker-a")
    srv = make_server(remoting="127.0.0.1:0", **keys.server_options())
    owner = CurvePeer(srv.router, srv.pub, keys.server_public, bound)
    try:
        assert owner.ok("register_broker", **register_fields("broker-a", addr="127.0.0.1:10911"))
        remoting = Client(srv.remoting)
        ext = {"clusterName": "c1", "brokerName": "broker-a", "brokerId": "0",
               "brokerAddr": "127.0.0.1:10911"}
        refused = [
            RemotingCommand(code=R.UNREGISTER_BROKER, version=479, ext_fields=dict(ext)),
            register_cmd("broker-a", addr="127.0.0.1:10999"),  # an impostor
            RemotingCommand(code=R.WIPE_WRITE_PERM_OF_BROKER, version=479,
                            ext_fields={"brokerName": "broker-a"}),
        ]
        for command in refused:
            reply = remoting.call(command)
            assert reply.code == ResponseCode.NO_PERMISSION, (command.code, reply.remark)
            assert "bound to a broker key" in (reply.remark or "")
        assert remoting.call(register_cmd("broker-b", addr="127.0.0.1:10912")).code == 0
        brokers = owner.ok("get_cluster_info").brokers
        assert set(brokers["broker-a"].addrs.values()) == {"127.0.0.1:10911"}
        assert "broker-b" in brokers
        remoting.close()
    finally:
        owner.close()
