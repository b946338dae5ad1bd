"""zns.core.config's helpers and cross-field checks, called directly (no command line).

tests/test_config.py drives every field through click, the environment and a file; these
pin what it does not reach: the exact InvalidSetting each check raises, the topic specs of
`zns broker`, `supervise`'s fixed-port rule, and the helpers the field definitions are built
with at import (called here again, so a change to them shows).
"""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
from msgspec import Meta

from zns.core.config import (
    NEEDS_CURVE, BrokerConfig, ServerConfig, _address, _doc, _listen, _literal_values,
    _naming_the_field, load,
)
from zns.core.errors import InvalidSetting, UsageError
from zns.core.schema import TopicConfig

pytestmark = pytest.mark.timeout(60)

BROKER = {"cluster": "c", "broker_name": "b", "broker_addr": "127.0.0.1:10911"}


def _invalid(config: type, given: dict) -> InvalidSetting:
    with pytest.raises(InvalidSetting) as caught:
        load(config, given)
    return caught.value


def test_doc_keeps_the_help_text_and_the_spellings():
    meta = _doc("Seconds between heartbeats.", metavar="SECONDS", option="hb")
    assert meta.description == "Seconds between heartbeats."
    assert meta.extra == {"metavar": "SECONDS", "option": "hb"}


def test_a_listener_check_takes_its_own_schemes_only():
    assert _listen(("http",))("http://127.0.0.1:9878") == "http://127.0.0.1:9878"
    assert _listen(("tcp",))("127.0.0.1:0") == "127.0.0.1:0"
    with pytest.raises(UsageError, match="expected HOST:PORT or tcp://HOST:PORT, not http://"):
        _listen(("tcp",))("http://127.0.0.1:9878")


def test_a_broker_address_is_one_to_reach_without_a_scheme():
    assert _address("127.0.0.1:10911") == "127.0.0.1:10911"
    with pytest.raises(UsageError, match="not tcp://"):
        _address("tcp://127.0.0.1:10911")
    with pytest.raises(UsageError, match="port '0' is not a number from 1"):
        _address("127.0.0.1:0")
    assert _invalid(BrokerConfig, {**BROKER, "broker_addr": "127.0.0.1:0"}).name == "broker_addr"


def test_literal_values_in_their_order_as_text():
    assert _literal_values(Annotated[Literal["text", "json"], Meta(description="x")]) == ("text", "json")
    assert _literal_values(Literal["any", 2]) == ("any", "2")
    assert _literal_values(int) == ()
    assert _literal_values(Annotated[int, Meta(ge=1)]) == ()


@pytest.mark.parametrize("given, name, problem", [
    ({"clients": 5}, "clients", "Expected `str`, got `int`: 5"),  # a choice that is no string
    ({"peers": ["tcp://127.0.0.1:1", 5]}, "peers", "Expected `str`, got `int`: 5"),  # the item
    ({"router": ["tcp://127.0.0.1:1"]}, "router", "Expected `str`, got `array`: ['tcp://127.0.0.1:1']"),
    ({"clients": "listed"}, "clients", NEEDS_CURVE),
    ({"admins_keys": "/k"}, "admins_keys", NEEDS_CURVE),
])
def test_a_value_that_does_not_fit_names_its_field_and_the_problem(given, name, problem):
    error = _invalid(ServerConfig, given)
    assert (error.name, error.problem) == (name, problem)


def test_a_message_of_no_known_shape_is_kept_whole():
    error = _naming_the_field("Expected `object`, got `array`", {})
    assert (error.name, error.problem, str(error)) == ("", "Expected `object`, got `array`",
                                                       "Expected `object`, got `array`")


@pytest.mark.parametrize("spec, expected", [
    ("A", TopicConfig()),
    ("A:8", TopicConfig(read_queues=8, write_queues=8)),
    ("A:8:4", TopicConfig(read_queues=8, write_queues=4)),
    ("A:8:4:2", TopicConfig(read_queues=8, write_queues=4, perm=2)),
])
def test_a_topic_spec_sets_read_write_and_perm_in_that_order(spec, expected):
    assert load(BrokerConfig, {**BROKER, "topics": [spec]}).topic_configs() == {"A": expected}


@pytest.mark.parametrize("spec", ["A:1:2:3:4", "A:x"])
def test_a_topic_spec_of_more_numbers_or_not_numbers_is_refused(spec):
    error = _invalid(BrokerConfig, {**BROKER, "topics": [spec]})
    assert (error.name, error.problem) == ("topics", f"{spec!r}: expected NAME[:READ[:WRITE[:PERM]]]")


@pytest.mark.parametrize("given, named", [
    ({"router": "tcp://127.0.0.1:*"}, "router"),
    ({"pub": "tcp://127.0.0.1:0"}, "pub"),
    ({"remoting": "tcp://127.0.0.1:0"}, "remoting"),
    ({"metrics": "http://127.0.0.1:0"}, "metrics"),
    ({"router": "tcp://127.0.0.1:0", "pub": "tcp://127.0.0.1:*", "remoting": "127.0.0.1:0",
      "metrics": "127.0.0.1:0"}, "router, pub, remoting, metrics"),
])
def test_a_supervised_server_needs_fixed_ports(given, named):
    # One process (--workers 0): the supervisor starts a new one, which must bind the same
    # ports. With workers, the state process holds the ports and replaces its workers itself.
    error = _invalid(ServerConfig, {"supervise": True, "workers": 0, **given})
    assert (error.name, error.problem) == (
        "supervise", f"a new server must bind the same ports: the port of {named} must not be * or 0")
    load(ServerConfig, given)  # unsupervised, any port will do
    load(ServerConfig, {"supervise": True, **given})  # the default: workers, any port will do


def test_a_supervised_server_on_fixed_ports_is_fine():
    config = load(ServerConfig, {"supervise": True, "router": "tcp://127.0.0.1:9876",
                                 "pub": "tcp://127.0.0.1:9877", "remoting": "tcp://127.0.0.1:9878",
                                 "metrics": "http://127.0.0.1:9879"})
    assert config.supervise and config.remoting == "tcp://127.0.0.1:9878"
