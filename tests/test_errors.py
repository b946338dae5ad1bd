"""The error tree on the wire and back: what a server refuses with is what a client raises."""

from __future__ import annotations

import msgspec
import pytest

from zns.core.errors import (
    BY_CODE,
    BackgroundFailure,
    BadRequest,
    Busy,
    Conflict,
    ErrorReply,
    Internal,
    InvalidSetting,
    NoPermission,
    NotFound,
    UnknownOp,
    from_reply,
)
from zns.core.schema import Error, decode_reply, encode

CODES = {BadRequest: "bad_request", UnknownOp: "unknown_op", NotFound: "not_found",
         NoPermission: "no_permission", Conflict: "conflict", Busy: "busy", Internal: "internal"}


@pytest.mark.parametrize("cls", list(CODES))
def test_each_refusal_becomes_its_wire_code_and_back_the_same_class(cls: type[ErrorReply]):
    reply = cls("topic 'T' is wrong").reply(7)
    assert (reply.id, reply.code, reply.message) == (7, CODES[cls], "topic 'T' is wrong")
    raised = from_reply(decode_reply(encode(reply)))
    assert type(raised) is cls and raised.code == CODES[cls] and str(raised) == "topic 'T' is wrong"
    assert BY_CODE[CODES[cls]] is cls


def test_a_code_this_client_does_not_know_is_raised_as_error_reply_keeping_the_code():
    raised = from_reply(Error(id=1, code="too_many", message="slow down"))
    assert type(raised) is ErrorReply
    assert (raised.code, str(raised)) == ("too_many", "slow down")
    assert ErrorReply.code == "internal"  # the class itself is untouched


def test_not_found_carries_the_topic_revision_both_ways():
    reply = NotFound("no route for topic 'T'", 42).reply(3)
    assert (reply.code, reply.message, reply.revision) == ("not_found", "no route for topic 'T'", 42)
    raised = from_reply(decode_reply(encode(reply)))
    assert type(raised) is NotFound and raised.revision == 42
    assert str(raised) == "no route for topic 'T'"
    assert from_reply(Error(id=3, code="not_found", message="gone", revision=0)).revision == 0


def test_not_found_without_a_revision_sends_none_and_reads_back_none():
    reply = NotFound("no such broker").reply(3)
    assert reply.revision is msgspec.UNSET and b"revision" not in encode(reply)
    raised = from_reply(decode_reply(encode(reply)))
    assert type(raised) is NotFound and raised.revision is None and str(raised) == "no such broker"


def test_a_background_failure_names_what_died_and_keeps_the_exception_as_its_cause():
    cause = ValueError("bad state")
    failure = BackgroundFailure.of("the route client thread", cause)
    assert type(failure) is BackgroundFailure
    assert str(failure) == "the route client thread failed: ValueError: bad state"
    assert failure.__cause__ is cause


def test_an_invalid_setting_names_its_field_when_it_has_one():
    named = InvalidSetting("max_topics", "must be at least 1")
    assert (str(named), named.name, named.problem) == (
        "max_topics: must be at least 1", "max_topics", "must be at least 1")
    unnamed = InvalidSetting("", "no such file")
    assert (str(unnamed), unnamed.name, unnamed.problem) == ("no such file", "", "no such file")
